"""Prefix-conditioned rollouts: the policy continues from a prefix of a solution.

Prefix-RFT, UFT and POPE continue from a prefix of the expert demonstration; PrefixRL
from one of the policy's own earlier successful completions. The prefix tokens join the
rollout's completion with provenance ``prefix`` (written, behaviour probability unknown:
no ratio may be taken on them); the tokens the policy sampled after them are ``on_policy``
and a forward of the trained row (prompt + prefix + continuation) sees exactly the context
they were sampled in. The group is scored as usual (the reward reads prefix +
continuation). By default no term trains on prefix tokens (PrefixRL, POPE: loss only on
sampled tokens); a term with ``tokens: [prefix]`` (nll, shaped) trains them (Prefix-RFT,
UFT). Held-out evaluation never sees a prefix: injections run only in training.
"""

from __future__ import annotations

import hashlib
import math
import random

import torch

from mixrl.core import provenance as prov
from mixrl.core.schedules import resolve_schedule
from mixrl.errors import ConfigError
from mixrl.sources.base import INJECTIONS, InjectContext, Injection

PREFIX = prov.register_provenance(
    "prefix", behaviour="unknown",
    description="a solution prefix the policy continued from (written, not sampled; no behaviour probability)",
).code

SAMPLES = ("fixed", "uniform", "binomial")


def prompt_key(prompt) -> int:
    """A stable 63-bit key of a prompt (text or messages), the same in every process."""
    return int.from_bytes(hashlib.blake2b(repr(prompt).encode(), digest_size=8).digest(), "big") >> 1


class PrefixLength:
    """How long a prefix is, per rollout: a fraction of the solution's tokens (a number, a
    ``[lo, hi]`` range or a schedule over steps) or a token count, drawn as ``sample`` says:

    * ``fixed``: l = round(f L);
    * ``uniform``: l = round(u L), u ~ U[lo, hi] (a single fraction f: U[0, f]) (Prefix-RFT);
    * ``binomial``: l ~ Binomial(L, f) (UFT's hint length, with f on a schedule decaying to 0).

    L is the solution's length in tokens; l is capped at L and at ``max_len - 1`` (the policy
    always samples at least one token).
    """

    def __init__(self, fraction=0.5, tokens=None, sample: str = "fixed", where: str = "algo.inject"):
        if sample not in SAMPLES:
            raise ConfigError(f"{where}.sample must be one of {', '.join(SAMPLES)}, got {sample!r}")
        self.sample, self.tokens = sample, tokens
        self.range = None
        self.fn = None
        if tokens is not None:
            t = list(tokens) if isinstance(tokens, (list, tuple)) else [tokens, tokens]
            if len(t) != 2 or any(int(x) < 0 for x in t) or int(t[0]) > int(t[1]):
                raise ConfigError(f"{where}.tokens must be a count >= 0 or a range [lo, hi], got {tokens!r}")
            self.tokens = (int(t[0]), int(t[1]))
            if sample == "binomial":
                raise ConfigError(f"{where}.sample=binomial draws a fraction; set {where}.fraction instead of tokens")
        elif isinstance(fraction, (list, tuple)):
            if len(fraction) != 2 or not 0.0 <= float(fraction[0]) <= float(fraction[1]) <= 1.0:
                raise ConfigError(f"{where}.fraction range must be [lo, hi] with 0 <= lo <= hi <= 1, got {list(fraction)}")
            if sample != "uniform":
                raise ConfigError(f"{where}.fraction is a range; it needs {where}.sample=uniform")
            self.range = (float(fraction[0]), float(fraction[1]))
        else:
            try:
                self.fn = resolve_schedule(fraction)
                v = self.fn(0)
            except (ValueError, TypeError, KeyError) as e:
                raise ConfigError(f"{where}.fraction: {str(e).splitlines()[0]}") from None
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"{where}.fraction must stay in [0, 1], got {v} at step 0")

    def fraction(self, step: int) -> float:
        """The configured fraction at ``step`` (the range's upper end for a range)."""
        return self.range[1] if self.range else min(max(float(self.fn(step)), 0.0), 1.0) if self.fn else math.nan

    def draw(self, rng: random.Random, solution_len: int, step: int, max_len: int) -> int:
        L = solution_len
        if self.tokens is not None:
            lo, hi = self.tokens
            n = lo if self.sample == "fixed" else rng.randint(lo, hi)
        elif self.range is not None:
            n = round(rng.uniform(*self.range) * L)
        else:
            f = self.fraction(step)
            if self.sample == "fixed":
                n = round(f * L)
            elif self.sample == "uniform":
                n = round(rng.uniform(0.0, f) * L)
            else:
                n = sum(rng.random() < f for _ in range(L))
        return max(0, min(n, L, max_len - 1))


