"""A recipe's fidelity ledger: field by field, the authors' run against what the recipe runs.

A paper recipe reproduces the authors' run only if every field that decides the run (model,
data, prompt, reward, optimizer, lengths, step count, engine settings, the method's own knobs)
is the authors' value, or differs for a stated reason. The ledger is data in the recipe
(``recipe_info.ledger``)::

    recipe_info:
      ledger:
        sources:                        # what was read: a name -> "owner/repo@commit", "pypi:pkg==version ..." or "arXiv:ID ..."
          trinity: modelscope/Trinity-RFT@04143305e6a4c5bb27b43a1a2e43de7d0a3e5a39
        rows:
          - field: learning_rate         # one of FIELDS
            authors: 1.0e-6              # the authors' value (a value, or a sentence)
            source: "trinity examples/mix_chord/mix_chord.yaml:42"   # a source name, then file:line
            ours: {trainer.learning_rate: 1.0e-6}   # config keys -> the values this recipe resolves to
            verdict: same                # same | differs
          - field: optimizer
            authors: "AdamW, betas (0.9, 0.999), weight decay 0.01"
            source: "trinity trinity/common/config.py:310"
            ours: {trainer.adam_beta2: 0.999, trainer.weight_decay: 0.01}
            verdict: same

``ours`` is either a mapping of dotted config keys to values, which ``tests/test_ledger.py``
checks against the resolved recipe (so the ledger cannot drift from what runs), or, for a row
that differs, a sentence. A ``same`` row must be checkable (a mapping); a ``differs`` row must
say ``why``. ``what`` names the knob when a field has several rows (``method_knobs``). Every
field of :data:`FIELDS` has at least one row. ``mixrl explain recipe=...`` prints the rows that
differ; the recipe's page shows the whole ledger; ``mixrl recipes list`` counts them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from mixrl.errors import ConfigError

#: the fields that decide a run, in the order a ledger is shown; each has at least one row
FIELDS: dict[str, str] = {
    "base_model": "the model trained (and its context)",
    "data": "the training set",
    "data_filtering": "how the training set was filtered or split",
    "data_size": "how many training problems (and expert traces)",
    "system_prompt": "the system prompt / instruction around each problem",
    "chat_template": "the chat template that renders it",
    "reward": "the reward, its gates and penalties",
    "rollouts_per_prompt": "completions sampled per prompt (group size)",
    "prompts_per_step": "prompts per rollout batch",
    "updates_per_batch": "optimizer updates per rollout batch (mini-batches x epochs)",
    "learning_rate": "the peak learning rate",
    "lr_schedule": "the learning-rate schedule",
    "warmup": "learning-rate warm-up",
    "optimizer": "optimizer and its betas, eps, weight decay; gradient clipping",
    "total_steps": "how long the run trains (steps or epochs)",
    "prompt_length": "the longest prompt kept",
    "response_length": "the longest completion generated",
    "temperature": "rollout sampling temperature",
    "top_p": "rollout nucleus sampling",
    "top_k": "rollout top-k sampling",
    "kl_coef": "KL-to-reference coefficient",
    "kl_estimator": "KL estimator",
    "entropy_coef": "entropy bonus coefficient",
    "clip_ratios": "PPO clip ratios",
    "dual_clip": "dual clip on negative advantages",
    "loss_aggregation": "how token losses are averaged",
    "advantage_normalisation": "how rewards become advantages",
    "method_knobs": "the method's own settings",
    "engine_correction": "correction of inference-engine / trainer mismatch",
    "evaluation": "evaluation protocol",
}
VERDICTS = ("same", "differs")
_ROW_KEYS = {"field", "what", "authors", "source", "ours", "verdict", "why"}
_SOURCE = re.compile(r"^([A-Za-z0-9][\w.-]*/[\w.-]+@[0-9a-f]{7,40}\b.*|arXiv:\d{4}\.\d{4,5}\b.*|pypi:[\w.-]+==[\w.+-]+\b.*|none\b.*)$")


@dataclass(frozen=True)
class Row:
    field: str
    authors: Any
    source: str
    ours: Any  # {dotted key: value} or a sentence
    verdict: str
    what: str | None = None
    why: str | None = None

    @property
    def label(self) -> str:
        return f"{self.field} ({self.what})" if self.what else self.field


@dataclass(frozen=True)
class Ledger:
    sources: dict[str, str]
    rows: tuple[Row, ...]

    def counts(self) -> dict[str, int]:
        return {"rows": len(self.rows), **{v: sum(r.verdict == v for r in self.rows) for v in VERDICTS}}

    def differing(self) -> list[Row]:
        return [r for r in self.rows if r.verdict == "differs"]


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def ledger_of(info: Any, where: str = "recipe_info.ledger") -> Ledger | None:
    """The validated ledger of a ``recipe_info`` node or mapping; None when it has none.
    A malformed ledger is a :class:`ConfigError` naming the row and the fix."""
    info = _plain(info) or {}
    raw = info.get("ledger") if isinstance(info, dict) else None
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != {"sources", "rows"}:
        raise ConfigError(f"{where} must be a mapping with keys sources and rows; fix the recipe")
    sources = raw["sources"]
    if not isinstance(sources, dict) or not sources:
        raise ConfigError(f"{where}.sources must map a name to 'owner/repo@commit' or 'arXiv:ID ...'; fix the recipe")
    for name, src in sources.items():
        if not isinstance(src, str) or not _SOURCE.match(src.strip()):
            raise ConfigError(f"{where}.sources.{name}={src!r} must be 'owner/repo@COMMIT' (7-40 hex digits), "
                              f"'pypi:PACKAGE==VERSION ...' (a released package's files), 'arXiv:ID ...' or 'none ...' "
                              f"(no code published); fix the recipe")
    if not isinstance(raw["rows"], list) or not raw["rows"]:
        raise ConfigError(f"{where}.rows must be a non-empty list of rows; fix the recipe")
    rows = tuple(_row(r, i, sources, f"{where}.rows[{i}]") for i, r in enumerate(raw["rows"]))
    missing = [f for f in FIELDS if f not in {r.field for r in rows}]
    if missing:
        raise ConfigError(f"{where} has no row for {', '.join(missing)}: add one per field (verdict same or differs); fix the recipe")
    return Ledger(dict(sources), rows)


def _row(raw: Any, i: int, sources: dict, where: str) -> Row:
    if not isinstance(raw, dict) or set(raw) - _ROW_KEYS or not {"field", "authors", "source", "ours", "verdict"} <= set(raw):
        raise ConfigError(f"{where} must have keys field, authors, source, ours, verdict (and what, why); fix the recipe")
    field, verdict = raw["field"], raw["verdict"]
    if field not in FIELDS:
        raise ConfigError(f"{where}.field={field!r} is not a ledger field; use one of {', '.join(FIELDS)}")
    if verdict not in VERDICTS:
        raise ConfigError(f"{where}.verdict={verdict!r} must be same or differs; fix the recipe")
    source = raw["source"]
    if not isinstance(source, str) or source.split(" ", 1)[0] not in sources:
        raise ConfigError(f"{where}.source={source!r} must start with a name from the ledger's sources "
                          f"({', '.join(sources)}), then the file and line; fix the recipe")
    ours = raw["ours"]
    if isinstance(ours, dict):
        if not ours or not all(isinstance(k, str) and k for k in ours):
            raise ConfigError(f"{where}.ours must map dotted config keys to values; fix the recipe")
    elif not isinstance(ours, str) or not ours.strip():
        raise ConfigError(f"{where}.ours must be a mapping of config keys to values, or a sentence; fix the recipe")
    if verdict == "same" and not isinstance(ours, dict):
        raise ConfigError(f"{where} says same, so ours must be config keys -> values that a test can check; fix the recipe")
    why = raw.get("why")
    if verdict == "differs" and (not isinstance(why, str) or not why.strip()):
        raise ConfigError(f"{where} differs from the authors' run: say why (key why); fix the recipe")
    what = raw.get("what")
    if what is not None and not isinstance(what, str):
        raise ConfigError(f"{where}.what must be a short name of the knob; fix the recipe")
    return Row(field=field, authors=raw["authors"], source=source, ours=ours, verdict=verdict, what=what, why=why)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b or a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


_MISSING = object()


def drift(cfg: Any, ledger: Ledger) -> list[str]:
    """The rows whose ``ours`` keys no longer hold in ``cfg`` (a resolved config): one line each,
    ``'<field>: <key> is <resolved>, the ledger says <value>'``. Empty when the ledger is current."""
    out = []
    for row in ledger.rows:
        if not isinstance(row.ours, dict):
            continue
        for key, want in row.ours.items():
            got = OmegaConf.select(cfg, key, default=_MISSING)
            got = _MISSING if got is _MISSING else _plain(got)
            if got is _MISSING:
                out.append(f"{row.label}: {key} is not a config key")
            elif not _equal(got, want):
                out.append(f"{row.label}: {key} is {got!r}, the ledger says {want!r}")
    return out


def _show(value: Any) -> str:
    if value is None:
        return "null"  # as the recipe's YAML spells it
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return ", ".join(f"{k}={_show(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


def render_markdown(ledger: Ledger) -> str:
    """The ledger as a Markdown section (the recipe's page)."""
    c = ledger.counts()
    lines = ["## Fidelity ledger: the authors' run, field by field", "",
             f"{c['rows']} rows: {c['same']} the same as the authors' run, {c['differs']} differing (each says why). "
             "A test resolves this recipe and checks every `ours` value against what runs.", "",
             "Sources read: " + "; ".join(f"`{k}`: {v}" for k, v in ledger.sources.items()), "",
             "| field | authors | source | ours | verdict |", "|---|---|---|---|---|"]
    cell = lambda s: str(s).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    for r in ledger.rows:
        verdict = "same" if r.verdict == "same" else f"**differs**: {cell(r.why)}"
        lines.append(f"| {cell(r.label)} | {cell(_show(r.authors))} | {cell(r.source)} | {cell(_show(r.ours))} | {verdict} |")
    return "\n".join(lines) + "\n"


def render_differences(ledger: Ledger, cfg: Any = None) -> list[str]:
    """Plain lines for ``mixrl explain``: each row that differs from the authors' run, and (given the
    resolved ``cfg``) each row an override has changed since the recipe said it."""
    c = ledger.counts()
    lines = [f"fidelity ledger: {c['rows']} fields read against the authors' code, {c['same']} the same, {c['differs']} differ:"]
    for r in ledger.differing():
        lines.append(f"  {r.label}: authors {_show(r.authors)}; here {_show(r.ours)} ({r.why})")
    if cfg is not None:
        for line in drift(cfg, ledger):
            lines.append(f"  changed by your overrides: {line}")
    return lines
