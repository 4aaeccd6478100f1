"""SOUP's single-sample token-level mix: a historical policy's prefix, continued on-policy.

"SOUP: Token-level Single-sample Mix-policy Reinforcement Learning for Large Language Models".
What its abstract fixes: off- and on-policy learning are mixed *within* one sample at the token
level; the prefix of a generated sequence is sampled from historical policies and the
continuation on-policy; token-level importance ratios keep training stable.

Our reading, in mixrl's pieces: the historical policies are the policy's own earlier versions,
whose rollouts the ``replay`` source keeps with the per-token log-probs they were sampled with.
In each group, the last ``per_group`` rollouts continue from a prefix (a fraction drawn in
``[prefix_min, prefix_max]`` of its tokens) of a stored rollout of the same prompt, at least
``min_age`` steps old; the prefix tokens carry provenance ``historical`` (behaviour ``stored``:
the recorded log-probs of the policy version that sampled them), the continuation stays
``on_policy``. A policy term over ``[on_policy, historical]`` then takes each token's ratio
against its own behaviour, ``pi_theta / pi_hist`` on the prefix and ``pi_theta / pi_old`` on the
continuation, with one advantage per row (the whole sequence is scored; the row shares its
group). So that a stored rollout of the prompt exists, a share ``revisit`` of each step's groups
is drawn from prompts the buffer holds (as ReplayFill's revisit, any stored rollout, not only
successes). Rows continued from a prefix are never recorded into the buffer (their prefix was
not sampled by the policy that continued it) and are held out of the unguided ``accuracy``.

The module's name sorts after ``teacher``, so ``historical`` is registered after every other
source's provenance and no existing code changes.
"""

from __future__ import annotations

import random

import torch

from mixrl.core import provenance as prov
from mixrl.errors import ConfigError
from mixrl.sources.base import INJECTIONS, InjectContext, Rollouts
from mixrl.sources.replay import ReplaySource
from mixrl.sources.replay_inject import _ReplayInjection

HISTORICAL = prov.register_provenance(
    "historical", behaviour="stored",
    description="a prefix of a rollout an earlier policy version sampled (replay buffer), continued on-policy; "
                "its tokens keep the log-probs they were sampled with",
).code


def cut_length(n_tokens: int, fraction: float, max_len: int) -> int:
    """Prefix length of a stored completion of ``n_tokens``: ``round(fraction * n)``, at least
    1, at most ``n - 1`` (a prefix is never the whole completion) and ``max_len - 1`` (the
    policy samples at least one token); 0 when the completion has fewer than 2 tokens."""
    if n_tokens < 2 or max_len < 2:
        return 0
    return max(1, min(round(fraction * n_tokens), n_tokens - 1, max_len - 1))


