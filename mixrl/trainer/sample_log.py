"""``samples.jsonl``: what the model writes, a few rows per logged step (``mixrl samples RUN_DIR``).

At every logged training step the trainer keeps ``logger.samples_per_step`` rows of its last
generation batch (:func:`capture_rows`: rows picked in turn from each source, so an expert or
replayed row shows next to the rollouts), and :class:`SampleLog` appends them to
``RUN_DIR/samples.jsonl``, one JSON object a row::

    {"split": "train", "step": 3, "source": "expert", "prompt": "3+4=", "completion": "7",
     "reward": 1.0, "rewards": {"exact_answer": 1.0}, "advantage": 0.87, "tokens": 1}

``source`` is the row's provenance (:mod:`mixrl.core.provenance`): ``on_policy``, ``expert``,
``replay``, ``teacher``, ... or, when the completion's tokens came from more than one,
their names joined by ``+`` in the order they appear (``prefix+on_policy``: a rollout continued
from a solution prefix; ``hinted``: sampled with a hint, trained without it;
``hint+on_policy``: sampled and trained with the hint in its prompt). Each held-out
evaluation (``trainer.eval_every`` and the one after training) adds ``logger.samples_eval``
rows with ``"split": "eval"``, its greedy completion and ``reward`` / ``correct``.

Bounded: texts are cut to ``logger.samples_max_chars`` characters (``…`` marks a cut), and the
file keeps the rows of the last ``logger.samples_keep_steps`` (split, step) pairs, older ones
dropped when it is rewritten. ``logger.samples_per_step=0`` writes no file.

This module reads no heavy package (``mixrl samples`` is a quick command): the tensors of
:func:`capture_rows` are used through their own methods.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from mixrl.core import provenance as prov
from mixrl.errors import ConfigError
from mixrl.jsonl import JsonlRows, read_jsonl, step_row

SAMPLES_FILE = "samples.jsonl"
ELLIPSIS = "…"


def trim(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters (the last one ``…`` when cut); 0: no limit."""
    text = str(text)
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    return text[: max(max_chars - 1, 0)] + ELLIPSIS


