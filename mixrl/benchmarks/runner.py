"""Generate a benchmark's samples, streamed to a JSONL file that resumes, then score them.

Each benchmark's samples go to ``CACHE/benchmarks/NAME-KEY.jsonl``, one line per sample (problem
index, id and fingerprint of prompt + gold answer, sample number, completion, extracted answer,
correct), appended and flushed batch by batch as they are produced. ``KEY`` hashes what the samples depend on: the
model folder (path, and the size and modification time of its files,
:func:`mixrl.evaluation.cache._model_fingerprint`), its dtype, the benchmark's source, columns,
prompt, system prompt and protocol (samples, temperature, top-p, new tokens) and the sampling
seed. An interrupted evaluation therefore starts again where it stopped (finished problems are
read back, not regenerated), and a finished one loads no model at all. ``benchmarks.limit``
takes the first N problems of the same file, so a short check is the start of the full run.

Generation: :class:`HFGenerator` (HF ``generate``, left-padded batches, the tokenizer's special
tokens for plain prompts as TRL adds them) or :class:`VLLMGenerator` (vLLM's offline engine on
the saved folder; tensor parallel over the visible GPUs, the CPU build on CPU). Sampling is
seeded per batch from (seed, first problem of the batch), so a resumed batch draws what it
would have drawn.
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
from mixrl.benchmarks.metrics import benchmark_metrics
from mixrl.benchmarks.spec import Benchmark
from mixrl.errors import ConfigError
from mixrl.evaluation.cache import _model_fingerprint
from mixrl.models.tiny_spec import cache_root


def default_cache_dir() -> Path:
    return Path(cache_root()) / "benchmarks"


def samples_key(bench: Benchmark, *, model_path: str, dtype: str, system_prompt: str | None, seed: int) -> str:
    payload = {"model": _model_fingerprint(model_path), "dtype": dtype, "bench": bench.key_payload(),
               "system": system_prompt, "seed": seed}
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
    """Batched HF ``generate`` (greedy at temperature 0, else sampling with top-p)."""

    name = "hf"

    def __init__(self, load: Callable[[], Any], tokenizer, *, batch_size: int):
        self._load, self.tokenizer, self.batch_size = load, tokenizer, int(batch_size)
        self.model = None
        self.load_seconds = 0.0  # loading the model (reported apart from generation)

    def generate(self, prompts: list, *, n: int, temperature: float, top_p: float, max_new_tokens: int,
                 seed: int) -> list[list[str]]:
        if self.model is None:
            t0 = time.perf_counter()
            self.model = self._load()
            self.model.eval()
            self.load_seconds += time.perf_counter() - t0
        tok, device = self.tokenizer, next(self.model.parameters()).device
        side, tok.padding_side = tok.padding_side, "left"
        plain = isinstance(prompts[0], str)
        texts = [p if isinstance(p, str) else tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
                 for p in prompts]
        try:
            torch.manual_seed(seed)
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=plain).to(device)
            sample = temperature > 0
            with torch.no_grad():
                gen = self.model.generate(
                    **enc, max_new_tokens=max_new_tokens, do_sample=sample, temperature=temperature if sample else None,
                    top_p=top_p if sample else None, top_k=None, num_return_sequences=n,
                    pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                )
        finally:
            tok.padding_side = side
        out = tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        return [out[i * n:(i + 1) * n] for i in range(len(prompts))]


class VLLMGenerator:
    """vLLM's offline engine on the saved model folder (``LLM.generate`` with ``SamplingParams``)."""

    name = "vllm"

    def __init__(self, model_path: str, tokenizer, *, dtype: str, max_model_len: int | None = None):
        self.model_path, self.tokenizer, self.dtype, self.max_model_len = model_path, tokenizer, dtype, max_model_len
        self.llm = None
        self.load_seconds = 0.0  # starting the engine (reported apart from generation)

    def generate(self, prompts: list, *, n: int, temperature: float, top_p: float, max_new_tokens: int,
                 seed: int) -> list[list[str]]:
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
        params = [SamplingParams(n=n, temperature=temperature, top_p=top_p if temperature > 0 else 1.0,
                                 max_tokens=min(max_new_tokens, context - len(x)), seed=seed) for x in ids]
        outs = self.llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False)
        return [[o.text for o in r.outputs] for r in outs]


