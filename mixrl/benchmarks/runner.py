"""Generate a benchmark's samples, streamed to a JSONL file that resumes, then score them.

Each benchmark's samples go to ``CACHE/benchmarks/NAME-KEY.jsonl``, one line per sample (problem
index, id and fingerprint of prompt + gold answer, sample number, completion, extracted answer,
correct), appended and flushed batch by batch as they are produced. ``KEY`` hashes what the samples depend on: the
model folder (path, and the size and modification time of its files,
:func:`mixrl.evaluation.cache._model_fingerprint`), its dtype, the benchmark's source, columns,
prompt, system prompt and protocol (samples, temperature, top-p, new tokens), the sampling
seed and, for a sampled protocol, how samples are drawn (:data:`DRAW`). An interrupted evaluation
therefore starts again where it stopped (finished samples are read back, not regenerated), and a
finished one loads no model at all. ``benchmarks.limit``
takes the first N problems of the same file, so a short check is the start of the full run.

Generation: :class:`HFGenerator` (HF ``generate`` through :mod:`mixrl.evaluation.generate`, left-padded batches, the tokenizer's special
tokens for plain prompts as TRL adds them) or :class:`VLLMGenerator` (vLLM's offline engine on
the saved folder; tensor parallel over the visible GPUs, the CPU build on CPU).

Resuming gives what an uninterrupted run gives. Every sample is drawn from (seed, problem index,
sample index) alone: the *pair* ``problem * samples + sample`` seeds it (HF: the Gumbel-max
sampler :class:`mixrl.benchmarks.sampling.SeededSampling`; vLLM: one request per pair with
``SamplingParams.seed`` = :func:`mixrl.benchmarks.engine.pair_seed`), so which samples are
already in the file changes none of the others. Batches are a fixed grid over the pairs
(``trainer.eval_batch_size`` pairs each); a batch with any sample missing is generated whole and
only its missing samples are written, so a resumed batch has the rows, padding and shapes it had
in the uninterrupted run and draws the same tokens on the same machine. The file is read
line by line (:func:`read_samples`): a torn last line (a kill during a write), a line that is not
UTF-8 or not one of these records is skipped and counted (``skipped_lines`` in the result), and a
second copy of a sample is never counted. Each batch is appended with one ``write``, after a
newline when the file ends inside a torn line, so a torn line never swallows the next record.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mixrl.benchmarks import scoring
from mixrl.benchmarks.data import Problem
from mixrl.benchmarks.engine import pair_seed
from mixrl.benchmarks.sampling import SeededSampling
from mixrl.benchmarks.metrics import benchmark_metrics
from mixrl.benchmarks.spec import Benchmark
from mixrl.errors import ConfigError
from mixrl.evaluation.cache import _model_fingerprint
from mixrl.evaluation.generate import generate_texts, left_padding
from mixrl.models.tiny_spec import cache_root


def default_cache_dir() -> Path:
    return Path(cache_root()) / "benchmarks"


def check_cache_dir(cache_dir: str | Path) -> Path:
    """``cache_dir`` as a folder the samples files can go into: refused in one line when it, or the
    first of its parents that exists, is not a folder (checked before any model loads)."""
    path = Path(cache_dir).expanduser()
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        what = "is a file" if probe == path else f"is under {probe}, which is a file"
        raise ConfigError(f"benchmarks.cache_dir={cache_dir}: {what}, not a folder; set benchmarks.cache_dir to a folder "
                          "(the samples files are written there)")
    return path


#: how sampled protocols draw (part of their key): "pair" = seeded per (seed, problem, sample) pair. Samples
#: drawn before (seeded per batch, which a resume changed) are not mixed with these; greedy keys are unchanged.
DRAW = "pair"


def samples_key(bench: Benchmark, *, model_path: str, dtype: str, system_prompt: str | None, seed: int) -> str:
    payload = {"model": _model_fingerprint(model_path), "dtype": dtype, "bench": bench.key_payload(),
               "system": system_prompt, "seed": seed}
    if bench.protocol.temperature > 0:
        payload["draw"] = DRAW
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:20]


def render(tokenizer, problem: Problem, system_prompt: str | None, *, chat: bool) -> Any:
    """The prompt a problem is generated from: a chat message list when the tokenizer has a chat
    template, else plain text (the system prompt, a blank line, the problem)."""
    if problem.row.get("prompt") is not None:  # the built-in task's own prompt (text or messages)
        return problem.row["prompt"]
    if chat:
        return ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
            {"role": "user", "content": problem.problem}]
    return f"{system_prompt}\n\n{problem.problem}" if system_prompt else problem.problem


class HFGenerator:
    """Batched HF ``generate``, one row per (problem, sample) pair: greedy at temperature 0, else
    sampling with temperature and top-p seeded per pair (:class:`mixrl.benchmarks.sampling.SeededSampling`)."""

    name = "hf"

    def __init__(self, load: Callable[[], Any], tokenizer, *, batch_size: int):
        self._load, self.tokenizer, self.batch_size = load, tokenizer, int(batch_size)
        self.model = None
        self.load_seconds = 0.0  # loading the model (reported apart from generation)

    def generate(self, prompts: list, *, pairs: list[int], temperature: float, top_p: float | None, max_new_tokens: int,
                 seed: int) -> list[str]:
        """One completion per prompt, ``pairs[i]`` seeding prompt ``i``'s sample."""
        if self.model is None:
            t0 = time.perf_counter()
            self.model = self._load()
            self.model.eval()
            self.load_seconds += time.perf_counter() - t0
        # sampling = greedy decoding of Gumbel-perturbed scores, the noise seeded by (seed, pair, position)
        seeded = SeededSampling(seed, pairs, temperature, top_p).batch(0) if temperature > 0 else None
        with left_padding(self.tokenizer):
            return generate_texts(self.model, self.tokenizer, prompts, max_new_tokens=max_new_tokens, logits_processor=seeded)


