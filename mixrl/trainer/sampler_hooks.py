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
3. **row filters** zero the advantage of the rollouts they drop (:meth:`_sampler_filter_rows`).

Logged: ``sampler/generated_per_trained`` (rollouts generated / rollouts trained, this batch),
``sampler/rounds`` and ``sampler/prompts_tracked``; :meth:`Sampler.summary` is printed at the end of
training. Without a sampler nothing here runs. One training process only (mixrl.config.sampler).

This mixin of :class:`mixrl.trainer.grpo.MixrlGRPOTrainer` reads the trainer's ``train_dataset``,
``num_generations``, ``reward_weights``, ``_mixrl_rollouts``, ``_mixrl_rewards_per_func``, ``state``
and ``_metrics``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable

import torch

from mixrl.core.schedules import resolve_schedule
from mixrl.errors import ConfigError
from mixrl.sources.base import Rollouts

SAMPLER_FILE = "mixrl_sampler.json"
_PROMPT_SIDE = ("prompt_ids", "prompt_mask")  # left-padded; every other [rows, width] tensor is right-padded


def prompt_key(row: dict) -> str:
    """A training row's prompt as text (messages as JSON): what identifies it across batches."""
    p = row["prompt"]
    return p if isinstance(p, str) else json.dumps(p, sort_keys=True)


