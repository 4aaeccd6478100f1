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
reward + eps: prompts the policy failed). Draws use the source's own seeded generator;
``state_dict`` holds contents and generator state, saved with each checkpoint
(``torch.save``, one file per process: see the trainer).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from mixrl.core import provenance as prov
from mixrl.errors import ConfigError
from mixrl.sources.base import INJECTIONS, SOURCES, InjectContext, Injection, Source
from mixrl.sources.rows import append_rows, replace_rows

REPLAY = prov.register_provenance(
    "replay", behaviour="stored",
    description="a past rollout of the policy, replayed from the buffer; behaviour log-probs recorded when it was sampled",
).code

EVICTIONS = ("fifo", "keep_successes", "age")
SAMPLINGS = ("uniform", "recent", "variance", "failure")
STORES = ("all", "successes")
_EPS = 1e-3


@dataclass
class Entry:
    """One stored rollout."""

    prompt: list[int]
    completion: list[int]
    logp: list[float]  # behaviour log-prob of each completion token
    reward: float
    advantage: float
    group_mean: float
    group_std: float
    step: int
    uid: int = 0  # insertion order (ties, FIFO)


@dataclass
class ReplayBuffer:
    """A bounded store of rollouts with eviction and seeded, weighted sampling (pure Python)."""

    capacity: int = 1024
    eviction: str = "fifo"
    max_age: int | None = None
    store: str = "all"
    success_threshold: float = 1.0
    sampling: str = "uniform"
    seed: int = 0
    entries: list[Entry] = field(default_factory=list)
    added: int = 0  # entries ever added (the next uid)

    def __post_init__(self):
        if self.capacity < 1:
            raise ConfigError(f"offpolicy.source.capacity must be >= 1, got {self.capacity}")
        for key, value, allowed in (("eviction", self.eviction, EVICTIONS), ("sampling", self.sampling, SAMPLINGS),
                                    ("store", self.store, STORES)):
            if value not in allowed:
                raise ConfigError(f"offpolicy.source.{key}={value!r} is not one of {', '.join(allowed)}")
        if self.eviction == "age" and (self.max_age is None or self.max_age < 0):
            raise ConfigError("offpolicy.source.eviction=age needs offpolicy.source.max_age (steps, >= 0)")
        self.rng = random.Random(self.seed)

    # ------------------------------------------------------------------ contents
    def __len__(self) -> int:
        return len(self.entries)

    def is_success(self, e: Entry) -> bool:
        return e.reward >= self.success_threshold

    def add(self, entry: Entry) -> bool:
        """Store ``entry`` (False when ``store`` rejects it), evicting per policy when full."""
        if self.store == "successes" and not self.is_success(entry):
            return False
        entry.uid = self.added
        self.added += 1
        self.entries.append(entry)
        while len(self.entries) > self.capacity:
            self.entries.pop(self._victim())
        return True

    def _victim(self) -> int:
        """Index of the entry to evict when over capacity."""
        if self.eviction == "keep_successes":
            failures = [i for i, e in enumerate(self.entries) if not self.is_success(e)]
            if failures:
                return min(failures, key=lambda i: self.entries[i].uid)
        return min(range(len(self.entries)), key=lambda i: self.entries[i].uid)

    def expire(self, step: int) -> int:
        """Drop entries older than ``max_age`` steps (eviction ``age``); returns how many."""
        if self.eviction != "age":
            return 0
        n = len(self.entries)
        self.entries = [e for e in self.entries if step - e.step <= self.max_age]
        return n - len(self.entries)

    # ------------------------------------------------------------------ sampling
    def weight(self, e: Entry) -> float:
        if self.sampling == "variance":
            return e.group_std + _EPS
        if self.sampling == "failure":
            return max(1.0 - e.group_mean, 0.0) + _EPS
        return 1.0

    def sample(self, n: int, candidates: Sequence[Entry] | None = None) -> list[Entry]:
        """Up to ``n`` distinct entries (of ``candidates``, default all) drawn with the
        buffer's generator: ``recent`` takes the newest, the others draw without
        replacement with probability proportional to their weight."""
        pool = list(self.entries if candidates is None else candidates)
        n = min(n, len(pool))
        if n <= 0:
            return []
        if self.sampling == "recent":
            pool.sort(key=lambda e: -e.uid)
            return pool[:n]
        if self.sampling == "uniform":
            return self.rng.sample(pool, n)
        # weighted without replacement (Efraimidis-Spirakis keys u^(1/w))
        keyed = [(self.rng.random() ** (1.0 / self.weight(e)), i) for i, e in enumerate(pool)]
        keyed.sort(reverse=True)
        return [pool[i] for _, i in keyed[:n]]

    def for_prompt(self, prompt: Sequence[int]) -> list[Entry]:
        key = list(prompt)
        return [e for e in self.entries if e.prompt == key]

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {"entries": [asdict(e) for e in self.entries], "added": self.added, "rng": _rng_state(self.rng)}

    def load_state_dict(self, state: dict) -> None:
        self.entries = [Entry(**e) for e in state["entries"]]
        self.added = int(state["added"])
        self.rng.setstate(_rng_from(state["rng"]))