@INJECTIONS.register("historical_prefix", bounds={
    "per_group": (">= 1", "slots of each group continued from a historical prefix"),
    "prefix_min": ("(0, 1)", "a fraction of the stored completion"),
    "prefix_max": ("(0, 1)", "a fraction of the stored completion"),
    "min_age": (">= 1", "steps: a prefix of this step's own rollouts is not historical"),
    "revisit": ("[0, 1]", "a share of each step's groups"),
})
class HistoricalPrefix(_ReplayInjection):
    """SOUP: the last ``per_group`` rollouts of a group continue from a prefix of a past rollout
    of the same prompt (an earlier policy version's, from the replay buffer); prefix tokens keep
    their recorded log-probs (provenance historical), the continuation is on-policy.

    Formula: y = (h_<n ~ pi_hist, y_>=n ~ pi_old(. | x, h_<n)), n = round(u |h|), u ~ U[{prefix_min}, {prefix_max}], k = {per_group} per group; a policy term over [on_policy, historical] takes r_t = p_t / pi_hist(h_t) on the prefix and p_t / pi_old(y_t) on the continuation
    Paper: SOUP, "SOUP: Token-level Single-sample Mix-policy Reinforcement Learning for Large Language Models": the historical prefix, on-policy continuation and token-level ratios are the abstract's; the replay buffer as the historical policies, the prefix length draw and the revisited prompts are our reading.

    Parameters:
        per_group (4): rollouts of each group continued from a historical prefix, between 1 and num_generations - 1.
        prefix_min (0.2): smallest prefix, as a fraction of the stored completion's tokens.
        prefix_max (0.8): largest prefix, as a fraction of the stored completion's tokens.
        min_age (1): the stored rollout was sampled at least this many steps ago.
        revisit (0.5): share of each step's groups whose prompt is drawn from those the buffer holds.
    """

    provenances = ("historical",)

    def __init__(self, *, per_group: int = 4, prefix_min: float = 0.2, prefix_max: float = 0.8, min_age: int = 1,
                 revisit: float = 0.5, source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        if geometry is not None and not 1 <= per_group < geometry.num_generations:
            raise ConfigError(
                f"algo.inject.per_group={per_group} must be between 1 and num_generations-1={geometry.num_generations - 1}"
            )
        if not prefix_min <= prefix_max:
            raise ConfigError(f"algo.inject.prefix_min={prefix_min} must not exceed algo.inject.prefix_max={prefix_max}")
        self.per_group, self.min_age, self.revisit = int(per_group), int(min_age), float(revisit)
        self.prefix_min, self.prefix_max = float(prefix_min), float(prefix_max)
        self._pending: list[list[float] | None] | None = None

    # ----------------------------------------------------------------- prompts the buffer holds
    def before_generation(self, ctx: InjectContext, inputs: list[dict]) -> list[dict]:
        """The last ``revisit`` share of the groups lying wholly on this process get prompts
        drawn from the buffer (one stored rollout old enough per prompt) whose rows it remembers."""
        return self._revisit(ctx, inputs, "soup")

    def _revisit_candidate(self, entry) -> bool:
        """A stored rollout long enough to cut a prefix from (any outcome)."""
        return len(entry.completion) >= 2

    # ----------------------------------------------------------------- prefixes
    def generation_prefixes(self, ctx: InjectContext, inputs: list[dict]) -> list[list[int]]:
        self._seed(ctx)
        G, n = ctx.num_generations, len(inputs)
        start = ctx.process_index * n
        prompt_ids = ctx.tokenize_prompts([r["prompt"] for r in inputs]) if inputs else []
        prefixes: list[list[int]] = []
        pending: list[list[float] | None] = []
        for i in range(n):
            g = start + i
            stored = []
            if g % G >= G - self.per_group:
                stored = [e for e in self.source.buffer.for_prompt(prompt_ids[i])
                          if ctx.global_step - e.step >= self.min_age and len(e.completion) >= 2]
            if not stored:
                prefixes.append([])
                pending.append(None)
                continue
            rng = random.Random(hash((self.seed, ctx.global_step, ctx.micro_step, g)))
            e = stored[rng.randrange(len(stored))]
            k = cut_length(len(e.completion), rng.uniform(self.prefix_min, self.prefix_max), ctx.max_completion_length)
            prefixes.append(list(e.completion[:k]))
            pending.append(list(e.logp[:k]) if k else None)
        self._pending = pending
        rows = [p for p in pending if p]
        self.metrics["soup/prefixed_rows"] = float(len(rows))
        self.metrics["soup/prefix_tokens"] = float(sum(len(p) for p in rows) / len(rows)) if rows else 0.0
        return prefixes

    def after_generation(self, ctx: InjectContext, inputs: list[dict], rollouts: Rollouts) -> Rollouts:
        """The prefix tokens become ``historical`` with their recorded log-probs."""
        pending, self._pending = self._pending, None
        if pending is None or len(pending) != len(rollouts.completion_ids):
            return rollouts
        prefix_code = prov.code("prefix")
        for i, lp in enumerate(pending):
            ts = rollouts.token_source[i]
            if not lp or ts is None:
                continue
            k = sum(1 for c in ts if c == prefix_code)
            rollouts.token_source[i] = [HISTORICAL if c == prefix_code else c for c in ts]
            rollouts.behaviour_logp[i] = list(lp[:k])
        return rollouts

    # ----------------------------------------------------------------- memory
    def after_advantages(self, ctx: InjectContext, inputs: list[dict], out: dict) -> dict:
        if self.revisit > 0.0 and isinstance(self.source, ReplaySource):
            self.source.remember_rows(out, inputs)
        return out

    def after_forward(self, ctx: InjectContext, inputs: dict, old_logp: torch.Tensor) -> None:
        """Record only rows the policy sampled whole: a prefixed row's prefix is not its own."""
        mixed = (inputs["token_source"] == HISTORICAL).any(-1)
        if bool(mixed.any()):
            inputs = dict(inputs)
            inputs["row_source"] = inputs["row_source"].masked_fill(mixed, -1)
        super().after_forward(ctx, inputs, old_logp)