class SamplerHooks:
    """The sampler's part of each training generation batch (mixin; see the module docstring)."""

    sampler = None  # a mixrl.sampler.runtime.Sampler, or None
    _sampler_index: dict[str, int] | None = None

    # ------------------------------------------------------------------ prompts
    def _sampler_indices(self, inputs: list[dict]) -> list[int | None]:
        """The training-set index of each group's prompt (None: not a training prompt)."""
        if self._sampler_index is None:
            self._sampler_index = {}
            for i, row in enumerate(self.train_dataset):
                self._sampler_index.setdefault(prompt_key(row), i)
        g = self.num_generations
        return [self._sampler_index.get(prompt_key(inputs[j])) for j in range(0, len(inputs), g)]

    def _sampler_rows(self, indices: list[int]) -> list[dict]:
        """The batch of training rows ``indices``, each repeated ``num_generations`` times."""
        return [dict(self.train_dataset[int(i)]) for i in indices for _ in range(self.num_generations)]

    def _sampler_pick(self, inputs: list[dict]) -> tuple[list[dict], list[int | None]]:
        """The batch's rows and their prompts' indices: the picker's choice, or the loader's."""
        n = len(inputs) // self.num_generations
        chosen = self.sampler.pick(len(self.train_dataset), n)
        if chosen is None:
            return inputs, self._sampler_indices(inputs)
        return self._sampler_rows(chosen), list(chosen)

    def _sampler_more(self, n: int) -> tuple[list[dict], list[int]]:
        """Another round's rows: the picker's choice, else ``n`` uniform draws."""
        chosen = self.sampler.pick(len(self.train_dataset), n)
        if chosen is None:
            chosen = self.sampler.draw_uniform(len(self.train_dataset), n)
        return self._sampler_rows(chosen), list(chosen)

    def _sampler_hard(self, row: dict) -> bool:
        """Is the row's prompt hard by the sampler's history (seen, accuracy estimate below
        ``hard_below``)? What a guided injection routes on (``algo.inject.prompts=hard``)."""
        idx = self._sampler_indices([row] * self.num_generations)[0]
        return idx is not None and self.sampler.is_hard(idx)

    # ------------------------------------------------------------------ rounds
    def _sampler_round_rewards(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The round's (weighted rewards, correct) ``[groups, G]``; correct: primary reward >= 1."""
        rpf = self._mixrl_rewards_per_func
        rewards = (rpf * self.reward_weights.to(rpf.device).unsqueeze(0)).nansum(dim=1)
        g = self.num_generations
        return rewards.view(-1, g).cpu(), (rpf[:, 0] >= 1.0 - 1e-6).view(-1, g).cpu()

    def _sampler_free_rows(self) -> torch.Tensor | None:
        """``[groups, G]``: rollouts the policy generated unguided (no prefix, no hint): the
        only ones a prompt's history counts (None: all are)."""
        r = self._mixrl_rollouts
        if r is None or not any(r.guided):
            return None
        return (torch.tensor(r.guided) == 0).view(-1, self.num_generations)

    def _sampler_generate(self, inputs: list[dict], indices: list[int | None], generate: Callable,
                          prepare: Callable) -> tuple[dict, list[dict]]:
        """Generate rounds until the step is full of kept groups (see the module docstring).
        ``generate``: TRL's ``_generate_and_score_completions``; ``prepare``: the injections'
        ``before_generation`` for another round's rows. Returns the step's batch and its rows."""
        s, g = self.sampler, self.num_generations
        n_groups = len(inputs) // g
        step = int(self.state.global_step)
        rounds, keeps = [], []
        with self._sampler_length():
            while True:
                self._mixrl_batch_inputs = inputs
                out = generate(inputs)
                rewards, correct = self._sampler_round_rewards()
                s.observe(indices, rewards, correct, step, free=self._sampler_free_rows())
                keeps.append(s.keep_groups(rewards, correct))
                rounds.append((out, self._mixrl_rollouts, self._mixrl_rewards_per_func, inputs))
                if not s.wants_more(keeps, n_groups):
                    break
                rows, indices = self._sampler_more(n_groups)
                inputs = prepare(rows)
        short = s.short
        chosen = s.assemble(keeps, n_groups)
        filled = s.short - short  # the last `filled` groups of the step were dropped ones
        self._sampler_filled = torch.arange(n_groups) >= n_groups - filled
        generated = sum(len(r[3]) for r in rounds)
        s.generated += generated
        s.trained += n_groups * g
        self._metrics["train"]["sampler/generated_per_trained"].append(generated / (n_groups * g))
        self._metrics["train"]["sampler/rounds"].append(float(len(rounds)))
        self._metrics["train"]["sampler/prompts_tracked"].append(float(len(s.state)))
        if len(rounds) == 1 and chosen == [(0, i) for i in range(n_groups)]:
            return rounds[0][0], rounds[0][3]
        out, rows = self._sampler_combine(rounds, chosen)
        dropped_tokens = sum(int(r[0]["completion_mask"].sum()) for r in rounds) - int(out["completion_mask"].sum())
        self.mixrl_rollouts += generated - n_groups * g  # the dropped rollouts were paid for too
        self.mixrl_generated_tokens += dropped_tokens
        return out, rows

    def _sampler_combine(self, rounds: list, chosen: list[tuple[int, int]]) -> tuple[dict, list[dict]]:
        """One batch of the ``chosen`` ``(round, group)`` groups: TRL's fields padded to a common
        width, the rollouts, the rewards and the rows, in the chosen order."""
        g = self.num_generations
        pad_id = self.processing_class.pad_token_id if self.processing_class.pad_token_id is not None else 0
        picks = [(r, torch.arange(k * g, (k + 1) * g)) for r, k in chosen]
        first = rounds[0][0]
        out: dict = {}
        for key, value in first.items():
            if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != first["completion_ids"].shape[0]:
                out[key] = value
                continue
            parts = [rounds[r][0][key][rows] for r, rows in picks]
            if value.dim() == 2:
                width = max(p.shape[1] for p in parts)
                fill = pad_id if key in ("prompt_ids", "completion_ids") else 0
                left = key in _PROMPT_SIDE
                parts = [torch.nn.functional.pad(p, (width - p.shape[1], 0) if left else (0, width - p.shape[1]), value=fill)
                         for p in parts]
            out[key] = torch.cat(parts, dim=0)
        out["num_items_in_batch"] = out["completion_mask"].sum().to(first["num_items_in_batch"].dtype) \
            if isinstance(first.get("num_items_in_batch"), torch.Tensor) else out["completion_mask"].sum()
        self._mixrl_rewards_per_func = torch.cat([rounds[r][2][rows.to(rounds[r][2].device)] for r, rows in picks], dim=0)
        self._mixrl_rollouts = _select_rollouts([(rounds[r][1], rows.tolist()) for r, rows in picks])
        rows = [rounds[r][3][i] for r, idx in picks for i in idx.tolist()]
        return out, rows

    # ------------------------------------------------------------------ rows, length
    def _sampler_filter_rows(self, rewards: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
        """Advantages with the rollouts of topped-up groups (dropped by the group filter) and those
        the row filters drop set to 0 (the groups' rows: the first ``groups x G``; rows an
        injection appended later are not filtered)."""
        g = self.num_generations
        n = (advantages.shape[0] // g) * g
        keep = self.sampler.row_keep(rewards[:n].view(-1, g), advantages[:n].view(-1, g))
        filled = getattr(self, "_sampler_filled", None)
        if filled is not None and filled.numel() == n // g and bool(filled.any()):
            kept_groups = (~filled).unsqueeze(1).expand(-1, g).to(rewards.device)
            keep = kept_groups if keep is None else keep & kept_groups
            self._metrics["train"]["sampler/filled_groups"].append(float(filled.sum()))
        if keep is None:
            return advantages
        out = advantages.clone()
        out[:n] = advantages[:n] * keep.reshape(-1).to(advantages.device, advantages.dtype)
        self._metrics["train"]["sampler/rows_kept"].append(float(keep.float().mean()))
        return out

    def _sampler_length(self):
        """The length curriculum: the generation's max completion length at this step."""

        spec = getattr(self, "_sampler_length_spec", None)
        if spec is None or not hasattr(self, "generation_config"):
            return contextlib.nullcontext()

        cap = int(self.max_completion_length)
        length = max(1, min(cap, int(round(resolve_schedule(spec)(int(self.state.global_step))))))
        self._metrics["train"]["sampler/max_completion_length"].append(float(length))
        return _generation_length(self, length)

    # ------------------------------------------------------------------ checkpoints
    def _save_sampler_state(self, folder: str) -> None:
        if self.sampler is not None and self.args.should_save:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, SAMPLER_FILE), "w") as f:
                json.dump(self.sampler.state_dict(), f)

    def _load_sampler_state(self, checkpoint: str | None) -> None:
        if self.sampler is None or not checkpoint:
            return
        path = os.path.join(checkpoint, SAMPLER_FILE)
        if os.path.exists(path):
            with open(path) as f:
                self.sampler.load_state_dict(json.load(f))
        elif int(self.state.global_step) > 0:

            raise ConfigError(f"resume: {path} is missing (the run was started without this sampler); "
                              "resume with the run's own sampler, or start a new run")


class _generation_length:
    """Temporarily set the transformers generation's ``max_new_tokens``."""

    def __init__(self, trainer, length: int):
        self.trainer, self.length = trainer, length

    def __enter__(self):
        t = self.trainer
        self.saved = (t.generation_config.max_new_tokens, dict(t.generation_kwargs))
        t.generation_config.max_new_tokens = self.length
        t.generation_kwargs["max_new_tokens"] = self.length

    def __exit__(self, *exc):
        t = self.trainer
        t.generation_config.max_new_tokens, t.generation_kwargs = self.saved[0], self.saved[1]


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
