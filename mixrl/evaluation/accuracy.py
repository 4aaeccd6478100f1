"""Held-out evaluation: greedy accuracy (and sampled pass@k) of a model on a fixed split.

pass@k is estimated from ``n`` samples per problem with the unbiased estimator of
"Evaluating Large Language Models Trained on Code" (Chen et al., 2021, arXiv:2107.03374):
for a problem with ``c`` correct samples out of ``n``, ``pass@k = 1 - C(n - c, k) / C(n, k)``,
averaged over problems (:func:`pass_at_k`). With ``n == k`` it is the fraction of problems
solved by at least one of the k samples.

The completions come from :mod:`mixrl.evaluation.generate` (the one batched HF ``generate`` loop),
or from an acting generator (:mod:`mixrl.evaluation.acting`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

from mixrl.evaluation.generate import EvaluationInterrupted, generate_completions  # noqa: F401  (re-exported: callers and tests import them from here)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` correct samples out of ``n`` (``k <= n``):
    ``1 - C(n - c, k) / C(n, k)``, computed as ``1 - prod_{i=n-c+1..n} (1 - k / i)``
    (Chen et al., 2021), which needs no large binomials."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_at_k_ks(samples: int, pass_k: int = 0, ks: Sequence[int] = ()) -> list[int]:
    """The k values reported for ``samples`` samples per problem: ``ks`` and ``pass_k`` that are <= samples."""
    return sorted({int(k) for k in (*ks, pass_k) if 1 <= int(k) <= samples})


def evaluate_accuracy(
    model,
    tokenizer,
    rows: Sequence[dict],
    reward_fn: Callable,
    *,
    max_new_tokens: int,
    batch_size: int = 128,
    pass_k: int = 0,
    samples: int = 0,
    ks: Sequence[int] = (),
    temperature: float = 1.0,
    progress: Callable[[int], None] | None = None,
    examples: list | None = None,
    stop: Callable[[], bool] | None = None,
    generate: Callable | None = None,
) -> dict[str, float]:
    """Greedy accuracy (reward >= 1) on ``rows`` (each with ``prompt`` and ``answer``), per
    ``level`` when rows carry one, and sampled pass@k.

    Sampling draws ``n = max(samples, pass_k)`` completions per problem (none when both are
    0) and reports ``pass@k`` for ``pass_k`` and every k of ``ks`` with k <= n (unbiased
    estimator, :func:`pass_at_k`), overall and per level (``pass@8/level5``), and
    ``sampled_accuracy`` (the mean reward of all samples, = pass@1).

    ``examples``: a list that receives one dict per row of the greedy pass (``prompt``,
    ``completion``, ``reward``, ``correct``, ``answer``), what ``samples.jsonl`` shows.

    ``stop``: a zero-argument callable asked between batches (and tokens, see
    :func:`generate_completions`); when it returns True the evaluation raises
    :class:`EvaluationInterrupted` within one batch (one token in a single process), so a
    SIGTERM during a long evaluation stops the run in seconds.

    ``generate``: the rollout that acts (:func:`mixrl.evaluation.acting.acting_generator`: the tool
    loop for ``env=tools``, a stateful environment's episodes), called as ``generate(model,
    tokenizer, rows, max_new_tokens=, batch_size=, do_sample=, temperature=,
    num_return_sequences=, progress=, stop=)`` -> completions per row; None: one completion
    (:func:`generate_completions`)."""
    prompts = [r["prompt"] for r in rows]
    kwargs = {k: [r[k] for r in rows] for k in rows[0] if k not in ("prompt", "completion")} if rows else {}
    if generate is None:
        def generate(model, tokenizer, rows, **kw):
            return generate_completions(model, tokenizer, [r["prompt"] for r in rows], **kw)
    greedy = [c[0] for c in generate(model, tokenizer, rows, max_new_tokens=max_new_tokens, batch_size=batch_size,
                                     progress=progress, stop=stop)]
    scores = reward_fn(prompts=prompts, completions=greedy, **kwargs)
    correct = [float(s is not None and s >= 1.0 - 1e-6) for s in scores]
    result = {"accuracy": sum(correct) / max(len(correct), 1), "n": float(len(correct))}
    if examples is not None:
        examples.extend({"prompt": p, "completion": getattr(c, "text", c), "reward": s, "correct": bool(k), "answer": r.get("answer")}
                        for p, c, s, k, r in zip(prompts, greedy, scores, correct, rows))
    levels = [int(r["level"]) for r in rows] if rows and "level" in rows[0] else None
    if levels is not None:
        by_level: dict[int, list[float]] = defaultdict(list)
        for level, c in zip(levels, correct):
            by_level[level].append(c)
        for level, cs in sorted(by_level.items()):
            result[f"accuracy/level{level}"] = sum(cs) / len(cs)
    n = max(int(samples), int(pass_k))
    if n > 0 and rows:
        draws = generate(
            model, tokenizer, rows, max_new_tokens=max_new_tokens, batch_size=max(batch_size // n, 1),
            do_sample=True, temperature=temperature, num_return_sequences=n, stop=stop,
        )
        flat_prompts = [p for p in prompts for _ in range(n)]
        flat_kwargs = {k: [v for v in vs for _ in range(n)] for k, vs in kwargs.items()}
        flat = reward_fn(prompts=flat_prompts, completions=[c for cs in draws for c in cs], **flat_kwargs)
        hits = [sum(1 for s in flat[i * n : (i + 1) * n] if (s or 0) >= 1.0 - 1e-6) for i in range(len(rows))]
        groups: dict[str, list[int]] = {"": list(range(len(rows)))}
        if levels is not None:
            for i, level in enumerate(levels):
                groups.setdefault(f"/level{level}", []).append(i)
        for k in pass_at_k_ks(n, pass_k, ks):
            for suffix, idx in sorted(groups.items(), key=lambda kv: (kv[0] != "", kv[0])):
                result[f"pass@{k}{suffix}"] = sum(pass_at_k(n, hits[i], k) for i in idx) / len(idx)
        result["sampled_accuracy"] = sum(hits) / (n * len(rows))
        result["samples"] = float(n)
    return result
