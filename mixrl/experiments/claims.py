"""Paper claims as data, judged over seeds.

A claim says that one method beats another on a held-out metric, e.g. (YAML, in a suite)::

    - paper: "Learning to Reason under Off-Policy Guidance"
      claim: LUFFY learns problems on-policy RL cannot solve
      quote: '"... failing to acquire reasoning abilities beyond its initial capabilities" (abstract)'
      method: luffy/arith-tiny        # a compare label: the recipe name
      baseline: grpo/arith-tiny
      metric: accuracy/level5
      stat: final                     # final | best | drop | rollouts_to | tokens_to
      better: higher                  # higher | lower
      test: welch                     # welch | bootstrap (mixrl.experiments.stats)
      target: 0.2                     # rollouts_to / tokens_to only

Per run, ``stat`` gives one number: ``final`` (after training), ``best`` (max over the
held-out evaluations), ``drop`` (best - final, a stability measure: lower is better),
``rollouts_to`` / ``tokens_to`` (rollouts / generated tokens when the metric first reached
``target``; a run that never reaches it counts at its whole budget, a lower bound).
``quote`` is the paper's own words that make the claim, in double quotes, then where they are in
the paper in parentheses (``(abstract)``, ``(Section 4.2)``, ``(Table 3)``): a suite claims only
what its paper says.
:func:`judge_claims` compares the two methods' per-seed values with :func:`mixrl.experiments.stats.judge`,
adds the rliable interval estimates of :mod:`mixrl.experiments.intervals` (each side's IQM and
P(method better) with stratified bootstrap intervals) and, when several claims are judged at
once, Holm's adjustment of their p-values (:func:`apply_holm`). :func:`rejudge` does the same
from the per-seed values a ``compare.json`` already holds, without the runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mixrl.errors import ConfigError
from mixrl.experiments.stats import AGREES, DISAGREES, TESTS, UNRESOLVED, holm, judge

ALPHA = 0.05

STATS = ("final", "best", "drop", "rollouts_to", "tokens_to")
_FIELDS = {"paper", "claim", "quote", "method", "baseline", "metric", "stat", "better", "test", "target"}
#: a claim's quote: the paper's words in double quotes, then where they are: (abstract), (Section 4), (Table 2), ...
QUOTE = re.compile(r'^".+" \((abstract|Section|Table|Figure|Appendix)\b[^)]*\)$', re.S)


@dataclass
class Claim:
    paper: str
    claim: str
    method: str
    baseline: str
    metric: str = "accuracy"
    stat: str = "final"
    better: str = "higher"
    test: str = "welch"
    target: float | None = None
    quote: str | None = None

    def describe(self) -> str:
        what = {"final": "final", "best": "best", "drop": "drop from best (best - final)",
                "rollouts_to": f"rollouts to {self.metric} ≥ {self.target:g}" if self.target is not None else "",
                "tokens_to": f"generated tokens to {self.metric} ≥ {self.target:g}" if self.target is not None else ""}[self.stat]
        return what if self.stat in ("rollouts_to", "tokens_to") else f"{what} {self.metric}"


def parse_claim(item: Mapping, where: str = "claim", aliases: Mapping[str, str] | None = None) -> Claim:
    """One claim from a mapping; ``aliases`` maps method labels to compare labels (recipe names).
    A wrong claim raises a one-line :class:`ConfigError`."""
    if not isinstance(item, Mapping):
        raise ConfigError(f"{where}: a claim is a mapping with paper, claim, method, baseline, metric; got {item!r}")
    unknown = set(item) - _FIELDS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; a claim takes {', '.join(sorted(_FIELDS))}")
    missing = [k for k in ("paper", "claim", "method", "baseline") if not item.get(k)]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    c = Claim(**{k: item[k] for k in item})
    if c.stat not in STATS:
        raise ConfigError(f"{where}: stat '{c.stat}' is not one of {', '.join(STATS)}")
    if c.quote is not None and not QUOTE.match(str(c.quote).strip()):
        raise ConfigError(f"{where}: quote must be the paper's words in double quotes, then where they are "
                          "('\"...\" (abstract)', '(Section 4.2)', '(Table 3)'); got {c.quote!r}")
    if c.better not in ("higher", "lower"):
        raise ConfigError(f"{where}: better must be 'higher' or 'lower', got '{c.better}'")
    if c.test not in TESTS:
        raise ConfigError(f"{where}: test must be one of {', '.join(TESTS)}, got '{c.test}'")
    if c.stat in ("rollouts_to", "tokens_to") and c.target is None:
        raise ConfigError(f"{where}: stat '{c.stat}' needs a target (e.g. target: 0.2)")
    if aliases is not None:
        for key in ("method", "baseline"):
            label = getattr(c, key)
            if label not in aliases:
                raise ConfigError(f"{where}: {key} '{label}' is not a method of the suite ({', '.join(aliases)})")
            setattr(c, key, aliases[label])
    c.target = None if c.target is None else float(c.target)
    return c


def run_value(run, c: Claim) -> float | None:
    """The number ``c.stat`` gives for one run (None when the run lacks it)."""
    if c.stat == "final":
        return run.final(c.metric)
    if c.stat == "best":
        return run.best(c.metric)
    if c.stat == "drop":
        best, final = run.best(c.metric), run.final(c.metric)
        return None if best is None or final is None else best - final
    if not run.evals:
        return None
    if c.stat == "rollouts_to":
        v = run.rollouts_to(c.metric, c.target)
        return float(run.rollouts) if v is None else v
    v = run.tokens_to(c.metric, c.target)
    if v is None:
        return None if run.generated_tokens is None else float(run.generated_tokens)
    return v


def judge_claims(claims: Sequence[Claim], groups: Mapping[str, Sequence[Any]]) -> list[dict]:
    """Each claim with its per-seed values and the verdict (:func:`mixrl.experiments.stats.judge`),
    its interval estimates (:func:`mixrl.experiments.intervals.claim_estimates`) and, over all
    the claims, Holm's adjusted p-values and verdicts (:func:`apply_holm`).
    A method without runs gives verdict ``"not measured"``."""
    out = []
    for c in claims:
        a = [v for v in (run_value(r, c) for r in groups.get(c.method, ())) if v is not None]
        b = [v for v in (run_value(r, c) for r in groups.get(c.baseline, ())) if v is not None]
        row: dict[str, Any] = {**c.__dict__, "what": c.describe(), "method_values": a, "baseline_values": b}
        if c.stat in ("rollouts_to", "tokens_to"):  # kept so that rejudge() can censor without the runs
            row["method_missed"] = sum(1 for r in groups.get(c.method, ()) if run_value(r, c) is not None and _missed_target(r, c))
            row["baseline_missed"] = sum(1 for r in groups.get(c.baseline, ()) if run_value(r, c) is not None and _missed_target(r, c))
        out.append(_judge_row(row))
    return apply_holm(out)


def _judge_row(row: dict) -> dict:
    """Judge one row holding a claim's fields and its ``method_values`` / ``baseline_values``
    (and, for rollouts_to / tokens_to, ``method_missed`` / ``baseline_missed``)."""
    a, b = row["method_values"], row["baseline_values"]
    row["test_kind"] = row["test"]  # welch | bootstrap; "test" becomes the test in words
    if not a or not b:
        row.update(verdict="not measured", test=f"{row['test']} (no runs of {row['method'] if not a else row['baseline']})")
        return row
    row.update(judge(a, b, better=row["better"], test=row["test"]).as_dict())
    row["method_mean"] = sum(a) / len(a)
    row["baseline_mean"] = sum(b) / len(b)
    from mixrl.experiments.intervals import claim_estimates  # deferred: numpy and scipy; `mixrl --help` imports this module

    row.update(claim_estimates(a, b, better=row["better"]))
    if row["stat"] in ("rollouts_to", "tokens_to"):
        _censor(row)
    return row


def _censor(row: dict) -> None:
    """A run that never reached the target counts with its whole budget, a lower bound of the
    true value. So a verdict that one side needs *fewer* rollouts (tokens) than the other
    stands only when every run of that side reached the target; else it is not resolved.
    ``missed`` None (unknown: an old compare.json) also leaves the verdict unresolved."""
    if row["verdict"] not in (AGREES, DISAGREES):
        return
    method_smaller = (row["verdict"] == AGREES) == (row["better"] == "lower")
    side = "method" if method_smaller else "baseline"
    missed, n = row.get(f"{side}_missed"), len(row[f"{side}_values"])
    if missed is None:
        row["verdict"] = UNRESOLVED
        row["test"] = f"{row['test']}; censored: unknown whether {row[side]} reached the target in every run"
    elif missed:
        row["verdict"] = UNRESOLVED
        row["test"] = f"{row['test']}; censored: {row[side]} did not reach the target in {missed}/{n} runs"


def apply_holm(rows: list[dict], alpha: float = ALPHA) -> list[dict]:
    """Holm-Bonferroni over the claims judged together (:func:`mixrl.experiments.stats.holm`):
    each row gets ``p_holm`` (its Welch p-value adjusted over the rows that have one) and
    ``verdict_holm``, the verdict that stands at family-wise error rate ``alpha``: the row's own
    verdict when ``p_holm < alpha`` (and, for a bootstrap claim, its interval also excludes 0), else
    not resolved. With one claim ``p_holm`` is its p-value."""
    adjusted = holm([r.get("p") if r["verdict"] != "not measured" else None for r in rows])
    for r, q in zip(rows, adjusted):
        r["p_holm"] = q
        if r["verdict"] == "not measured":
            r["verdict_holm"] = r["verdict"]
        else:
            r["verdict_holm"] = r["verdict"] if (q is not None and q < alpha) else UNRESOLVED
    return rows


_CENSORED = re.compile(r"; censored: (?P<side>.+?) did not reach the target in (?P<missed>\d+)/(?P<n>\d+) runs")


def rejudge(rows: Sequence[Mapping]) -> list[dict]:
    """The claims of a ``compare.json`` judged again from the per-seed values they hold (no runs
    needed): the same claim, test and values, today's statistics. Censoring of rollouts_to /
    tokens_to claims uses the rows' ``method_missed`` / ``baseline_missed``; a compare.json
    written before they existed gives them through its censoring note (the side it names
    missed the target in k runs, and a side judged faster without a note missed none)."""
    out = []
    for old in rows:
        row = {k: old[k] for k in ("paper", "claim", "method", "baseline", "metric", "stat", "better", "target", "what",
                                   "method_values", "baseline_values")}
        row["test"] = old.get("test_kind") or ("bootstrap" if str(old.get("test", "")).startswith("bootstrap") else "welch")
        if row["stat"] in ("rollouts_to", "tokens_to"):
            for side in ("method", "baseline"):
                row[f"{side}_missed"] = old.get(f"{side}_missed")
            _missed_from_note(row, old)
        out.append(_judge_row(row))
    return apply_holm(out)


def _missed_from_note(row: dict, old: Mapping) -> None:
    """Fill unknown ``*_missed`` counts from an old row's verdict and censoring note."""
    m = _CENSORED.search(str(old.get("test", "")))
    if m:
        for side in ("method", "baseline"):
            if row[side] == m["side"] and row[f"{side}_missed"] is None:
                row[f"{side}_missed"] = int(m["missed"])
    elif old.get("verdict") in (AGREES, DISAGREES):  # significant and not censored: the faster side reached it every time
        side = "method" if (old["verdict"] == AGREES) == (old["better"] == "lower") else "baseline"
        if row[f"{side}_missed"] is None:
            row[f"{side}_missed"] = 0


