"""Reading run directories for ``mixrl compare``: a run's summary, metrics and held-out evaluations.

A run directory holds ``summary.json`` (written when training finishes), ``metrics.jsonl``
(one row per logged step), ``eval.jsonl`` (held-out evaluations every ``trainer.eval_every``
steps) and ``config.yaml``. :func:`find_runs` finds every run at or below some folders (a
multirun sweep, a reproduce grid); :func:`load_run` reads one into a :class:`Run`.

Pure Python over the files (no torch import).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mixrl.errors import MixrlUserError
from mixrl.jsonl import read_jsonl, step_row
from mixrl.options import read_user_text

SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
EVALS = "eval.jsonl"
CONFIG = "config.yaml"
_SKIP_DIRS = {"model", "trainer", ".git", "__pycache__", "wandb"}


class CompareError(MixrlUserError):
    """Nothing to compare, or a run directory that cannot be read."""


# --------------------------------------------------------------------------- reading
def _read_jsonl(path: Path) -> list[dict]:
    """The rows of a run's ``metrics.jsonl`` / ``eval.jsonl``; a line that is not UTF-8, not
    JSON or not a row with an integer ``step`` is refused in one line naming it
    (:func:`mixrl.jsonl.read_jsonl`): a comparison never silently drops measurements."""
    try:
        log = read_jsonl(path, step_row)
    except OSError as e:
        raise CompareError(f"cannot read {path} ({e.strerror or e}); check its permissions (chmod u+r)") from None
    if log.bad:
        line, why = log.bad[0]
        more = f" ({len(log.bad) - 1} more such lines)" if len(log.bad) > 1 else ""
        raise CompareError(f"{path}:{line} is not a row: {why}{more}; fix or delete the line")
    return log.rows


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) or math.isinf(f) else f


@dataclass
class Run:
    """One run directory, read."""

    path: Path
    summary: dict
    metrics: list[dict] = field(default_factory=list)  # metrics.jsonl rows (staged runs: the combined file)
    evals: list[dict] = field(default_factory=list)  # eval.jsonl rows, stages merged with continuous step/rollouts
    config: dict | None = None  # config.yaml, read only when grouping by config keys

    @property
    def seed(self) -> Any:
        return self.summary.get("seed")

    @property
    def method(self) -> str:
        return str(self.summary.get("recipe") or self.summary.get("algo") or "?")

    @property
    def steps(self) -> int:
        return int(self.summary.get("steps") or (self.metrics[-1].get("step", 0) if self.metrics else 0))

    @property
    def rollouts(self) -> int:
        return int(self.summary.get("rollouts") or 0)

    def eval_points(self, metric: str) -> list[tuple[int, float, float]]:
        """Held-out evaluations of ``metric`` as ``(step, rollouts, value)``, by step: before
        training (step 0), every ``eval.jsonl`` row, after training (the last step)."""
        pts: dict[int, tuple[int, float, float]] = {}
        before = _num((self.summary.get("eval_before") or {}).get(metric))
        if before is not None:
            pts[0] = (0, 0.0, before)
        for r in self.evals:
            v, s = _num(r.get(metric)), r.get("step")
            if v is None or s is None:
                continue
            ro = _num(r.get("rollouts"))
            if ro is None:  # older rows: assume a constant number of rollouts per step
                ro = self.rollouts * int(s) / max(self.steps, 1)
            pts[int(s)] = (int(s), ro, v)
        after = _num((self.summary.get("eval_after") or {}).get(metric))
        if after is not None and self.steps not in pts:
            pts[self.steps] = (self.steps, float(self.rollouts), after)
        return [pts[k] for k in sorted(pts)]

    def final(self, metric: str) -> float | None:
        after = self.summary.get("eval_after") or {}
        if metric in after:
            return _num(after[metric])
        if metric == "accuracy":
            return _num(self.summary.get("accuracy_after"))
        return None

    def best(self, metric: str) -> float | None:
        vals = [v for s, _, v in self.eval_points(metric) if s > 0]
        return max(vals) if vals else None

    def rollouts_to(self, metric: str, target: float) -> float | None:
        """Rollouts trained on when a held-out evaluation first reached ``target`` (None: never)."""
        for _, ro, v in self.eval_points(metric):
            if v >= target - 1e-12:
                return ro
        return None

    @property
    def generated_tokens(self) -> int | None:
        v = self.summary.get("generated_tokens")
        return None if v is None else int(v)

    def tokens_to(self, metric: str, target: float) -> float | None:
        """Generated completion tokens when a held-out evaluation first reached ``target``
        (None: never, or the run did not record them)."""
        tokens = {0: 0.0}
        for r in self.evals:
            if r.get("step") is not None and _num(r.get("generated_tokens")) is not None:
                tokens[int(r["step"])] = float(r["generated_tokens"])
        if self.generated_tokens is not None:
            tokens.setdefault(self.steps, float(self.generated_tokens))
        for s, _, v in self.eval_points(metric):
            if v >= target - 1e-12:
                return tokens.get(s)
        return None

    def collapsed(self, metric: str) -> bool | None:
        """Whether the final ``metric`` fell below half of the best held-out evaluation
        (before training included); None without a final value."""
        final = self.final(metric)
        vals = [v for _, _, v in self.eval_points(metric)]
        if final is None or not vals:
            return None
        best = max(vals)
        return best > 0 and final < 0.5 * best

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """``(steps, values)`` of a metrics.jsonl column (rows without a value skipped)."""
        xs, ys = [], []
        for r in self.metrics:
            v = _num(r.get(key))
            if v is not None and r.get("step") is not None:
                xs.append(int(r["step"]))
                ys.append(v)
        return xs, ys

    def last(self, key: str) -> float | None:
        _, ys = self.series(key)
        return ys[-1] if ys else None

    def mean(self, key: str) -> float | None:
        _, ys = self.series(key)
        return sum(ys) / len(ys) if ys else None

    def load_config(self) -> dict:
        """The run's ``config.yaml`` as a dict (``{}`` without one), read once; CompareError (one line
        naming the file) when it is not UTF-8, not YAML, or not a mapping."""
        if self.config is None:
            p = self.path / CONFIG
            try:
                data = yaml.safe_load(read_user_text(p, "the run's config")) if p.is_file() else {}
            except yaml.YAMLError as e:
                raise CompareError(f"{p} is not valid YAML ({str(e).splitlines()[0]}); restore it or drop the run") from None
            if not isinstance(data, dict):
                raise CompareError(f"{p} holds a YAML {type(data).__name__}, not the mapping `mixrl train` writes; "
                                   "restore it or drop the run")
            self.config = data
        return self.config

    def config_value(self, key: str) -> Any:
        if key in ("seed", "algo", "recipe"):
            return self.summary.get(key)
        node: Any = self.load_config()
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                raise CompareError(f"--by {key}: run {self.path} has no config value '{key}' (see its config.yaml)")
            node = node[part]
        return node


def find_runs(paths: Iterable[str | Path]) -> list[Path]:
    """Every run directory at or below ``paths`` (a folder holding summary.json), sorted,
    without duplicates; a run's own sub-folders (stages) are not searched."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise CompareError(f"'{p}' does not exist; give run directories or folders that contain runs")
        if not p.is_dir():
            raise CompareError(f"'{p}' is not a directory; give run directories or folders that contain runs")
        n = len(found)
        for root, dirs, files in os.walk(p):
            if SUMMARY in files:
                found.append(Path(root))
                dirs[:] = []
                continue
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        if len(found) == n:
            raise CompareError(f"no run found in '{p}': a run directory holds {SUMMARY} (written when training finishes)")
    unique = {q.resolve(): q for q in found}
    return [unique[k] for k in sorted(unique)]


