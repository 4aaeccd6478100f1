"""The sampler axis in the trainer: which prompts a generation batch uses, and which groups train.

With a sampler (``cfg.sampler``, :class:`mixrl.sampler.runtime.Sampler`) each training generation
batch goes:

1. **pick**: a picker other than ``data`` replaces the data loader's prompts with its own choice
   (dataset rows, each repeated ``num_generations`` times as TRL's sampler lays them out). The
   choice is made here, when the batch is generated, and not in TRL's train sampler: the data
   loader fetches a batch ahead of the step, and a resumed run replays the train sampler to skip
   the batches it trained, so a sampler that reads the per-prompt history would choose with a
   stale history and differently after a resume. Here the choice depends only on the history and
   a draw counter that checkpoints carry.
2. **generate in rounds**: TRL generates and scores the batch; every group updates its prompt's
   history (times seen, rewards, Beta counts); the group filter marks the groups kept. While fewer
   than ``prompts_per_step`` groups are kept and rounds are left (``sampler.max_rounds``), another
   batch of prompts is generated (the picker's, or uniform draws from the training set). The
   step then trains on the first kept groups; if the rounds ran out, it is topped up with dropped
   groups whose advantages are set to 0 (the batch keeps its shape, they add no gradient).
   Each round passes through the injections' ``before_generation`` / ``after_generation`` like
   a plain batch, so expert rows, replay and teachers see the chosen prompts.
3. **row filters** zero the advantage of the rollouts they drop (:meth:`SamplerRounds.filter_rows`).

Logged: ``sampler/generated_per_trained`` (rollouts generated / rollouts trained, this batch),
``sampler/rounds`` and ``sampler/prompts_tracked``; :meth:`Sampler.summary` is printed at the end of
training. Without a sampler nothing here runs. One training process only (mixrl.config.sampler).

Owns: the sampler (its per-prompt history and draw counter: shared state, written once by the
saving process; one training process only), the prompt index of the training set and which
groups of the step were topped up. Receives at construction the training set, the group size,
the padding token and the reward weighting; per call: the batch's rows, the step, and TRL's
generation and scoring of one round as a callable. Returns batches, rows and metrics dicts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from mixrl.core.schedules import resolve_schedule
from mixrl.sources.base import Rollouts

_PROMPT_SIDE = ("prompt_ids", "prompt_mask")  # left-padded; every other [rows, width] tensor is right-padded


def prompt_key(row: dict) -> str:
    """A training row's prompt as text (messages as JSON): what identifies it across batches."""
    p = row["prompt"]
    return p if isinstance(p, str) else json.dumps(p, sort_keys=True)


@dataclass
class Round:
    """One round's generation: TRL's batch, the rollouts as the injections left them, the gathered
    reward matrix ``[N_global, F]`` and the rows it was generated for."""

    out: dict
    rollouts: Rollouts | None
    rewards_per_func: torch.Tensor
    rows: list[dict]


@dataclass
class Rounds:
    """The step's batch after :meth:`SamplerRounds.generate`: the chosen groups of every round,
    what the dropped rollouts cost (``extra_rollouts``, ``extra_tokens``) and the metrics."""

    out: dict
    rows: list[dict]
    rollouts: Rollouts | None
    rewards_per_func: torch.Tensor
    extra_rollouts: int = 0
    extra_tokens: int = 0
    metrics: dict = field(default_factory=dict)