class VLLMGenerator:
    """vLLM's offline engine on the saved model folder (``LLM.generate``), one request per (problem,
    sample) pair seeded by it (``SamplingParams.seed`` = :func:`mixrl.benchmarks.engine.pair_seed`)."""

    name = "vllm"

    def __init__(self, model_path: str, tokenizer, *, dtype: str, max_model_len: int | None = None):
        self.model_path, self.tokenizer, self.dtype, self.max_model_len = model_path, tokenizer, dtype, max_model_len
        self.llm = None
        self.load_seconds = 0.0  # starting the engine (reported apart from generation)

    def generate(self, prompts: list, *, pairs: list[int], temperature: float, top_p: float | None, max_new_tokens: int,
                 seed: int) -> list[str]:
        """One completion per prompt, ``pairs[i]`` seeding prompt ``i``'s sample."""
        from vllm import LLM, SamplingParams  # deferred: vllm is optional (the vllm extras)

        if self.llm is None:
            kwargs = {"tensor_parallel_size": max(torch.cuda.device_count(), 1), "dtype": self.dtype, "seed": 0}
            if not torch.cuda.is_available():
                kwargs.update(enforce_eager=True)
            if self.max_model_len:
                kwargs["max_model_len"] = self.max_model_len
            t0 = time.perf_counter()
            self.llm = LLM(model=self.model_path, **kwargs)
            self.load_seconds += time.perf_counter() - t0
        tok = self.tokenizer
        texts = [p if isinstance(p, str) else tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
                 for p in prompts]
        # plain prompts get the tokenizer's special tokens (bos) as HF's path adds them; rendered chat already holds them
        ids = [tok(t, add_special_tokens=isinstance(p, str))["input_ids"] for t, p in zip(texts, prompts)]
        context = int(self.llm.llm_engine.model_config.max_model_len)
        if max(map(len, ids)) >= context:
            raise ConfigError(f"a prompt of {max(map(len, ids))} tokens does not fit the model's context of {context} tokens; "
                              "shorten the benchmark's prompt.template or evaluate a model with a longer context")
        # as HF generate does, a sample stops at the end of the context (vLLM would refuse the request)
        sample = temperature > 0
        params = [SamplingParams(n=1, temperature=temperature if sample else 0.0,
                                 top_p=top_p if sample and top_p is not None else 1.0,
                                 max_tokens=min(max_new_tokens, context - len(x)), seed=pair_seed(seed, j))
                  for x, j in zip(ids, pairs)]
        outs = self.llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False)
        return [r.outputs[0].text for r in outs]