def global_rows(ctx: InjectContext, n_local: int) -> list[int]:
    """Global index of each local row (TRL lays a group's rows out consecutively across processes)."""
    start = ctx.process_index * n_local
    return list(range(start, start + n_local))


def solution_ids(ctx: InjectContext, text: str) -> list[int]:
    """A written solution's token ids, without eos."""
    return list(ctx.tokenizer(text=text, add_special_tokens=False)["input_ids"])


@INJECTIONS.register("prefix", bounds={"per_group": (">= 0", "prefixed slots of each group")})
class PrefixCondition(Injection):
    """Rollouts continue from a prefix of the source's solution to the same prompt.

    In each group the first ``per_group`` rollouts (all when null) continue from a prefix
    whose length ``PrefixLength`` draws per rollout; the others are free. ``prompts: failed``
    prefixes only prompts whose unguided rollouts all failed the last time the prompt was
    seen (POPE's hard-only guidance); that memory is part of the injection's checkpointed
    state. ``prompts: hard`` prefixes only prompts the sampler's per-prompt history marks hard
    (``InjectContext.prompt_hard``: seen, estimated accuracy below ``sampler.hard_below``), so
    the sampler routes easy and hard prompts. Prompts without a solution stay free.

    Formula: y_i = (s_{<l_i}, y~_i), y~_i ~ pi_old(. | x, s_{<l_i}) for i < k = {per_group}; l_i = {sample}({fraction}) x |s|; prefix tokens: provenance prefix
    Paper: Prefix-RFT, "Blending Supervised and Reinforcement Fine-Tuning with Prefix Sampling" (arXiv 2507.01679); UFT, "UFT: Unifying Supervised and Reinforcement Fine-Tuning" (arXiv 2505.16984); POPE, "POPE: Learning to Reason on Hard Problems via Privileged On-Policy Exploration".

    Parameters:
        fraction (0.5): prefix length as a fraction of the solution's tokens: a number, a [lo, hi] range (sample=uniform) or a schedule.
        tokens (None): a token count (or [lo, hi]) instead of a fraction.
        sample (fixed): fixed | uniform | binomial (UFT: l ~ Binomial(|s|, fraction)).
        per_group (None): rollouts per group that get a prefix (the first k slots); null = all.
        prompts (all): all | failed (only prompts whose unguided rollouts all failed when last seen) | hard (only prompts the sampler's history marks hard).
        success (1.0): a rollout succeeds when its first reward function gives at least this.
    """

    provenances = ("prefix",)
    may_leave_untrained = ("prefix",)

    def __init__(self, *, fraction=0.5, tokens=None, sample: str = "fixed", per_group: int | None = None,
                 prompts: str = "all", success: float = 1.0, source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        self.length = PrefixLength(fraction, tokens, sample)
        if source is not None:
            source.requires_expert_column = True
        if prompts not in ("all", "failed", "hard"):
            raise ConfigError(f"algo.inject.prompts must be all, failed or hard, got {prompts!r}")
        G = geometry.num_generations if geometry is not None else None
        if per_group is not None and (int(per_group) < 0 or (G is not None and int(per_group) > G)):
            raise ConfigError(f"algo.inject.per_group={per_group} must be between 0 and num_generations={G} (or null: all)")
        self.per_group, self.prompts, self.success = per_group, prompts, float(success)
        self.failed: dict[int, bool] = {}  # prompt key -> its unguided rollouts all failed when last seen
        self._last: tuple[list[int], list[int]] | None = None  # (prompt keys, prefix lengths) of the local rows

    # ----------------------------------------------------------------- which rows, which prefix
    def wants_prefix(self, key: int, slot: int, num_generations: int, hard: bool = False) -> bool:
        k = num_generations if self.per_group is None else int(self.per_group)
        if slot >= k:
            return False
        if self.prompts == "hard":
            return hard
        return self.prompts == "all" or self.failed.get(key, False)

    def solutions(self, row: dict) -> list[str]:
        return self.source.for_prompt(row) if self.source is not None else []

    def generation_prefixes(self, ctx: InjectContext, inputs: list[dict]) -> list[list[int]]:
        G = ctx.num_generations
        prefixes, keys = [], []
        for i, g in zip(range(len(inputs)), global_rows(ctx, len(inputs))):
            key = prompt_key(inputs[i]["prompt"])
            keys.append(key)
            sols = self.solutions(inputs[i])
            hard = self.prompts == "hard" and ctx.prompt_hard is not None and ctx.prompt_hard(inputs[i])
            if not sols or not self.wants_prefix(key, g % G, G, hard):
                prefixes.append([])
                continue
            rng = random.Random(hash((self.seed, ctx.global_step, ctx.micro_step, g)))
            ids = solution_ids(ctx, sols[(g % G) % len(sols)])
            n = self.length.draw(rng, len(ids), ctx.global_step, ctx.max_completion_length)
            prefixes.append(ids[:n])
        self._last = (keys, [len(p) for p in prefixes])
        return prefixes

    # ----------------------------------------------------------------- memory and metrics
    def after_rewards(self, ctx: InjectContext, inputs: list[dict], rewards: torch.Tensor) -> torch.Tensor:
        if self._last is None or len(self._last[0]) != len(inputs):
            return rewards
        keys, lens = self._last
        self._last = None
        dev = rewards.device
        keys_g = ctx.gather(torch.tensor(keys, dtype=torch.long, device=dev)).tolist()
        lens_g = ctx.gather(torch.tensor(lens, dtype=torch.long, device=dev))
        ok = self._successes(ctx, rewards)
        prefixed = lens_g > 0
        G = ctx.num_generations
        groups = len(keys_g) // G
        for g in range(groups):
            rows = slice(g * G, (g + 1) * G)
            free = ~prefixed[rows]
            if bool(free.any()):  # what the policy does on its own (a fully prefixed group says nothing)
                self.failed[keys_g[g * G]] = not bool(ok[rows][free].any())
        if ctx.log is not None:
            ctx.log("prefix/groups", float(prefixed.view(groups, G).any(dim=1).float().mean()) if groups else 0.0)
            ctx.log("prefix/row_share", float(prefixed.float().mean()))
            if bool(prefixed.any()):
                ctx.log("prefix/mean_tokens", float(lens_g[prefixed].float().mean()))
                ctx.log("prefix/success", float(ok[prefixed].float().mean()))
            if bool((~prefixed).any()):
                ctx.log("prefix/free_success", float(ok[~prefixed].float().mean()))
            ctx.log("prefix/fraction", self.length.fraction(ctx.global_step) if self.length.tokens is None else math.nan)
        return rewards

    def _successes(self, ctx: InjectContext, rewards: torch.Tensor) -> torch.Tensor:
        """Per global row: did it succeed (first reward function >= ``success``)."""
        primary = ctx.primary_rewards if ctx.primary_rewards is not None else rewards
        return torch.nan_to_num(primary, nan=0.0) >= self.success - 1e-6

    def state_dict(self) -> dict:
        state = dict(super().state_dict())
        state["failed"] = {str(k): v for k, v in self.failed.items()}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict({k: v for k, v in state.items() if k != "failed"})
        self.failed = {int(k): bool(v) for k, v in (state.get("failed") or {}).items()}
