"""The ``replay`` source: a buffer of the policy's own past rollouts, and the injections that
reuse them (ReMix's appended rows, RePO's refilled groups, ExGRPO-style kept successes).

What is stored, per rollout (one entry): the prompt and completion token ids, its reward,
its advantage and its group's reward mean and standard deviation when it was scored, the
optimizer step it was generated at, and the **per-token log-probs of the policy that
sampled it** (its behaviour log-probs). Replayed tokens carry provenance ``replay``
(behaviour ``stored``): every term that takes a ratio on them divides by those stored
log-probs, never by the current policy's.

How the behaviour log-probs are recorded (no extra forward): the trainer hands every
injection, on the **first** optimisation pass over a generation batch, the log-probs the
policy term itself uses as the rollouts' behaviour, ``old_logp``:

* TRL's ``old_per_token_logps`` when it computed them (``num_iterations > 1``, misaligned
  accumulation, vLLM): a no-grad forward of the weights that generated the batch, run right
  after generation;
* otherwise the detached log-probs of the loss forward. With ``num_iterations == 1`` and one
  generation per optimizer step (mixrl's geometry) every micro-batch of the step is
  forwarded before the optimizer moves the weights, so these *are* the sampling policy's
  log-probs (the same reasoning that lets TRL skip ``old_per_token_logps``);
* with ``trainer.staleness = k``: the lagged policy's log-probs (a no-grad forward of the
  lagged weights that generated the batch).

These are the log-probs of the trainer's forward at the sampling temperature; they equal the
sampling distribution exactly for transformers generation with ``top_p = 1`` (and up to the
kernels' numerical mismatch with vLLM). ``tests/test_replay.py`` checks that stored values
equal a direct forward of the policy that sampled them.

Buffer policy (all config values of the source): ``capacity``; ``eviction`` when full:
``fifo`` (oldest first), ``keep_successes`` (oldest failure first; successes stay while a
failure is left) or ``age`` (``fifo`` plus dropping every entry older than ``max_age``
steps); ``store``: ``all`` or ``successes`` (reward >= ``success_threshold``);
``sampling``: ``uniform``, ``recent`` (newest first), ``variance`` (weight = group reward
std + eps: rows of groups that carried a signal) or ``failure`` (weight = 1 - group mean
reward + eps: prompts the policy failed); ``trajectory``: which stored rollouts of a prompt
fill its group, ``sampling`` (the sampling rule) or ``lowest_nll`` (lowest mean -log pi_b of
the stored tokens); ``drop_mastered``: a prompt solved by its whole group leaves the buffer for
good. Draws use the source's own seeded generator;
``state_dict`` holds contents and generator state, saved with each checkpoint
(``torch.save``, one file per process: see the trainer).

The buffer is :mod:`mixrl.sources.replay_buffer`, the injections :mod:`mixrl.sources.replay_inject`;
this module holds the provenance and the source that records rollouts into the buffer.
"""

from __future__ import annotations

import torch

from mixrl.core import provenance as prov
from mixrl.errors import ConfigError
from mixrl.sources.base import SOURCES, InjectContext, Source
from mixrl.sources.replay_buckets import check_buckets
from mixrl.sources.replay_buffer import Entry, ReplayBuffer

#: how the rollouts that fill a prompt's group are chosen among its stored ones
TRAJECTORIES = ("sampling", "lowest_nll")

REPLAY = prov.register_provenance(
    "replay", behaviour="stored",
    description="a past rollout of the policy, replayed from the buffer; behaviour log-probs recorded when it was sampled",
).code