def fingerprint(prompt: Any, problem: Problem) -> str:
    """What a sample was drawn for: the prompt as generated and the gold answer (a changed row, or
    another built-in split, never reuses a sample)."""
    return hashlib.sha256(json.dumps([prompt, problem.answer], sort_keys=True, default=str).encode()).hexdigest()[:16]


def _record(raw: bytes, n: int) -> dict | None:
    """One line of a samples file as its record, or None when it is not one (torn, not UTF-8, not
    JSON, or not a record of this protocol's ``n`` samples)."""
    try:
        rec = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(rec, dict):
        return None
    ints = all(isinstance(rec.get(k), int) and not isinstance(rec.get(k), bool) for k in ("problem", "sample"))
    if not ints or not 0 <= rec["sample"] < n or not isinstance(rec.get("correct"), bool):
        return None
    if not all(isinstance(rec.get(k), str) for k in ("id", "fp", "completion")):
        return None
    return rec if rec.get("extracted") is None or isinstance(rec["extracted"], str) else None


def read_samples(path: Path, problems: list[Problem], n: int, fps: list[str]) -> tuple[dict[int, dict[int, dict]], int]:
    """``({problem index: {sample: record}}, skipped)``: the samples already in ``path`` for these
    problems (same index, id and fingerprint), the first copy of each (problem, sample) only, and
    the number of lines that are not records (torn, not UTF-8, foreign), which are skipped."""
    ids = {p.index: (p.id, fp) for p, fp in zip(problems, fps)}
    done: dict[int, dict[int, dict]] = {}
    skipped = 0
    if not path.is_file():
        return done, skipped
    for raw in path.read_bytes().split(b"\n"):
        if not raw.strip():
            continue
        rec = _record(raw, n)
        if rec is None:
            skipped += 1
        elif ids.get(rec["problem"]) == (rec["id"], rec["fp"]):
            done.setdefault(rec["problem"], {}).setdefault(rec["sample"], rec)
    return done, skipped


def _append(fd: int, data: bytes) -> None:
    """Append ``data`` (whole lines) in one ``write``, after a newline when the file ends inside a
    torn line (so the first record does not join it), and sync it to disk."""
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":
        data = b"\n" + data
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)


