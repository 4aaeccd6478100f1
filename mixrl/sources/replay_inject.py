"""The injections that reuse the replay buffer (:mod:`mixrl.sources.replay`): ReMix's appended
rows (``replay_append``) and RePO's / ExGRPO's refilled groups (``replay_fill``)."""

from __future__ import annotations

import torch

from mixrl.errors import ConfigError
from mixrl.sources.base import INJECTIONS, InjectContext, Injection
from mixrl.sources.inject import appended_rows_per_step
from mixrl.sources.replay import REPLAY, ReplaySource
from mixrl.sources.replay_buckets import bucket_draw
from mixrl.sources.rows import append_rows, replace_rows


class _ReplayInjection(Injection):
    """Shared by the replay injections: records rollouts after the first forward and saves
    the buffer in a file of its own with each checkpoint."""

    state_in_file = True
    sources = ("replay",)  # config validation: the source it reads

    def __init__(self, *, source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        self._seeded = False
        self.metrics: dict[str, float] = {}
        self.revisited: tuple[int, set[int]] = (-1, set())  # (step, global groups whose prompt was revisited)

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

    def after_rewards(self, ctx: InjectContext, inputs: list[dict], rewards: torch.Tensor) -> torch.Tensor:
        """Note each group's successes of this step (what the source's ``admit`` reads)."""
        if isinstance(self.source, ReplaySource):
            self.source.note_group_successes(ctx.global_step, rewards, ctx.num_generations)
        return rewards

    def _revisit_candidate(self, entry) -> bool:
        """A stored entry a revisited prompt may come from: a past success, what a failing group can be refilled with."""
        return self.source.buffer.is_success(entry)

    def _draw_prompts(self, ok: list, want: int, G: int) -> list[tuple]:
        """Up to ``want`` distinct prompts of the entries ``ok``: by the source's success-rate buckets
        (``buckets``; uniformly when none of them has one, as ExGRPO falls back), else in the
        sampling rule's order (the first entry of each prompt)."""
        buf = self.source.buffer
        if getattr(self.source, "buckets", None):
            prompts = sorted({tuple(e.prompt) for e in ok})
            by: dict[int, list[tuple]] = {}
            for key in prompts:
                if key in self.source.bucket_of:
                    by.setdefault(self.source.bucket_of[key], []).append(key)
            drawn = bucket_draw(by, want, G, self.source.buckets, buf.rng)
            return drawn if drawn else buf.rng.sample(prompts, min(want, len(prompts)))
        picked: list[tuple] = []
        for e in buf.sample(len(ok), ok):  # in the sampling rule's order; first entry of each prompt
            if tuple(e.prompt) not in picked:
                picked.append(tuple(e.prompt))
            if len(picked) == want:
                break
        return picked

    def _revisit(self, ctx: InjectContext, inputs: list[dict], label: str) -> list[dict]:
        """The revisit share of the whole groups on this process take buffered prompts (entries old
        enough that :meth:`_revisit_candidate` accepts); metric ``<label>/prompts_revisited``."""
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
              and self._revisit_candidate(e)]
        picked = [rows[key] for key in self._draw_prompts(ok, want, G)]
        inputs = list(inputs)
        groups = set()
        for g, row in zip(reversed(whole), picked):
            groups.add(g)
            for r in range(g * G, (g + 1) * G):
                inputs[r - start] = dict(row)
        self.revisited = (ctx.global_step, groups)
        self.metrics[f"{label}/prompts_revisited"] = float(len(picked))
        return inputs


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

    appends_rows_after_advantages = True

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
    "start_solve_rate": ("[0, 1)", "a share of the step's rows"),
})
class ReplayFill(_ReplayInjection):
    """Refill groups with no learning signal from the buffer: when every fresh rollout of a
    prompt got the same reward (``fill: same_reward``; RePO-replay, the ms-swift ask) or
    every one failed (``fill: failed``; ExGRPO-style experience: a past success kept for a
    problem the policy now fails), the last k rollouts of the group are replaced, before
    advantages, by past rollouts of the same prompt whose reward differs; they share the
    group's statistics and are trained with a ratio against their stored behaviour log-probs.

    With ``fill: revisited`` (ExGRPO's experience mixing) every group whose prompt was revisited
    this step (``revisit``) gets a stored success of its prompt in its last k slots, whatever
    its fresh rewards; fresh prompts get none. With ``start_solve_rate`` nothing is stored,
    revisited or filled until a step's solve rate (the share of all its rows with reward >=
    the source's success_threshold) exceeds it; from the next step on, replay is on for good
    (ExGRPO's experience_start_sratio, the switch to mixed-policy training).

    Formula: group(x) = {y_1..y_(G-k) ~ pi_old} + {k past rollouts of x with R != R(group)} when R(group) is uniform (fill same_reward / failed) or x was revisited (fill revisited), k = {per_group}
    Paper: RePO, "RePO: Replay-Enhanced Policy Optimization" (replayed samples in the GRPO group); ExGRPO, "ExGRPO: Learning to Reason from Experience" (arXiv 2510.02245): successful trajectories of problems not yet mastered.

    Parameters:
        per_group (1): past rollouts placed in a refilled group (k), between 1 and num_generations - 1.
        fill (same_reward): same_reward (any group whose rewards are all equal) | failed (only groups where every rollout failed) | revisited (every group of a revisited prompt, with a stored success; needs revisit > 0).
        min_age (1): replay only rollouts generated at least this many steps ago.
        revisit (0.0): fraction of each step's prompts replaced, before generation, by prompts with a stored success drawn from the buffer, so that a past rollout of the same prompt exists to fill with; ExGRPO mixes experience questions at 50%.
        start_solve_rate (None): replay (storing, revisiting, filling) starts on the step after the first whose solve rate exceeds this; None: from the first step. ExGRPO: 0.35.
    """

    def __init__(self, *, per_group: int = 1, fill: str = "same_reward", min_age: int = 1, revisit: float = 0.0,
                 start_solve_rate: float | None = None, source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        if not 0.0 <= revisit <= 1.0:
            raise ConfigError(f"algo.inject.revisit must be in [0, 1], got {revisit}")
        if start_solve_rate is not None and not 0.0 <= float(start_solve_rate) < 1.0:
            raise ConfigError(f"algo.inject.start_solve_rate must be in [0, 1) or null, got {start_solve_rate}; fix algo.inject.start_solve_rate")
        self.start_solve_rate = None if start_solve_rate is None else float(start_solve_rate)
        #: the step from which replay is on (None: not yet; always on without start_solve_rate)
        self.started_at: int | None = 0 if self.start_solve_rate is None else None
        self.revisit = float(revisit)
        if geometry is not None and not 1 <= per_group < geometry.num_generations:
            raise ConfigError(
                f"algo.inject.per_group={per_group} must be between 1 and num_generations-1={geometry.num_generations - 1}"
            )
        if fill not in ("same_reward", "failed", "revisited"):
            raise ConfigError(f"algo.inject.fill={fill!r} is not one of same_reward, failed, revisited")
        if fill == "revisited" and self.revisit <= 0.0:
            raise ConfigError("algo.inject.fill=revisited fills the groups of revisited prompts, but algo.inject.revisit is 0; "
                              "set algo.inject.revisit > 0 (ExGRPO: 0.5) or another fill")
        self.per_group, self.fill, self.min_age = int(per_group), fill, int(min_age)

    def active(self, step: int) -> bool:
        """Whether replay is on at ``step`` (always, without start_solve_rate)."""
        return self.started_at is not None and step >= self.started_at

    def state_dict(self) -> dict:
        return {**super().state_dict(), "started_at": self.started_at}

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        started = state.pop("started_at", 0 if self.start_solve_rate is None else None)
        super().load_state_dict(state)
        self.started_at = started

    def after_forward(self, ctx: InjectContext, inputs: dict, old_logp: torch.Tensor) -> None:
        if self.active(ctx.global_step):  # ExGRPO collects experience only once mixed-policy training is on
            super().after_forward(ctx, inputs, old_logp)

    def before_generation(self, ctx: InjectContext, inputs: list[dict]) -> list[dict]:
        """Revisit: the last groups lying wholly on this process get prompts drawn from the
        buffer (by its sampling rule, one entry per prompt) whose rows it remembers."""
        if not self.active(ctx.global_step):
            return inputs
        return self._revisit(ctx, inputs, "replay")

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
        if self.active(ctx.global_step):
            rewards = self._fill(ctx, out, rewards)
        else:
            self.metrics["replay/groups_filled"] = 0.0
        if self.start_solve_rate is not None and self.started_at is None:
            # ExGRPO's switch: the share of the step's rows solved, over every row of the batch
            rate = float((rewards.detach().float() >= buf.success_threshold).float().mean())
            if rate > self.start_solve_rate:
                self.started_at = ctx.global_step + 1
        self.metrics["replay/on"] = float(self.active(ctx.global_step + 1))
        if isinstance(self.source, ReplaySource):
            counts = self.source.note_group_successes(ctx.global_step, rewards, G)
            n_local = out["prompt_ids"].shape[0]
            start = ctx.process_index * n_local
            pm = out["prompt_mask"].bool()
            local = [(out["prompt_ids"][i][pm[i]].tolist(), counts[(start + i) // G]) for i in range(n_local)
                     if 0 <= (start + i) // G < len(counts)]
            if self.active(ctx.global_step):  # ExGRPO's buckets: written as groups are admitted (experience_trainer_ops.py:43-44)
                self.source.note_buckets([p for p, _ in local], [k for _, k in local], G)
            if self.source.drop_mastered:  # ExGRPO's skip set, every step (mix_trainer_experience.py:385-388)
                solved = [p for p, k in local if k >= G]
                self.metrics["replay/dropped_mastered"] = float(self.source.note_mastered(solved))
        return rewards

    def _fill(self, ctx: InjectContext, out: dict, rewards: torch.Tensor) -> torch.Tensor:
        G, buf = ctx.num_generations, self.source.buffer
        n_local = out["completion_ids"].shape[0]
        start = ctx.process_index * n_local
        groups = rewards.view(-1, G)
        if self.fill == "revisited":  # ExGRPO: every revisited question gets a stored trajectory
            step, revisited = self.revisited
            chosen = sorted(revisited) if step == ctx.global_step else []
        else:
            uniform = (groups.max(dim=1).values - groups.min(dim=1).values).abs() <= 1e-6
            if self.fill == "failed":
                uniform &= groups.max(dim=1).values < buf.success_threshold
            chosen = uniform.nonzero().flatten().tolist()
            self.metrics["replay/groups_uniform"] = float(uniform.sum())
        local = rewards[start:start + n_local].clone()
        pm = out["prompt_mask"].bool()
        rows, completions, logps = [], [], []
        filled = 0
        for g in chosen:
            last = (g + 1) * G  # one past the group's last global row
            slots = [r for r in range(last - self.per_group, last) if start <= r < start + n_local]
            if not slots:
                continue
            i0 = slots[0] - start
            value = float(groups[g, 0])
            if self.fill == "revisited":
                keep = buf.is_success
            else:
                keep = lambda e, value=value: abs(e.reward - value) > 1e-6  # noqa: E731
            candidates = [e for e in buf.for_prompt(out["prompt_ids"][i0][pm[i0]].tolist())
                          if keep(e) and ctx.global_step - e.step >= self.min_age]
            # a group straddling two processes is filled slot by slot, each process from its own buffer
            picks = self.source.pick(self.per_group, candidates) if candidates else []
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
        if rows:
            replace_rows(out, rows, completions, pad_id=ctx.tokenizer.pad_token_id, row_source=REPLAY,
                         behaviour_logp=logps)
        if ctx.num_processes > 1:
            return ctx.gather(local)
        return local