def fingerprint(prompt: Any, problem: Problem) -> str:
    """What a sample was drawn for: the prompt as generated and the gold answer (a changed row, or
    another built-in split, never reuses a sample)."""
    return hashlib.sha256(json.dumps([prompt, problem.answer], sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_samples(path: Path, problems: list[Problem], n: int, fps: list[str]) -> dict[int, list[dict]]:
    """The samples already in ``path`` for these problems (same index, id and fingerprint; a torn
    last line is ignored)."""
    ids = {p.index: (p.id, fp) for p, fp in zip(problems, fps)}
    done: dict[int, list[dict]] = {}
    if not path.is_file():
        return done
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut by an interruption
        i = rec.get("problem")
        if ids.get(i) == (rec.get("id"), rec.get("fp")) and rec.get("sample", n) < n:
            done.setdefault(i, [])
            if all(r["sample"] != rec["sample"] for r in done[i]):
                done[i].append(rec)
    return {i: sorted(rs, key=lambda r: r["sample"]) for i, rs in done.items()}


def evaluate_benchmark(bench: Benchmark, problems: list[Problem], *, prompts: list, generator_factory: Callable[[], Any],
                       scorer: Callable[[list[Problem], list[str], list[str | None]], list[bool]], key: str,
                       cache_dir: Path, max_new_tokens: int, batch_size: int, seed: int = 0,
                       advance: Callable[[int], None] | None = None) -> dict:
    """Generate what ``CACHE/NAME-KEY.jsonl`` lacks, then score every problem's samples.
    ``scorer(problems, completions, extracted)`` returns one bool per completion."""
    proto = bench.protocol
    n = proto.samples
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"{bench.name}-{key}.jsonl"
    fps = [fingerprint(pr, p) for pr, p in zip(prompts, problems)]
    done = read_samples(path, problems, n, fps)
    reused = sum(len(v) for v in done.values())
    todo = [k for k, p in enumerate(problems) if len(done.get(p.index, [])) < n]
    if advance is not None and reused:
        advance(min(reused, len(problems) * n))
    per_batch = max(batch_size // n, 1)
    generator, loaded_before = None, 0.0
    t0, made = time.perf_counter(), 0
    with open(path, "a") as fh:
        for start in range(0, len(todo), per_batch):
            chunk = todo[start:start + per_batch]
            if generator is None:
                generator = generator_factory()
                loaded_before = getattr(generator, "load_seconds", 0.0)
            texts = generator.generate([prompts[k] for k in chunk], n=n, temperature=proto.temperature, top_p=proto.top_p,
                                       max_new_tokens=max_new_tokens, seed=seed * 1_000_003 + problems[chunk[0]].index)
            flat_p = [problems[k] for k in chunk for _ in range(n)]
            flat_fp = [fps[k] for k in chunk for _ in range(n)]
            flat_t = [t for ts in texts for t in ts]
            extracted = [scoring.extract(bench.extract, t, p.labels) for p, t in zip(flat_p, flat_t)]
            correct = scorer(flat_p, flat_t, extracted)
            for j, (p, fp, t, e, c) in enumerate(zip(flat_p, flat_fp, flat_t, extracted, correct)):
                rec = {"problem": p.index, "id": p.id, "fp": fp, "sample": j % n, "completion": t, "extracted": e,
                       "correct": bool(c)}
                done.setdefault(p.index, [])
                if len(done[p.index]) < n and all(r["sample"] != rec["sample"] for r in done[p.index]):
                    done[p.index].append(rec)
                    fh.write(json.dumps(rec) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
            made += len(flat_t)
            if advance is not None:
                advance(len(flat_t))
    load = (getattr(generator, "load_seconds", 0.0) - loaded_before) if generator is not None else 0.0
    seconds = time.perf_counter() - t0 - load
    correct = [[r["correct"] for r in sorted(done[p.index], key=lambda r: r["sample"])] for p in problems]
    votes = [[scoring.vote_key(r["extracted"]) for r in sorted(done[p.index], key=lambda r: r["sample"])] for p in problems]
    metrics = benchmark_metrics(proto.metrics, correct, votes, seed=seed)
    return {
        "name": bench.name, "title": bench.title, "source": bench.source, "split": bench.split, "problems": len(problems),
        "samples": n, "protocol": {"temperature": proto.temperature, "top_p": proto.top_p, "max_new_tokens": max_new_tokens},
        "metrics": {m: {k: v for k, v in d.items() if k != "per_problem"} for m, d in metrics.items()},
        "per_problem": {m: d["per_problem"] for m, d in metrics.items()},
        "samples_file": str(path), "generated": made, "reused": reused,
        "backend": getattr(generator, "name", None), "generation_seconds": round(seconds, 3), "load_seconds": round(load, 3),
        "samples_per_second": round(made / seconds, 3) if made and seconds > 0 else None,
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