def _rng_state(rng: random.Random) -> list:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_from(state: list) -> tuple:
    version, internal, gauss = state
    return (int(version), tuple(int(x) for x in internal), gauss)


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
    """

    provenances = ("replay",)

    def __init__(self, *, capacity: int = 1024, eviction: str = "fifo", max_age: int | None = None, store: str = "all",
                 success_threshold: float = 1.0, sampling: str = "uniform", seed: int | None = None):
        self.seed = seed
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
        stored = 0
        for i in rows:
            n = int(cm[i].sum())
            if n == 0:
                continue
            lp = old_logp[i, :n].detach().float()
            if not bool(torch.isfinite(lp).all()):
                continue
            stored += self.buffer.add(Entry(
                prompt=batch["prompt_ids"][i][pm[i]].tolist(),
                completion=batch["completion_ids"][i, :n].tolist(),
                logp=lp.tolist(),
                reward=float(batch["mixrl_reward"][i]),
                advantage=float(batch["advantages"][i]),
                group_mean=float(batch["mixrl_group_mean"][i]),
                group_std=float(batch["mixrl_group_std"][i]),
                step=int(ctx.global_step),
            ))
        return stored

    def state_dict(self) -> dict:
        kept = {tuple(e.prompt) for e in self.buffer.entries}
        rows = [[list(k), v] for k, v in self.rows.items() if k in kept]
        return {"buffer": self.buffer.state_dict(), "recorded_step": self.recorded_step, "rows": rows}

    def load_state_dict(self, state: dict) -> None:
        self.buffer.load_state_dict(state["buffer"])
        self.recorded_step = int(state.get("recorded_step", -1))
        self.rows = {tuple(k): dict(v) for k, v in state.get("rows", [])}


class _ReplayInjection(Injection):
    """Shared by the replay injections: records rollouts after the first forward and saves
    the buffer in a file of its own with each checkpoint."""

    state_in_file = True
    sources = ("replay",)  # config validation: the source it reads

    def __init__(self, *, source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        self._seeded = False
        self.metrics: dict[str, float] = {}

    def _seed(self, ctx: InjectContext) -> None:
        if not self._seeded and isinstance(self.source, ReplaySource):
            self.source.seed_from_run(self.seed, ctx.process_index)
        self._seeded = True

    def after_forward(self, ctx: InjectContext, inputs: dict, old_logp: torch.Tensor) -> None:
        self._seed(ctx)
        self.source.record(ctx, inputs, old_logp)
        self.metrics["replay/buffer_size"] = float(len(self.source.buffer))

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._seeded = True  # the generator state came with the checkpoint


@INJECTIONS.register("replay_append", bounds={
    "ratio": ("(0, 1)", "the share of replayed rows among all rows of a step"),
    "rows": (">= 1", "replayed rows per step"),
    "min_age": (">= 0", "steps"), "until_step": (">= 0", "a step number"),
})
class ReplayAppend(_ReplayInjection):
    """ReMix's mix-policy batch: beside each step's fresh rollouts, append rows replayed from
    the buffer (other prompts, earlier steps), with the advantage they were scored with; they
    enter no group and are trained by their own term, with an importance ratio against
    their stored behaviour log-probs. Reusing each rollout on later steps raises the
    update-to-data ratio above 1 (UTD = (rollouts + replayed rows) / rollouts per step).

    Formula: batch = {rollouts of pi_old} + {E replayed rows (x, y, A, pi_b) from the buffer}, E = ratio / (1 - ratio) * rollouts (or rows)
    Paper: ReMix, "Squeeze the Soaked Sponge: Efficient Off-policy Reinforcement Finetuning for Large Language Model" (arXiv 2507.06892): mix-policy proximal policy gradient with UTD > 1.

    Parameters:
        ratio (0.5): fraction of all rows per step that are replayed rows (0.5: as many as rollouts, UTD 2).
        rows (None): replayed rows per step instead of the ratio (wins when set).
        min_age (1): replay only rollouts generated at least this many steps ago (1: never this step's).
        until_step (None): ReMix's policy reincarnation: from this step on nothing is replayed (pure on-policy); None: never stop.
    """

    def __init__(self, *, ratio: float = 0.5, rows: int | None = None, min_age: int = 1, until_step: int | None = None,
                 source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        if rows is None and not 0.0 < ratio < 1.0:
            raise ConfigError(f"algo.inject.ratio must be in (0, 1), got {ratio}")
        if min_age < 0:
            raise ConfigError(f"algo.inject.min_age must be >= 0, got {min_age}")
        self.ratio, self.rows, self.min_age = ratio, rows, int(min_age)
        self.until_step = None if until_step is None else int(until_step)

    def extra_rows_per_step(self, rollouts_per_step: int, unit: int) -> int:
        from mixrl.sources.inject import appended_rows_per_step

        return appended_rows_per_step(self.ratio, self.rows, rollouts_per_step, unit)

    def after_advantages(self, ctx: InjectContext, inputs: list[dict], out: dict) -> dict:
        self._seed(ctx)
        want = self.geometry.expert_rows_per_process if self.geometry is not None else 0
        if self.until_step is not None and ctx.global_step >= self.until_step:
            want = 0  # reincarnated: pure on-policy from here
        old = [e for e in self.source.buffer.entries if ctx.global_step - e.step >= self.min_age]
        picks = self.source.buffer.sample(want, old)
        unit = self.geometry.grad_accum if self.geometry is not None else 1
        picks = picks[: len(picks) // unit * unit]  # every micro-batch keeps the same row count
        if not picks:
            return out
        self.metrics["replay/age"] = sum(ctx.global_step - e.step for e in picks) / len(picks)
        dtype = out["advantages"].dtype
        return append_rows(
            out, [e.prompt for e in picks], [e.completion for e in picks], pad_id=ctx.tokenizer.pad_token_id,
            row_source=torch.full((len(picks),), REPLAY, dtype=torch.long),
            behaviour_logp=[e.logp for e in picks],
            advantages=torch.tensor([e.advantage for e in picks], dtype=dtype),
        )


@INJECTIONS.register("replay_fill", bounds={
    "per_group": (">= 1", "slots of a group filled from the buffer"),
    "min_age": (">= 0", "steps"), "revisit": ("[0, 1]", "a probability"),
})
class ReplayFill(_ReplayInjection):
    """Refill groups with no learning signal from the buffer: when every fresh rollout of a
    prompt got the same reward (``fill: same_reward``; RePO-replay, the ms-swift ask) or
    every one failed (``fill: failed``; ExGRPO-style experience: a past success kept for a
    problem the policy now fails), the last k rollouts of the group are replaced, before
    advantages, by past rollouts of the same prompt whose reward differs; they share the
    group's statistics and are trained with a ratio against their stored behaviour log-probs.

    Formula: group(x) = {y_1..y_(G-k) ~ pi_old} + {k past rollouts of x with R != R(group)} when R(group) is uniform, k = {per_group}
    Paper: RePO, "RePO: Replay-Enhanced Policy Optimization" (replayed samples in the GRPO group); ExGRPO, "ExGRPO: Learning to Reason from Experience" (arXiv 2510.02245): successful trajectories of problems not yet mastered.

    Parameters:
        per_group (1): past rollouts placed in a refilled group (k), between 1 and num_generations - 1.
        fill (same_reward): same_reward (any group whose rewards are all equal) | failed (only groups where every rollout failed).
        min_age (1): replay only rollouts generated at least this many steps ago.
        revisit (0.0): fraction of each step's prompts replaced, before generation, by prompts with a stored success drawn from the buffer, so that a past rollout of the same prompt exists to fill with; ExGRPO mixes experience questions at 50%.
    """

    def __init__(self, *, per_group: int = 1, fill: str = "same_reward", min_age: int = 1, revisit: float = 0.0,
                 source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        if not 0.0 <= revisit <= 1.0:
            raise ConfigError(f"algo.inject.revisit must be in [0, 1], got {revisit}")
        self.revisit = float(revisit)
        if geometry is not None and not 1 <= per_group < geometry.num_generations:
            raise ConfigError(
                f"algo.inject.per_group={per_group} must be between 1 and num_generations-1={geometry.num_generations - 1}"
            )
        if fill not in ("same_reward", "failed"):
            raise ConfigError(f"algo.inject.fill={fill!r} is not one of same_reward, failed")
        self.per_group, self.fill, self.min_age = int(per_group), fill, int(min_age)

    def before_generation(self, ctx: InjectContext, inputs: list[dict]) -> list[dict]:
        """Revisit: the last groups lying wholly on this process get prompts drawn from the
        buffer (by its sampling rule, one entry per prompt) whose rows it remembers."""
        if self.revisit <= 0.0 or not isinstance(self.source, ReplaySource):
            return inputs
        self._seed(ctx)
        G, n = ctx.num_generations, len(inputs)
        start = ctx.process_index * n
        whole = [g for g in range(start // G, (start + n) // G + 1) if g * G >= start and (g + 1) * G <= start + n]
        want = round(self.revisit * len(whole))
        if want == 0:
            return inputs
        buf, rows = self.source.buffer, self.source.rows
        ok = [e for e in buf.entries if tuple(e.prompt) in rows and ctx.global_step - e.step >= self.min_age
              and buf.is_success(e)]  # a past success: what a failing group can be refilled with
        picked, seen = [], set()
        for e in buf.sample(len(ok), ok):  # in the sampling rule's order; first entry of each prompt
            key = tuple(e.prompt)
            if key not in seen:
                seen.add(key)
                picked.append(rows[key])
            if len(picked) == want:
                break
        inputs = list(inputs)
        for g, row in zip(reversed(whole), picked):
            for r in range(g * G, (g + 1) * G):
                inputs[r - start] = dict(row)
        self.metrics["replay/prompts_revisited"] = float(len(picked))
        return inputs

    def after_advantages(self, ctx: InjectContext, inputs: list[dict], out: dict) -> dict:
        if self.revisit > 0.0 and isinstance(self.source, ReplaySource):
            self.source.remember_rows(out, inputs)
        return out

    def after_rewards(self, ctx: InjectContext, inputs: list[dict], rewards: torch.Tensor) -> torch.Tensor:
        self._seed(ctx)
        out = ctx.batch
        if out is None:
            return rewards
        G, buf = ctx.num_generations, self.source.buffer
        n_local = out["completion_ids"].shape[0]
        start = ctx.process_index * n_local
        groups = rewards.view(-1, G)
        uniform = (groups.max(dim=1).values - groups.min(dim=1).values).abs() <= 1e-6
        if self.fill == "failed":
            uniform &= groups.max(dim=1).values < buf.success_threshold
        local = rewards[start:start + n_local].clone()
        pm = out["prompt_mask"].bool()
        rows, completions, logps = [], [], []
        filled = 0
        for g in uniform.nonzero().flatten().tolist():
            last = (g + 1) * G  # one past the group's last global row
            slots = [r for r in range(last - self.per_group, last) if start <= r < start + n_local]
            if not slots:
                continue
            i0 = slots[0] - start
            value = float(groups[g, 0])
            candidates = [e for e in buf.for_prompt(out["prompt_ids"][i0][pm[i0]].tolist())
                          if abs(e.reward - value) > 1e-6 and ctx.global_step - e.step >= self.min_age]
            # a group straddling two processes is filled slot by slot, each process from its own buffer
            picks = buf.sample(self.per_group, candidates) if candidates else []
            for j, r in enumerate(reversed(range(last - self.per_group, last))):  # the last slots first
                if j >= len(picks) or not start <= r < start + n_local:
                    continue
                i = r - start
                rows.append(i)
                completions.append(picks[j].completion)
                logps.append(picks[j].logp)
                local[i] = picks[j].reward
            filled += bool(picks)
        self.metrics["replay/groups_filled"] = float(filled)
        self.metrics["replay/groups_uniform"] = float(uniform.sum())
        if rows:
            replace_rows(out, rows, completions, pad_id=ctx.tokenizer.pad_token_id, row_source=REPLAY,
                         behaviour_logp=logps)
        if ctx.num_processes > 1:
            return ctx.gather(local)
        return local