@SOURCES.register("replay", bounds={"capacity": (">= 1", "rollouts the buffer holds"), "max_age": (">= 0", "steps")})
class ReplaySource(Source):
    """The policy's own past rollouts, each with the per-token log-probs it was sampled with.

    Formula: B = {(x, y, R, A, log pi_b(y_t), step)}: rollouts of earlier steps; provenance replay (behaviour stored)
    Paper: experience replay for LLM RL as in ReMix ("Squeeze the Soaked Sponge: Efficient Off-policy Reinforcement Finetuning for Large Language Model", arXiv 2507.06892), RePO ("RePO: Replay-Enhanced Policy Optimization") and ExGRPO ("ExGRPO: Learning to Reason from Experience", arXiv 2510.02245).

    Parameters:
        capacity (1024): rollouts kept (per process).
        eviction (fifo): fifo | keep_successes | age (fifo plus entries older than max_age steps dropped).
        max_age (None): with eviction=age, the oldest step difference kept.
        store (all): all | successes (only rollouts with reward >= success_threshold).
        success_threshold (1.0): reward from which a rollout counts as a success.
        sampling (uniform): uniform | recent (newest first) | variance (by group reward std) | failure (by 1 - group mean reward).
        seed (None): the sampling generator's seed (default: the run's seed + 1).
        admit (None): [lo, hi]: a rollout is stored only when its group had between lo and hi successes
            (inclusive, reward >= success_threshold, the replayed row counted) at the step it was scored;
            ExGRPO's experience_lbound=0 / experience_rbound=7 of 8 is [1, 7]. None: any group.
        trajectory (sampling): which stored rollouts of a prompt fill its group: sampling (the sampling rule's
            order) | lowest_nll (the lowest mean negative stored log-prob, -1/n sum_t log pi_b(y_t), oldest first
            on ties: a one-sample estimate of the sampling policy's mean token entropy along the rollout;
            ExGRPO replays the lowest-entropy success, exp_metric=ent, exp_select_mode=argmin).
        drop_mastered (False): a prompt whose group is solved G of G (the replayed row counted) is mastered:
            its stored rollouts are deleted and it is never stored or revisited again (ExGRPO's skip set).
        buckets (None): how revisited prompts are drawn: None (the sampling rule's order, one per prompt) |
            normal | linear | sqrt | linear_clip: ExGRPO's success-rate buckets (a prompt's bucket is its
            latest admitted group's successes k; buckets weighed w(k), normal: exp(-(k - G/2)^2 / 2);
            mixrl.sources.replay_buckets).
    """

    provenances = ("replay",)

    def __init__(self, *, capacity: int = 1024, eviction: str = "fifo", max_age: int | None = None, store: str = "all",
                 success_threshold: float = 1.0, sampling: str = "uniform", seed: int | None = None,
                 admit: list | tuple | None = None, trajectory: str = "sampling", drop_mastered: bool = False,
                 buckets: str | None = None):
        self.seed = seed
        self.buckets = check_buckets(buckets)
        #: prompt (token-id tuple) -> its latest admitted group's successes (the bucket; with ``buckets``)
        self.bucket_of: dict[tuple, int] = {}
        if trajectory not in TRAJECTORIES:
            raise ConfigError(f"offpolicy.source.trajectory={trajectory!r} is not one of {', '.join(TRAJECTORIES)}; "
                              "fix offpolicy.source.trajectory")
        self.trajectory = trajectory
        self.drop_mastered = bool(drop_mastered)
        #: prompts (token-id tuples) solved by a whole group (drop_mastered): never stored or revisited again
        self.mastered: set[tuple] = set()
        self.admit = _admit_range(admit)
        #: (step, successes per global group) of the step last scored (set by the replay injections)
        self.group_successes: tuple[int, list[int]] | None = None
        self.buffer = ReplayBuffer(capacity=int(capacity), eviction=eviction, max_age=max_age, store=store,
                                   success_threshold=float(success_threshold), sampling=sampling,
                                   seed=0 if seed is None else int(seed))
        self.recorded_step = -1
        self.rows: dict[tuple, dict] = {}  # prompt ids -> the training row (prompt, answer, ...) it came from

    def remember_rows(self, batch: dict, inputs: list[dict]) -> None:
        """Keep the data rows of the batch's prompts (what revisiting a prompt needs: its reward
        reads the row's answer), for prompts the buffer holds; others are dropped."""
        pm = batch["prompt_mask"].bool()
        fresh = set()
        for i, row in enumerate(inputs[: batch["prompt_ids"].shape[0]]):
            key = tuple(batch["prompt_ids"][i][pm[i]].tolist())
            fresh.add(key)
            self.rows.setdefault(key, dict(row))
        if len(self.rows) > 2 * self.buffer.capacity:  # keep the buffer's prompts and this batch's
            kept = {tuple(e.prompt) for e in self.buffer.entries} | fresh
            self.rows = {k: v for k, v in self.rows.items() if k in kept}

    def seed_from_run(self, run_seed: int, process_index: int = 0) -> None:
        """Seed the generator from the run's seed and the process when no seed was given."""
        base = int(run_seed) + 1 if self.seed is None else int(self.seed)
        self.buffer.rng.seed(base * 1000 + int(process_index))

    def record(self, ctx: InjectContext, batch: dict, old_logp: torch.Tensor) -> int:
        """Store the rollout rows (``row_source == on_policy``) of one micro-batch with their
        behaviour log-probs ``old_logp`` [B, T]; returns how many were stored."""
        if ctx.global_step != self.recorded_step:
            self.buffer.expire(ctx.global_step)
            self.recorded_step = ctx.global_step
        rows = (batch["row_source"] == prov.ON_POLICY).nonzero().flatten().tolist()
        if not rows or "mixrl_reward" not in batch:
            return 0
        pm, cm = batch["prompt_mask"].bool(), batch["completion_mask"].bool()
        counts = None
        if self.admit is not None:
            if self.group_successes is None or self.group_successes[0] != ctx.global_step or "group_id" not in batch:
                return 0  # no group counts for this step: nothing is admitted
            counts = self.group_successes[1]
        stored = 0
        for i in rows:
            n = int(cm[i].sum())
            if n == 0:
                continue
            if counts is not None:
                g = int(batch["group_id"][i])
                if not 0 <= g < len(counts) or not self.admit[0] <= counts[g] <= self.admit[1]:
                    continue
            if self.mastered and tuple(batch["prompt_ids"][i][pm[i]].tolist()) in self.mastered:
                continue
            lp = old_logp[i, :n].detach().float()
            if not bool(torch.isfinite(lp).all()):
                continue
            stored += self.buffer.add(Entry(
                prompt=batch["prompt_ids"][i][pm[i]].tolist(),
                completion=batch["completion_ids"][i, :n].tolist(),
                logp=lp.tolist(),
                reward=float(batch["mixrl_reward"][i]),
                # a per-token advantage (GAE, algo.critic) is stored as its mean over the completion
                advantage=float(batch["advantages"][i] if batch["advantages"].dim() == 1 else batch["advantages"][i, :n][cm[i, :n]].mean()),
                group_mean=float(batch["mixrl_group_mean"][i]),
                group_std=float(batch["mixrl_group_std"][i]),
                step=int(ctx.global_step),
            ))
        return stored

    def pick(self, n: int, candidates: list[Entry]) -> list[Entry]:
        """Up to ``n`` of one prompt's stored ``candidates`` to replay: by the buffer's sampling rule, or
        (``trajectory=lowest_nll``) those of lowest :func:`mean_nll`, the oldest first on ties."""
        if self.trajectory == "lowest_nll":
            return sorted(candidates, key=lambda e: (mean_nll(e), e.uid))[:max(n, 0)]
        return self.buffer.sample(n, candidates)

    def note_mastered(self, prompts: list[list[int]]) -> int:
        """With ``drop_mastered``: mark ``prompts`` (solved by their whole group) mastered and delete
        their stored rollouts; returns how many entries were deleted."""
        if not self.drop_mastered or not prompts:
            return 0
        self.mastered.update(tuple(p) for p in prompts)
        for p in prompts:
            self.bucket_of.pop(tuple(p), None)
        before = len(self.buffer.entries)
        self.buffer.entries = [e for e in self.buffer.entries if tuple(e.prompt) not in self.mastered]
        return before - len(self.buffer.entries)

    def note_buckets(self, prompts: list[list[int]], counts: list[int], group: int) -> None:
        """With ``buckets``: each prompt's bucket becomes its group's successes k this step when the
        group is admitted (0 < k < ``group`` and within ``admit``); others keep their bucket."""
        if self.buckets is None:
            return
        lo, hi = self.admit if self.admit is not None else (1, group - 1)
        for p, k in zip(prompts, counts):
            if lo <= k <= hi and 0 < k < group and tuple(p) not in self.mastered:
                self.bucket_of[tuple(p)] = int(k)

    def note_group_successes(self, step: int, rewards: torch.Tensor, num_generations: int) -> list[int]:
        """Count each global group's successes (reward >= success_threshold) of step ``step``'s
        final rewards [N_global], for ``admit``; returns the counts."""
        groups = rewards.detach().float().view(-1, num_generations)
        counts = (groups >= self.buffer.success_threshold).sum(dim=1).tolist()
        self.group_successes = (int(step), [int(c) for c in counts])
        return self.group_successes[1]

    def state_dict(self) -> dict:
        kept = {tuple(e.prompt) for e in self.buffer.entries}
        rows = [[list(k), v] for k, v in self.rows.items() if k in kept]
        return {"buffer": self.buffer.state_dict(), "recorded_step": self.recorded_step, "rows": rows,
                "mastered": [list(k) for k in sorted(self.mastered)],
                "buckets": [[list(k), v] for k, v in sorted(self.bucket_of.items())]}

    def load_state_dict(self, state: dict) -> None:
        self.buffer.load_state_dict(state["buffer"])
        self.recorded_step = int(state.get("recorded_step", -1))
        self.rows = {tuple(k): dict(v) for k, v in state.get("rows", [])}
        self.mastered = {tuple(k) for k in state.get("mastered", [])}
        self.bucket_of = {tuple(k): int(v) for k, v in state.get("buckets", [])}


def mean_nll(entry: Entry) -> float:
    """-1/n sum_t log pi_b(y_t) over a stored rollout's n tokens (its behaviour log-probs)."""
    return -sum(entry.logp) / max(len(entry.logp), 1)


def _admit_range(admit) -> tuple[int, int] | None:
    if admit is None:
        return None
    try:
        lo, hi = (int(v) for v in admit)
        ok = all(not isinstance(v, bool) and float(v) == int(v) for v in admit)
    except (TypeError, ValueError):
        ok = False
    if not ok or not 0 <= lo <= hi:
        raise ConfigError(f"offpolicy.source.admit={admit!r} must be [lo, hi] with 0 <= lo <= hi (successes in a group), "
                          "e.g. [1, 7] for groups of 8, or null; fix offpolicy.source.admit")
    return lo, hi
