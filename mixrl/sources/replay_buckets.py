"""Success-rate buckets: how ExGRPO draws the questions it revisits from its experience pool.

ExGRPO ("ExGRPO: Learning to Reason from Experience", arXiv 2510.02245), as its code runs
(ElliottYan/LUFFY ExGRPO/ at 01f4ae066249e6965ce0d5512ccdf99a12895c74, mix_src/experience/):

* a question's bucket is its latest number of successes k of the G rollouts of its group (the
  replayed row counted), written each time its group is admitted to the pool (0 < k <= 7 of 8:
  experience_trainer_ops.py:39-44, experience_bucket_manager.py:30-63);
* a bucket weighs w(k); ``exp_bucket_manager=normal`` (exp_scripts/run_exgrpo.sh:32) is the normal
  density centred on G/2 with sigma 1, w(k) = exp(-(k - G/2)^2 / 2) / sqrt(2 pi)
  (weighted_bucket_sampler.py:26-31, 47-48); ``linear`` k / G, ``sqrt`` sqrt(k / G), ``linear_clip``
  min(k / G, 1/2) (:33-40, 45-52); the non-empty buckets are drawn with p_k = w(k) / sum w (:56-67);
* n questions (n = min(pool questions, int(batch * experience_ratio)), experience_collate_fn.py:131-135):
  counts per bucket ~ Multinomial(n, p); a bucket given more than it holds gives all it holds, and
  each missing draw goes, one at a time, to a bucket with room drawn by p renormalised over them
  (:103-147); within a bucket the questions are drawn uniformly without replacement (:149-168).

:func:`bucket_draw` is that rule with the source's own generator (the multinomial as n categorical
draws, the same distribution). Pure Python.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable

from mixrl.errors import ConfigError

#: the bucket weightings of the authors' sampler (weighting_method)
BUCKET_WEIGHTS = ("normal", "linear", "sqrt", "linear_clip")


def check_buckets(buckets: str | None) -> str | None:
    """``buckets`` as configured (None: no buckets, questions in the sampling rule's order)."""
    if buckets is not None and buckets not in BUCKET_WEIGHTS:
        raise ConfigError(f"offpolicy.source.buckets={buckets!r} is not one of {', '.join(BUCKET_WEIGHTS)} or null; "
                          "fix offpolicy.source.buckets")
    return buckets


def bucket_weight(k: int, group: int, method: str) -> float:
    """The authors' weight w(k) of the bucket of questions solved k of ``group`` times."""
    if method == "normal":
        return math.exp(-((k - group / 2) ** 2) / 2.0) / math.sqrt(2.0 * math.pi)
    if method == "linear":
        return k / group
    if method == "sqrt":
        return math.sqrt(k / group)
    if method == "linear_clip":
        return 0.5 if k > group / 2 else k / group
    raise ConfigError(f"offpolicy.source.buckets={method!r} is not one of {', '.join(BUCKET_WEIGHTS)}")


def bucket_probabilities(sizes: dict[int, int], group: int, method: str) -> dict[int, float]:
    """p_k = w(k) / sum of w over the non-empty buckets (``sizes``: bucket -> questions)."""
    weights = {k: bucket_weight(k, group, method) for k, size in sizes.items() if size > 0}
    total = sum(weights.values())
    if total <= 0.0:
        return {}
    return {k: w / total for k, w in weights.items()}


def _choose(keys: list[int], probs: list[float], rng: random.Random) -> int:
    total = sum(probs)
    u, acc = rng.random() * total, 0.0
    for k, p in zip(keys, probs):
        acc += p
        if u < acc:
            return k
    return keys[-1]


def bucket_draw(buckets: dict[int, list[Hashable]], n: int, group: int, method: str,
                rng: random.Random) -> list[Hashable]:
    """Up to ``n`` distinct questions of ``buckets`` (k -> questions) by the authors' rule (module
    docstring); an empty list when every bucket is empty or weighs 0."""
    live = {k: list(v) for k, v in sorted(buckets.items()) if v}
    probs = bucket_probabilities({k: len(v) for k, v in live.items()}, group, method)
    live = {k: v for k, v in live.items() if probs.get(k, 0.0) > 0.0}
    if n <= 0 or not live:
        return []
    keys = list(live)
    counts = dict.fromkeys(keys, 0)
    for _ in range(n):  # Multinomial(n, p)
        counts[_choose(keys, [probs[k] for k in keys], rng)] += 1
    excess = 0
    for k in keys:  # a bucket gives at most what it holds
        if counts[k] > len(live[k]):
            excess += counts[k] - len(live[k])
            counts[k] = len(live[k])
    while excess > 0:  # the missing draws, one at a time, to buckets with room (p renormalised)
        room = [k for k in keys if counts[k] < len(live[k])]
        if not room:
            break
        counts[_choose(room, [probs[k] for k in room], rng)] += 1
        excess -= 1
    out: list[Hashable] = []
    for k in keys:
        out.extend(live[k] if counts[k] >= len(live[k]) else rng.sample(live[k], counts[k]))
    return out