def _missed_target(run, c: Claim) -> bool:
    v = run.rollouts_to(c.metric, c.target) if c.stat == "rollouts_to" else run.tokens_to(c.metric, c.target)
    return v is None


def _f(v: float | None, big: bool = False) -> str:
    if v is None:
        return "–"
    return f"{v:,.0f}" if big else f"{v:.3f}"


def render_claims(results: Sequence[dict]) -> str:
    """A Markdown table of judged claims: raw and Holm-adjusted p-values, the verdict of the
    stated test and the verdict under Holm's adjustment."""
    lines = ["| paper | claim | measure | method vs baseline (means) | difference [95% interval] | p (Welch) | p (Holm) | test "
             "| verdict | verdict (Holm) |",
             "|---|---|---|---|---:|---:|---:|---|---|---|"]
    for r in results:
        big = r["stat"] in ("rollouts_to", "tokens_to")
        if r["verdict"] == "not measured":
            means, diff, p, q = f"{r['method']} vs {r['baseline']}", "–", "–", "–"
        else:
            means = f"{r['method']} {_f(r['method_mean'], big)} vs {r['baseline']} {_f(r['baseline_mean'], big)} (n={r['n_a']}, {r['n_b']})"
            interval = f" [{_f(r['low'], big)}, {_f(r['high'], big)}]" if r.get("low") is not None else ""
            diff = f"{_f(r['diff'], big)}{interval}"
            p = "–" if r.get("p") is None else f"{r['p']:.3g}"
            q = "–" if r.get("p_holm") is None else f"{r['p_holm']:.3g}"
        cells = [r["paper"], r["claim"], f"{r['what']} ({r['better']} is better)", means, diff, p, q, r["test"],
                 f"**{r['verdict']}**", f"**{r.get('verdict_holm', r['verdict'])}**"]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def render_estimates(results: Sequence[dict]) -> str:
    """A Markdown table of the claims' rliable interval estimates (measured claims only)."""
    lines = ["| claim | measure | IQM method [95% CI] | IQM baseline [95% CI] | P(method better) [95% CI] |",
             "|---|---|---:|---:|---:|"]
    for r in results:
        if r["verdict"] == "not measured" or r.get("poi") is None:
            continue
        big = r["stat"] in ("rollouts_to", "tokens_to")
        cells = [r["claim"], f"{r['what']} ({r['better']} is better)",
                 f"{_f(r['iqm_method'], big)} [{_f(r['iqm_method_low'], big)}, {_f(r['iqm_method_high'], big)}]",
                 f"{_f(r['iqm_baseline'], big)} [{_f(r['iqm_baseline_low'], big)}, {_f(r['iqm_baseline_high'], big)}]",
                 f"{r['poi']:.2f} [{r['poi_low']:.2f}, {r['poi_high']:.2f}]"]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""