def load_run(path: str | Path) -> Run:
    path = Path(path)
    try:
        summary = json.loads((path / SUMMARY).read_text())
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8 (UnicodeDecodeError)
        raise CompareError(f"cannot read {path / SUMMARY}: {e}") from None
    if not isinstance(summary, dict):
        raise CompareError(f"cannot read {path / SUMMARY}: it holds a JSON {type(summary).__name__}, not the object "
                           "`mixrl train` writes; delete the folder or train it again")
    run = Run(path=path, summary=summary, metrics=_read_jsonl(path / METRICS))
    stages = summary.get("stages")
    if stages:  # a staged run: each stage folder has its own eval.jsonl; make step and rollouts continuous
        step0, ro0, tok0 = 0, 0, 0
        for st in stages:
            sdir = Path(st.get("run_dir") or "")
            if not sdir.is_dir():  # the run was moved: stage folders sit inside it
                sdir = path / Path(st.get("run_dir", "")).name
            ssum = {}
            if (sdir / SUMMARY).is_file():
                ssum = json.loads((sdir / SUMMARY).read_text())
            for r in _read_jsonl(sdir / EVALS):
                r = dict(r, step=int(r["step"]) + step0, stage=st.get("name"))
                if r.get("rollouts") is not None:
                    r["rollouts"] = r["rollouts"] + ro0
                if r.get("generated_tokens") is not None:
                    r["generated_tokens"] = r["generated_tokens"] + tok0
                run.evals.append(r)
            step0 += int(st.get("steps") or ssum.get("steps") or 0)
            ro0 += int(ssum.get("rollouts") or 0)
            tok0 += int(ssum.get("generated_tokens") or 0)
    else:
        run.evals = _read_jsonl(path / EVALS)
    run.evals.sort(key=lambda r: r.get("step", 0))
    return run