def prompt_text(prompt: Any) -> str:
    """A prompt as text: a string as it is, chat messages as their last user message."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], dict):
        users = [m for m in prompt if m.get("role") == "user"] or list(prompt)
        return str(users[-1].get("content", ""))
    return str(prompt)


def source_label(row_source: str, token_sources: list[str]) -> str:
    """The source shown for a row: the distinct provenances of its completion tokens, in the
    order they appear, joined by ``+`` (the row's own provenance when it has no token)."""
    names = list(OrderedDict.fromkeys(token_sources))
    return "+".join(names) if names else row_source


def pick_rows(sources: list[str], n: int) -> list[int]:
    """``n`` row indices taken in turn from each source (in order of first appearance), so a
    batch of 28 rollouts and 4 expert rows shows both; sorted."""
    by_source: dict[str, list[int]] = OrderedDict()
    for i, s in enumerate(sources):
        by_source.setdefault(s, []).append(i)
    picked: list[int] = []
    queues = [list(v) for v in by_source.values()]
    while len(picked) < n and any(queues):
        for q in queues:
            if q and len(picked) < n:
                picked.append(q.pop(0))
    return sorted(picked)


def _ids(row, mask) -> list[int]:
    return [int(t) for t, m in zip(row.tolist(), mask.tolist()) if m]


def capture_rows(out: dict, *, tokenizer, rewards, rewards_per_func, reward_names: list[str], start: int,
                 n: int, max_chars: int, n_local_scored: int | None = None, guided: list[int] | None = None, scored_sources=None) -> list[dict]:
    """Up to ``n`` rows of a generation batch ``out`` (this process's rows; ``rewards`` and
    ``rewards_per_func`` are gathered over processes, this process's rows start at ``start``)
    as :data:`SAMPLES_FILE` rows without their step. Rows after the first ``n_local_scored``
    were added after scoring (an injection's expert rows): their ``reward`` is null. ``guided``:
    per local row, 2 for a rollout generated with a hint (``Rollouts.guided``). ``scored_sources``:
    the rows' ``row_source`` when they were scored; a row whose source changed since (replayed
    into a rollout's place) gets no per-function ``rewards``."""
    ids, mask = out["completion_ids"], out["completion_mask"]
    row_source = out["row_source"].tolist()
    token_source = out.get("token_source")
    names = {p: prov.provenance_names()[p] for p in set(row_source)}
    labels = []
    tokens_of = []
    for i in range(ids.shape[0]):
        m = mask[i].tolist()
        toks = []
        if token_source is not None and token_source.numel():
            toks = [prov.provenance_names()[int(c)] for c, keep in zip(token_source[i].tolist(), m) if keep]
        tokens_of.append(sum(1 for x in m if x))
        label = source_label(names[row_source[i]], toks)
        if guided is not None and i < len(guided) and guided[i] == 2 and label == "on_policy":
            label = "hint+on_policy"  # sampled and trained with a hint in the prompt (GHPO; the prompt shown carries it)
        labels.append(label)
    rows = []
    adv = out.get("advantages")
    n_scored = n_local_scored if n_local_scored is not None else ids.shape[0]
    for i in pick_rows(labels, n):
        prompt = tokenizer.decode(_ids(out["prompt_ids"][i], out["prompt_mask"][i]), skip_special_tokens=True)
        completion = tokenizer.decode(_ids(ids[i], mask[i]), skip_special_tokens=True)
        # rows an injection appended after scoring (expert rows) have no reward of this batch's scoring
        scored = rewards is not None and start + i < rewards.shape[0] and i < n_scored
        # a row an injection rewrote after scoring (a replayed row in a rollout's place) has its own summed
        # reward but not the per-function scores of the rollout it replaced
        rewritten = scored_sources is not None and i < scored_sources.shape[0] and int(scored_sources[i]) != row_source[i]
        per_func = rewards_per_func[start + i].tolist() if scored and not rewritten and rewards_per_func is not None else []
        rows.append({
            "source": labels[i],
            "prompt": trim(prompt, max_chars),
            "completion": trim(completion, max_chars),
            "reward": _num(rewards[start + i]) if scored else None,
            "rewards": {name: _num(v) for name, v in zip(reward_names, per_func)},
            "advantage": _row_advantage(adv, mask, i),
            "tokens": tokens_of[i],
        })
        turns = _turns(tokenizer, ids[i], mask[i], token_source[i] if token_source is not None and token_source.numel() else None,
                       adv[i] if adv is not None and adv.dim() == 2 else None)
        if turns:
            rows[-1]["turns"] = turns
    return rows


def _turns(tokenizer, ids, mask, token_source, adv=None) -> list[dict] | None:
    """A multi-turn row's turns: ``[{by: policy | environment | patched, text, trained}]``, one per run of
    tokens the policy wrote, a tool / environment wrote (provenance ``environment``, never
    trained) or an episode injection wrote (``patched``, an expert's turn the policy terms leave out); None for a row without such tokens. With per-token advantages (``adv`` [T]: GAE's,
    MT-GRPO's) a policy turn also carries ``advantage``, the mean over its tokens."""
    if token_source is None:
        return None
    keep = mask.bool()
    src = token_source[keep]
    written = torch.where(src == prov.ENVIRONMENT, 1, torch.where(src == prov.PATCHED, 2, 0)).tolist()
    if not any(written):
        return None
    toks = ids[keep].tolist()
    turns, start = [], 0
    for t in range(1, len(toks) + 1):
        if t == len(toks) or written[t] != written[start]:
            by = ("policy", "environment", "patched")[written[start]]  # patched: an episode injection's turn (an expert's)
            turns.append({"by": by, "text": tokenizer.decode(toks[start:t], skip_special_tokens=False), "trained": by == "policy"})
            if adv is not None and by == "policy":
                turns[-1]["advantage"] = _num(adv[keep][start:t].float().mean())
            start = t
    return turns


def eval_rows(examples: list[dict], n: int, max_chars: int) -> list[dict]:
    """The first ``n`` held-out examples (``prompt``, ``completion``, ``reward``, ``correct``,
    ``answer``) as :data:`SAMPLES_FILE` rows without their step."""
    rows = []
    for ex in examples[: max(n, 0)]:
        rows.append({
            "source": "heldout",
            "prompt": trim(prompt_text(ex.get("prompt", "")), max_chars),
            "completion": trim(ex.get("completion", ""), max_chars),
            "reward": _num(ex.get("reward")),
            "correct": bool(ex.get("correct")),
            "answer": trim(str(ex.get("answer", "")), max_chars) if ex.get("answer") is not None else None,
        })
    return rows


def _row_advantage(adv, mask, i: int) -> float | None:
    """Row ``i``'s advantage; a per-token one ([B, T], GAE) as its mean over the completion's tokens."""
    if adv is None:
        return None
    if adv.dim() == 1:
        return _num(adv[i])
    m = mask[i].bool()
    return _num(adv[i][m].float().mean()) if bool(m.any()) else None


def _num(v) -> float | None:
    if v is None:
        return None
    v = float(v)
    return None if v != v or v in (float("inf"), float("-inf")) else round(v, 6)


class SampleTap:
    """The hand-off of sample rows from the trainer to :class:`~mixrl.trainer.callbacks.SampleLogCallback`:
    the trainer (``spec.samples``) keeps ``rows`` rows of each training batch, texts cut to ``chars``
    characters (:meth:`keep`, the last batch's replacing the one before), the callback takes them at each
    logged step (:meth:`take`). Per process, not checkpointed."""

    def __init__(self, rows: int, chars: int = 1000):
        self.rows, self.chars = int(rows), int(chars)
        self._kept: list[dict] | None = None

    def keep(self, rows: list[dict] | None) -> None:
        self._kept = rows

    def take(self) -> list[dict] | None:
        """The rows kept since the last call (None: none)."""
        rows, self._kept = self._kept, None
        return rows


class SampleLog:
    """``RUN_DIR/samples.jsonl``, holding the rows of at most ``keep_steps`` (split, step) pairs."""

    def __init__(self, run_dir: str | Path, keep_steps: int = 200):
        self.path = Path(run_dir) / SAMPLES_FILE
        self.keep_steps = int(keep_steps)
        self.rows: list[dict] = read_rows(self.path) if self.path.is_file() else []

    def append(self, split: str, step: int, rows: list[dict]) -> list[dict]:
        """Add ``rows`` at (``split``, ``step``); returns them as written."""
        written = [{"split": split, "step": int(step), **r} for r in rows]
        if not written:
            return written
        self.rows.extend(written)
        keys = list(OrderedDict.fromkeys((r["split"], r["step"]) for r in self.rows))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.keep_steps > 0 and len(keys) > self.keep_steps:
            kept = set(keys[-self.keep_steps:])
            self.rows = [r for r in self.rows if (r["split"], r["step"]) in kept]
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in self.rows))
            tmp.replace(self.path)
        else:
            with self.path.open("a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in written))
        return written


def sample_row(row: dict) -> str | None:
    """Why ``row`` is not a :data:`SAMPLES_FILE` row (None when it is): an integer ``step``, a
    ``split`` of ``train`` or ``eval`` (or none: a training row)."""
    why = step_row(row)
    if why is None and row.get("split", "train") not in ("train", "eval"):
        why = f"'split' is {json.dumps(row.get('split'))[:20]}, not \"train\" or \"eval\""
    return why


def read_rows(path: Path) -> list[dict]:
    """The rows of a sample log; unreadable lines (a line cut by a kill, bytes that are not
    UTF-8, JSON that is not a row) are skipped (:func:`read_log` counts them)."""
    return read_log(path).rows


def read_log(path: Path) -> JsonlRows:
    """The rows of a sample log and its unreadable lines (:func:`mixrl.jsonl.read_jsonl`)."""
    return read_jsonl(path, sample_row)


def read_samples(run_dir: str | Path, warn=None) -> list[dict]:
    """The rows of ``RUN_DIR/samples.jsonl``; ConfigError (one line) for a missing directory,
    a run without a sample log, or a log of which no line is a row. Unreadable lines are
    skipped, and ``warn`` (when given) gets one line saying how many."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir} is not a directory: give the run directory of a `mixrl train` run (its run_dir)")
    path = run_dir / SAMPLES_FILE
    if not path.is_file():
        if not (run_dir / "config.yaml").is_file():
            raise ConfigError(f"{run_dir} is not a run directory (no config.yaml): give the run_dir of a `mixrl train` run")
        raise ConfigError(f"{run_dir} has no {SAMPLES_FILE} (a run from before mixrl logged samples, or logger.samples_per_step=0): "
                          f"train again with logger.samples_per_step=4 to record what the model writes")
    try:
        log = read_log(path)
    except OSError as e:
        raise ConfigError(f"{path} cannot be read ({e.strerror or e}); check its permissions (chmod u+r)") from None
    if log.bad and not log.rows:
        line, why = log.bad[0]
        raise ConfigError(f"{path} holds no readable sample row ({len(log.bad)} unreadable lines; line {line}: {why}); "
                          f"it is not a sample log mixrl wrote: delete it, or train again with logger.samples_per_step=4")
    if log.bad and warn is not None:
        warn(log.bad_note())
    return log.rows


def select(rows: list[dict], *, last: int = 0, source: str | None = None, heldout: bool = False) -> list[dict]:
    """Rows of one split (``heldout``: the last evaluation's; otherwise training rows of the last
    ``last`` steps, all when 0), whose source (or one of its ``+`` parts) is ``source``."""
    if heldout:
        rows = [r for r in rows if r.get("split") == "eval"]
        if rows:
            final = max(int(r["step"]) for r in rows)
            rows = [r for r in rows if int(r["step"]) == final]
    else:
        rows = [r for r in rows if r.get("split", "train") == "train"]
        if last > 0:
            steps = sorted({int(r["step"]) for r in rows})[-last:]
            rows = [r for r in rows if int(r["step"]) in set(steps)]
    if source:
        rows = [r for r in rows if source in str(r.get("source", "")).split("+")]
    return rows


def sources_in(rows: list[dict]) -> list[str]:
    return sorted({part for r in rows for part in str(r.get("source", "")).split("+") if part})


COLUMNS = ("step", "source", "reward", "advantage", "prompt", "completion")


def cells(row: dict, width: int = 0) -> list[str]:
    """The table cells of a row (texts on one line, cut to ``width`` characters when > 0)."""
    def num(v):
        if v is None:
            return "-"
        return f"{v:.3g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)  # a hand-edited row

    reward = num(row.get("reward"))
    if row.get("split") == "eval":
        reward += " ✓" if row.get("correct") else " ✗"
    one_line = lambda s: trim(str(s or "").replace("\n", "⏎ "), width)  # noqa: E731
    completion = row.get("completion")
    if row.get("turns"):  # a multi-turn row: who wrote each turn; a tool's turn is not trained
        who = lambda t: ("policy" + (f", A={num(t['advantage'])}" if t.get("advantage") is not None else "")  # noqa: E731
                         if t.get("trained") else t.get("by", "?") + ", not trained")
        completion = " ".join(f"[{who(t)}] {t.get('text', '')}" for t in row["turns"])
    return [str(row.get("step")), str(row.get("source")), reward, num(row.get("advantage")),
            one_line(row.get("prompt")), one_line(completion)]


def markdown_table(rows: list[dict], width: int = 200) -> str:
    """The rows as a Markdown table (TensorBoard renders it in its Text tab)."""
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(esc(c) for c in cells(r, width)) + " |" for r in rows]
    return "\n".join(lines)
