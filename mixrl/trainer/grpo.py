"""``MixrlGRPOTrainer``: the one place that touches TRL internals.

TRL's ``GRPOTrainer`` generates a group of completions per prompt, scores them, and
optimises a loss. mixrl keeps its generation, scoring, buffering and logging, and
replaces three things (every overridden method is listed in ``OVERRIDDEN`` and its
parent signature is pinned by ``tests/test_trl_contract.py``):

* ``_calculate_rewards``: also keeps the gathered reward matrix of the generation batch.
* ``_generate_and_score_completions``: recomputes advantages with the configured
  ``mixrl.core`` advantage (group membership from the global row index, so groups that
  straddle processes are handled), adds per-row tensors (``row_source``) that survive
  TRL's shuffling and splitting, and the global counts that normalise every loss term.
  Off-policy rows (expert demonstrations) are injected here by the mixing hooks.
* ``_compute_loss``: one forward over the micro-batch, then ``mixrl.core.compute_objective``.
"""

from __future__ import annotations

from typing import Any

import torch
from trl import GRPOTrainer

from mixrl.core.objective import EXPERT, ON_POLICY, ObjectiveSpec, compute_objective

OVERRIDDEN = ("_calculate_rewards", "_generate_and_score_completions", "_compute_loss")


class MixrlGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose advantage and loss come from ``mixrl.core`` registries.

    Extra constructor arguments:
        objective: the ``ObjectiveSpec`` built from ``cfg.algo``.
        advantage: ``(name, params, include_offpolicy)`` for ``mixrl.core.ADVANTAGES``.
        mixer: an optional object with ``inject(trainer, inputs, out) -> out`` that adds
            off-policy rows to a scored generation batch (see ``mixrl.trainer.mixing``).
    """

    def __init__(self, *args, objective: ObjectiveSpec, advantage: tuple[str, dict, bool], mixer: Any = None, **kwargs):
        self.objective = objective
        self.advantage_name, self.advantage_params, self.advantage_include_offpolicy = advantage
        self.mixer = mixer
        self._mixrl_rewards_per_func: torch.Tensor | None = None
        self._mixrl_normalisers: dict[str, tuple[float, float]] | None = None
        self._mixrl_global_sources: torch.Tensor | None = None
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------------ rewards
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._mixrl_rewards_per_func = rewards_per_func  # gathered over processes: [N_global, F]
        return rewards_per_func

    # ------------------------------------------------------------------ batch
    def _generate_and_score_completions(self, inputs):
        self._mixrl_global_sources = None  # a mixer's injection hook sets it during generation
        out = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        device = self.accelerator.device
        rpf = self._mixrl_rewards_per_func
        rewards = (rpf * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)
        n_global = rewards.shape[0]
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        sources = self._mixrl_global_sources
        if sources is None:
            sources = torch.full((n_global,), ON_POLICY, dtype=torch.long, device=device)
        group_ids = torch.arange(n_global, device=device) // num_generations
        include = None if self.advantage_include_offpolicy else sources != EXPERT
        from mixrl.core import ADVANTAGES

        advantages = ADVANTAGES.get(self.advantage_name)(rewards, group_ids, include=include, **self.advantage_params)
        advantages = torch.nan_to_num(advantages, nan=0.0)
        n_local = out["completion_ids"].shape[0]
        start = self.accelerator.process_index * n_local
        out["advantages"] = advantages[start : start + n_local]
        out["row_source"] = sources[start : start + n_local]

        on = sources != EXPERT
        primary = rpf[:, 0]
        self._metrics[mode]["accuracy"].append(float((primary[on] >= 1.0 - 1e-6).float().mean()) if on.any() else 0.0)
        self._metrics[mode]["reward_on_policy"].append(float(rewards[on].mean()) if on.any() else 0.0)
        self._metrics[mode]["expert/rows"].append(float((~on).sum()))

        if self.mixer is not None and mode == "train":
            out = self.mixer.after_scoring(self, inputs, out)
        self._mixrl_normalisers = self._global_counts(out)
        return out

    def _global_counts(self, out) -> dict[str, tuple[float, float]]:
        """Effective (tokens, rows) per row source that each micro-batch loss divides by.

        DDP averages gradients over W processes and each process adds up its
        gradient-accumulation micro-batches, so dividing local sums by N_global / W makes the
        step's gradient that of the global mean, whatever W and the accumulation are.
        """
        mask = out["completion_mask"].float()
        expert = (out["row_source"] == EXPERT).float().unsqueeze(1)
        stats = []
        for m in (mask * (1 - expert), mask * expert, mask):
            stats += [m.sum(), (m.sum(-1) > 0).float().sum()]
        totals = self.accelerator.reduce(torch.stack(stats), reduction="sum")
        w = float(self.accelerator.num_processes)
        t = (totals / w).tolist()
        return {"on_policy": (t[0], t[1]), "expert": (t[2], t[3]), "all": (t[4], t[5])}

    # ------------------------------------------------------------------ loss
    def _compute_loss(self, model, inputs):
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True
        )
        mode = "train" if self.model.training else "eval"
        loss, metrics = compute_objective(
            self.objective,
            logp=logps,
            mask=completion_mask,
            advantages=inputs["advantages"],
            row_source=inputs.get("row_source"),
            old_logp=inputs.get("old_per_token_logps"),
            ref_logp=inputs.get("ref_per_token_logps"),
            entropies=entropies,
            step=self.state.global_step,
            normalisers=self._mixrl_normalisers if mode == "train" else None,
        )
        # loss/* parts are partial sums over this micro-batch: scale so TRL's mean over
        # micro-batches reports the whole step's value
        parts = self.current_gradient_accumulation_steps if mode == "train" else 1
        for key, value in metrics.items():
            self._metrics[mode][key].append(value * parts if key.startswith("loss/") else value)
        return loss