def evaluate_benchmark(bench: Benchmark, problems: list[Problem], *, prompts: list, generator_factory: Callable[[], Any],
                       scorer: Callable[[list[Problem], list[str], list[str | None]], list[bool]], key: str,
                       cache_dir: Path, max_new_tokens: int, batch_size: int, seed: int = 0,
                       advance: Callable[[int], None] | None = None) -> dict:
    """Generate what ``CACHE/NAME-KEY.jsonl`` lacks, then score every problem's samples.
    ``scorer(problems, completions, extracted)`` returns one bool per completion.

    The (problem, sample) pairs, in order, are cut into batches of ``batch_size``; a batch with a
    sample missing is generated whole (its rows as in an uninterrupted run) and its missing samples
    are scored and appended. ``generated``: samples added to the file; ``samples_per_second``: the
    rate of the generator over every row it decoded."""
    proto = bench.protocol
    n = proto.samples
    cache_dir = check_cache_dir(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"{bench.name}-{key}.jsonl"
    if path.exists() and not path.is_file():
        raise ConfigError(f"benchmarks.cache_dir={cache_dir}: {path.name} there is not a file; move it away "
                          "(the benchmark's samples are written to it)")
    fps = [fingerprint(pr, p) for pr, p in zip(prompts, problems)]
    done, skipped = read_samples(path, problems, n, fps)
    reused = sum(len(done.get(p.index, {})) for p in problems)
    grid = [(k, j) for k in range(len(problems)) for j in range(n)]  # (position in problems, sample)
    per_batch = max(int(batch_size), 1)
    todo = sorted({g // per_batch for g, (k, j) in enumerate(grid) if j not in done.get(problems[k].index, {})})
    if advance is not None and reused:
        advance(reused)
    generator, loaded_before = None, 0.0
    t0, made, drawn = time.perf_counter(), 0, 0
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        for b in todo:
            cell = grid[b * per_batch:(b + 1) * per_batch]
            if generator is None:
                generator = generator_factory()
                loaded_before = getattr(generator, "load_seconds", 0.0)
            texts = generator.generate([prompts[k] for k, _ in cell], pairs=[problems[k].index * n + j for k, j in cell],
                                       temperature=proto.temperature, top_p=proto.top_p, max_new_tokens=max_new_tokens,
                                       seed=seed)
            drawn += len(cell)
            new = [(k, j, t) for (k, j), t in zip(cell, texts) if j not in done.get(problems[k].index, {})]
            new_p = [problems[k] for k, _, _ in new]
            extracted = [scoring.extract(bench.extract, t, p.labels) for p, (_, _, t) in zip(new_p, new)]
            correct = scorer(new_p, [t for _, _, t in new], extracted) if new else []
            lines = []
            for (k, j, t), p, e, c in zip(new, new_p, extracted, correct):
                rec = {"problem": p.index, "id": p.id, "fp": fps[k], "sample": j, "completion": t, "extracted": e,
                       "correct": bool(c)}
                done.setdefault(p.index, {})[j] = rec
                lines.append(json.dumps(rec) + "\n")
            if lines:
                _append(fd, "".join(lines).encode())
            made += len(lines)
            if advance is not None:
                advance(len(lines))
    finally:
        os.close(fd)
    load = (getattr(generator, "load_seconds", 0.0) - loaded_before) if generator is not None else 0.0
    seconds = time.perf_counter() - t0 - load
    correct = [[done[p.index][j]["correct"] for j in range(n)] for p in problems]
    votes = [[scoring.vote_key(done[p.index][j]["extracted"]) for j in range(n)] for p in problems]
    metrics = benchmark_metrics(proto.metrics, correct, votes, seed=seed)
    return {
        "name": bench.name, "title": bench.title, "source": bench.source, "split": bench.split, "problems": len(problems),
        "samples": n, "protocol": {"temperature": proto.temperature, "top_p": proto.top_p, "max_new_tokens": max_new_tokens},
        "metrics": {m: {k: v for k, v in d.items() if k != "per_problem"} for m, d in metrics.items()},
        "per_problem": {m: d["per_problem"] for m, d in metrics.items()},
        "samples_file": str(path), "generated": made, "reused": reused, "skipped_lines": skipped,
        "backend": getattr(generator, "name", None), "generation_seconds": round(seconds, 3), "load_seconds": round(load, 3),
        "samples_per_second": round(drawn / seconds, 3) if drawn and seconds > 0 else None,
        "cite": bench.cite,
    }


def make_scorer(bench: Benchmark, reward_fn=None) -> Callable[[list[Problem], list[str], list[str | None]], list[bool]]:
    """``scorer(problems, completions, extracted) -> [bool]`` for the benchmark's ``scorer``."""
    if bench.scorer == "reward":
        if reward_fn is None:
            raise ConfigError(f"benchmarks.{bench.name}.scorer=reward needs the run's reward; use a run directory or set reward=...")

        def by_reward(problems, completions, extracted):
            rows = [p.row for p in problems]
            kwargs = {k: [r.get(k) for r in rows] for k in rows[0] if k not in ("prompt", "completion")}
            scores = reward_fn(prompts=[r.get("prompt") for r in rows], completions=list(completions), **kwargs)
            return [s is not None and s >= 1.0 - 1e-6 for s in scores]

        return by_reward
    one = {"math_verify": None, "choice": scoring.choice_scorer, "exact": scoring.exact_scorer}[bench.scorer]
    if one is None:
        one = scoring.math_verify_scorer()
    return lambda problems, completions, extracted: [one(e, p.answer) for p, e in zip(problems, extracted)]
