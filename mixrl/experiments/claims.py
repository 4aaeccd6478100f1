"""Paper claims as data, judged over seeds.

A claim says that one method beats another on a held-out metric, e.g. (YAML, in a suite)::

    - paper: "Learning to Reason under Off-Policy Guidance"
      claim: LUFFY learns problems on-policy RL cannot solve
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
:func:`judge_claims` compares the two methods' per-seed values with :func:`mixrl.experiments.stats.judge`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mixrl.errors import ConfigError
from mixrl.experiments.stats import AGREES, DISAGREES, TESTS, UNRESOLVED, judge

STATS = ("final", "best", "drop", "rollouts_to", "tokens_to")
_FIELDS = {"paper", "claim", "method", "baseline", "metric", "stat", "better", "test", "target"}


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
    """Each claim with its per-seed values and the verdict (:func:`mixrl.experiments.stats.judge`).
    A method without runs gives verdict ``"not measured"``."""
    out = []
    for c in claims:
        a = [v for v in (run_value(r, c) for r in groups.get(c.method, ())) if v is not None]
        b = [v for v in (run_value(r, c) for r in groups.get(c.baseline, ())) if v is not None]
        row: dict[str, Any] = {**c.__dict__, "what": c.describe(), "method_values": a, "baseline_values": b}
        if not a or not b:
            row.update(verdict="not measured", test=f"{c.test} (no runs of {c.method if not a else c.baseline})")
        else:
            row.update(judge(a, b, better=c.better, test=c.test).as_dict())
            row["method_mean"] = sum(a) / len(a)
            row["baseline_mean"] = sum(b) / len(b)
            if c.stat in ("rollouts_to", "tokens_to"):
                _censor(row, c, groups)
        out.append(row)
    return out


def _censor(row: dict, c: Claim, groups: Mapping[str, Sequence[Any]]) -> None:
    """A run that never reached the target counts with its whole budget, a lower bound of the
    true value. So a verdict that one side needs *fewer* rollouts (tokens) than the other
    stands only when every run of that side reached the target; else it is not resolved."""
    if row["verdict"] not in (AGREES, DISAGREES):
        return
    method_smaller = (row["verdict"] == AGREES) == (c.better == "lower")
    side = c.method if method_smaller else c.baseline
    runs = [r for r in groups.get(side, ()) if run_value(r, c) is not None]
    missed = sum(1 for r in runs if _missed_target(r, c))
    if missed:
        row["verdict"] = UNRESOLVED
        row["test"] = f"{row['test']}; censored: {side} did not reach the target in {missed}/{len(runs)} runs"


def _missed_target(run, c: Claim) -> bool:
    v = run.rollouts_to(c.metric, c.target) if c.stat == "rollouts_to" else run.tokens_to(c.metric, c.target)
    return v is None


def _f(v: float | None, big: bool = False) -> str:
    if v is None:
        return "–"
    return f"{v:,.0f}" if big else f"{v:.3f}"


def render_claims(results: Sequence[dict]) -> str:
    """A Markdown table of judged claims."""
    lines = ["| paper | claim | measure | method vs baseline (means) | difference [95% interval] | p (Welch) | test | verdict |",
             "|---|---|---|---|---:|---:|---|---|"]
    for r in results:
        big = r["stat"] in ("rollouts_to", "tokens_to")
        if r["verdict"] == "not measured":
            means, diff, p = f"{r['method']} vs {r['baseline']}", "–", "–"
        else:
            means = f"{r['method']} {_f(r['method_mean'], big)} vs {r['baseline']} {_f(r['baseline_mean'], big)} (n={r['n_a']}, {r['n_b']})"
            interval = f" [{_f(r['low'], big)}, {_f(r['high'], big)}]" if r.get("low") is not None else ""
            diff = f"{_f(r['diff'], big)}{interval}"
            p = "–" if r.get("p") is None else f"{r['p']:.3g}"
        cells = [r["paper"], r["claim"], f"{r['what']} ({r['better']} is better)", means, diff, p, r["test"], f"**{r['verdict']}**"]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)