class SamplerRounds:
    """The sampler's part of each training generation batch (see the module docstring)."""

    def __init__(self, sampler, length_spec=None, *, dataset, num_generations: int, pad_token_id: int | None,
                 weigh: Callable[[torch.Tensor], torch.Tensor]):
        self.sampler = sampler  # a mixrl.sampler.runtime.Sampler
        self.length_spec = length_spec  # the max-completion-length schedule, or None
        self.dataset = dataset
        self.num_generations = int(num_generations)
        self.pad_token_id = pad_token_id
        self.weigh = weigh  # [N, F] rewards per function -> [N] weighted
        self.index: dict[str, int] | None = None  # prompt -> training-set index, built on first use
        self.filled: torch.Tensor | None = None  # [groups]: the step's groups topped up with dropped ones

    # ------------------------------------------------------------------ prompts
    def indices(self, inputs: list[dict]) -> list[int | None]:
        """The training-set index of each group's prompt (None: not a training prompt)."""
        if self.index is None:
            self.index = {}
            for i, row in enumerate(self.dataset):
                self.index.setdefault(prompt_key(row), i)
        g = self.num_generations
        return [self.index.get(prompt_key(inputs[j])) for j in range(0, len(inputs), g)]

    def as_generated(self, inputs: list[dict], indices: list[int | None]) -> list[int | None]:
        """The index of each group's prompt as generated: an injection that put another training
        prompt in a group (ExGRPO's revisited questions, ``algo.inject.revisit``) gets that prompt's
        index; a prompt outside the training set (a hint added to it) keeps the picked one."""
        actual = self.indices(inputs)
        return [a if a is not None else i for a, i in zip(actual, indices)]

    def rows(self, indices: list[int]) -> list[dict]:
        """The batch of training rows ``indices``, each repeated ``num_generations`` times."""
        return [dict(self.dataset[int(i)]) for i in indices for _ in range(self.num_generations)]

    def pick(self, inputs: list[dict]) -> tuple[list[dict], list[int | None]]:
        """The batch's rows and their prompts' indices: the picker's choice, or the loader's."""
        n = len(inputs) // self.num_generations
        chosen = self.sampler.pick(len(self.dataset), n)
        if chosen is None:
            return inputs, self.indices(inputs)
        return self.rows(chosen), list(chosen)

    def more(self, n: int) -> tuple[list[dict], list[int]]:
        """Another round's rows: the picker's choice, else ``n`` uniform draws."""
        chosen = self.sampler.pick(len(self.dataset), n)
        if chosen is None:
            chosen = self.sampler.draw_uniform(len(self.dataset), n)
        return self.rows(chosen), list(chosen)

    def hard(self, row: dict) -> bool:
        """Is the row's prompt hard by the sampler's history (seen, accuracy estimate below
        ``hard_below``)? What a guided injection routes on (``algo.inject.prompts=hard``)."""
        idx = self.indices([row] * self.num_generations)[0]
        return idx is not None and self.sampler.is_hard(idx)

    def length_at(self, step: int, cap: int) -> int | None:
        """The length curriculum: the generation's max completion length at ``step`` (None: no curriculum)."""
        if self.length_spec is None:
            return None
        return max(1, min(int(cap), int(round(resolve_schedule(self.length_spec)(int(step))))))

    # ------------------------------------------------------------------ rounds
    def _round_rewards(self, rpf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The round's (weighted rewards, correct) ``[groups, G]``; correct: primary reward >= 1."""
        rewards = self.weigh(rpf)
        g = self.num_generations
        return rewards.view(-1, g).cpu(), (rpf[:, 0] >= 1.0 - 1e-6).view(-1, g).cpu()

    def _free_rows(self, rollouts: Rollouts | None) -> torch.Tensor | None:
        """``[groups, G]``: rollouts the policy generated unguided (no prefix, no hint): the
        only ones a prompt's history counts (None: all are)."""
        if rollouts is None or not any(rollouts.guided):
            return None
        return (torch.tensor(rollouts.guided) == 0).view(-1, self.num_generations)

    def generate(self, inputs: list[dict], indices: list[int | None], *, step: int,
                 generate: Callable[[list[dict]], Round], prepare: Callable) -> Rounds:
        """Generate rounds until the step is full of kept groups (see the module docstring).
        ``generate``: TRL's generation and scoring of one round's rows; ``prepare``: the
        injections' ``before_generation`` for another round's rows."""
        s, g = self.sampler, self.num_generations
        n_groups = len(inputs) // g
        rounds: list[Round] = []
        keeps = []
        while True:
            indices = self.as_generated(inputs, indices)
            r = generate(inputs)
            rewards, correct = self._round_rewards(r.rewards_per_func)
            s.observe(indices, rewards, correct, int(step), free=self._free_rows(r.rollouts))
            keeps.append(s.keep_groups(rewards, correct))
            rounds.append(r)
            if not s.wants_more(keeps, n_groups):
                break
            rows, indices = self.more(n_groups)
            inputs = prepare(rows)
        short = s.short
        chosen = s.assemble(keeps, n_groups)
        filled = s.short - short  # the last `filled` groups of the step were dropped ones
        self.filled = torch.arange(n_groups) >= n_groups - filled
        generated = sum(len(r.rows) for r in rounds)
        s.generated += generated
        s.trained += n_groups * g
        metrics = {"sampler/generated_per_trained": generated / (n_groups * g), "sampler/rounds": float(len(rounds)),
                   "sampler/prompts_tracked": float(len(s.state))}
        if len(rounds) == 1 and chosen == [(0, i) for i in range(n_groups)]:
            r = rounds[0]
            return Rounds(r.out, r.rows, r.rollouts, r.rewards_per_func, metrics=metrics)
        result = self._combine(rounds, chosen)
        result.extra_rollouts = generated - n_groups * g  # the dropped rollouts were paid for too
        result.extra_tokens = sum(int(r.out["completion_mask"].sum()) for r in rounds) - int(result.out["completion_mask"].sum())
        result.metrics = metrics
        return result

    def _combine(self, rounds: list[Round], chosen: list[tuple[int, int]]) -> Rounds:
        """One batch of the ``chosen`` ``(round, group)`` groups: TRL's fields padded to a common
        width, the rollouts, the rewards and the rows, in the chosen order."""
        g = self.num_generations
        pad_id = self.pad_token_id if self.pad_token_id is not None else 0
        picks = [(r, torch.arange(k * g, (k + 1) * g)) for r, k in chosen]
        first = rounds[0].out
        out: dict = {}
        for key, value in first.items():
            if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != first["completion_ids"].shape[0]:
                out[key] = value
                continue
            parts = [rounds[r].out[key][rows] for r, rows in picks]
            if value.dim() == 2:
                width = max(p.shape[1] for p in parts)
                fill = pad_id if key in ("prompt_ids", "completion_ids") else 0
                left = key in _PROMPT_SIDE
                parts = [torch.nn.functional.pad(p, (width - p.shape[1], 0) if left else (0, width - p.shape[1]), value=fill)
                         for p in parts]
            out[key] = torch.cat(parts, dim=0)
        out["num_items_in_batch"] = out["completion_mask"].sum().to(first["num_items_in_batch"].dtype) \
            if isinstance(first.get("num_items_in_batch"), torch.Tensor) else out["completion_mask"].sum()
        rpf = torch.cat([rounds[r].rewards_per_func[rows.to(rounds[r].rewards_per_func.device)] for r, rows in picks], dim=0)
        rollouts = _select_rollouts([(rounds[r].rollouts, rows.tolist()) for r, rows in picks])
        rows = [rounds[r].rows[i] for r, idx in picks for i in idx.tolist()]
        return Rounds(out, rows, rollouts, rpf)

    # ------------------------------------------------------------------ rows
    def filter_rows(self, rewards: torch.Tensor, advantages: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Advantages with the rollouts of topped-up groups (dropped by the group filter) and those
        the row filters drop set to 0 (the groups' rows: the first ``groups x G``; rows an
        injection appended later are not filtered)."""
        g = self.num_generations
        n = (advantages.shape[0] // g) * g
        metrics: dict[str, float] = {}
        keep = self.sampler.row_keep(rewards[:n].view(-1, g), advantages[:n].view(-1, g))
        filled = self.filled
        if filled is not None and filled.numel() == n // g and bool(filled.any()):
            kept_groups = (~filled).unsqueeze(1).expand(-1, g).to(rewards.device)
            keep = kept_groups if keep is None else keep & kept_groups
            metrics["sampler/filled_groups"] = float(filled.sum())
        if keep is None:
            return advantages, metrics
        out = advantages.clone()
        out[:n] = advantages[:n] * keep.reshape(-1).to(advantages.device, advantages.dtype)
        metrics["sampler/rows_kept"] = float(keep.float().mean())
        return out, metrics

    # ------------------------------------------------------------------ checkpoints (shared, JSON)
    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)


def _select_rollouts(parts: list[tuple[Rollouts, list[int]]]) -> Rollouts:
    """The rows ``rows`` of each ``Rollouts`` in ``parts``, concatenated."""
    def take(field: str):
        return [getattr(r, field)[i] for r, rows in parts for i in rows]

    logprobs = None if any(r.logprobs is None for r, _ in parts) else take("logprobs")
    prompt_ids = None if any(r.prompt_ids is None for r, _ in parts) else take("prompt_ids")
    unique = {id(r): r for r, _ in parts}  # a round's rollouts appear once per chosen group
    discarded = [t for r in unique.values() for t in r.discarded_tokens]
    return Rollouts(take("completion_ids"), logprobs, take("row_source"), token_source=take("token_source"),
                    behaviour_logp=take("behaviour_logp"), guided=take("guided"), prompt_ids=prompt_ids,
                    discarded_tokens=discarded)
