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
* ``_generate_single_turn``: lets the mixer replace rollouts by expert completions
  before they are scored (group injection).
* ``_compute_loss``: one forward over the micro-batch, then ``mixrl.core.compute_objective``;
  a controller (BAPO clip bounds, EntroPIC entropy coefficient) may set knobs first.
* ``_save_checkpoint`` / ``_load_optimizer_and_scheduler``: controller state travels
  with checkpoints.
"""

from __future__ import annotations

import json
import os

from typing import Any

import torch
from trl import GRPOTrainer

from mixrl.core.objective import EXPERT, ON_POLICY, ObjectiveSpec, compute_objective

OVERRIDDEN = (
    "_generate_single_turn",
    "_calculate_rewards",
    "_generate_and_score_completions",
    "_compute_loss",
    "_save_checkpoint",
    "_load_optimizer_and_scheduler",
)
CONTROLLER_STATE_FILE = "mixrl_controller_state.json"


class MixrlGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose advantage and loss come from ``mixrl.core`` registries.

    Extra constructor arguments:
        objective: the ``ObjectiveSpec`` built from ``cfg.algo``.
        advantage: ``(name, params, include_offpolicy)`` for ``mixrl.core.ADVANTAGES``.
        mixer: an optional ``mixrl.trainer.mixing`` mixer that injects off-policy rows.
        controller: an optional ``mixrl.core.CONTROLLERS`` instance (bapo or entropic).
    """

    def __init__(
        self,
        *args,
        objective: ObjectiveSpec,
        advantage: tuple[str, dict, bool],
        mixer: Any = None,
        controller: Any = None,
        **kwargs,
    ):
        self.objective = objective
        self.controller = controller
        self._mixrl_batch_inputs: list[dict] | None = None
        self._entropy_window: list[float] = []  # entropies of the step's micro-batches (EntroPIC)
        self.mixrl_rollouts = 0  # on-policy rollouts generated for training, all processes
        self.advantage_name, self.advantage_params, self.advantage_include_offpolicy = advantage
        self.mixer = mixer
        self._mixrl_rewards_per_func: torch.Tensor | None = None
        self._mixrl_normalisers: dict[str, tuple[float, float]] | None = None
        self._mixrl_global_sources: torch.Tensor | None = None
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------------ generation
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if self.mixer is not None and self.model.training and getattr(self.mixer, "replaces_all", False):
            # every completion will be an expert's: do not spend time generating rollouts
            completion_ids, logprobs = [[self.processing_class.eos_token_id] for _ in prompt_ids], None
        else:
            completion_ids, logprobs = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        if self.mixer is not None and self.model.training and self._mixrl_batch_inputs is not None:
            completion_ids, logprobs = self.mixer.rewrite_completions(self, self._mixrl_batch_inputs, completion_ids, logprobs)
        return completion_ids, logprobs

    # ------------------------------------------------------------------ rewards
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._mixrl_rewards_per_func = rewards_per_func  # gathered over processes: [N_global, F]
        return rewards_per_func

    # ------------------------------------------------------------------ batch
    def _generate_and_score_completions(self, inputs):
        self._mixrl_global_sources = None  # a mixer's injection hook sets it during generation
        self._mixrl_batch_inputs = inputs
        try:
            out = super()._generate_and_score_completions(inputs)
        finally:
            self._mixrl_batch_inputs = None
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
        nan = float("nan")  # TRL's logger drops NaN: no on-policy rows (SFT) logs no accuracy
        self._metrics[mode]["accuracy"].append(float((primary[on] >= 1.0 - 1e-6).float().mean()) if on.any() else nan)
        self._metrics[mode]["reward_on_policy"].append(float(rewards[on].mean()) if on.any() else nan)
        if mode == "train":
            self.mixrl_rollouts += int(on.sum())
        if self.mixer is not None and mode == "train":
            out = self.mixer.after_scoring(self, inputs, out)
        n_expert = self.accelerator.reduce((out["row_source"] == EXPERT).sum().float(), reduction="sum")
        self._metrics[mode]["expert/rows"].append(float(n_expert))
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

    # ------------------------------------------------------------------ controllers
    def _controller_overrides(self, logps, old_logp, inputs, mask) -> dict | None:
        """BAPO: choose the step's clip bounds on its first micro-batch (ratios and
        advantages of that micro-batch, summed over processes); later micro-batches reuse them."""
        if self.controller is None or not hasattr(self.controller, "rho0"):
            return None
        if self._step % self.current_gradient_accumulation_steps != 0:
            return {"clip_low": self.controller.clip_low, "clip_high": self.controller.clip_high}
        from mixrl.core.objective import EXPERT

        old = logps.detach() if old_logp is None else old_logp
        ratio = torch.exp((logps.detach() - old).clamp(-20, 20))
        on = (inputs["row_source"] != EXPERT).float().unsqueeze(1) if "row_source" in inputs else 1.0
        reduce = (lambda t: self.accelerator.reduce(t, "sum")) if self.accelerator.num_processes > 1 else None
        clip_low, clip_high = self.controller.update(ratio, inputs["advantages"], mask * on, reduce=reduce)
        return {"clip_low": clip_low, "clip_high": clip_high}

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.controller is not None and self.args.should_save:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            with open(os.path.join(folder, CONTROLLER_STATE_FILE), "w") as f:
                json.dump({"controller": self.controller.state_dict(), "entropy_coef": self.objective.entropy_coef}, f)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        path = os.path.join(checkpoint, CONTROLLER_STATE_FILE) if checkpoint else None
        if self.controller is not None and path and os.path.exists(path):
            with open(path) as f:
                state = json.load(f)
            self.controller.load_state_dict(state["controller"])
            self.objective.entropy_coef = state["entropy_coef"]

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
        old_logp = inputs.get("old_per_token_logps")
        overrides = self._controller_overrides(logps, old_logp, inputs, completion_mask) if mode == "train" else None
        loss, metrics = compute_objective(
            self.objective,
            logp=logps,
            mask=completion_mask,
            advantages=inputs["advantages"],
            row_source=inputs.get("row_source"),
            old_logp=old_logp,
            ref_logp=inputs.get("ref_per_token_logps"),
            entropies=entropies,
            step=self.state.global_step,
            normalisers=self._mixrl_normalisers if mode == "train" else None,
            policy_overrides=overrides,
        )
        if mode == "train" and self.controller is not None and hasattr(self.controller, "target"):
            self._entropy_window.append(metrics.get("entropy", 0.0))
            if self.accelerator.sync_gradients:  # last micro-batch of the step: update the PI controller
                window = self.accelerator.reduce(torch.tensor(self._entropy_window, device=logps.device).mean(), "mean")
                self.objective.entropy_coef = float(self.controller.update(float(window)))
                self._entropy_window = []
        if self.controller is not None:
            metrics.update(self.controller.metrics())
        # loss/* parts are partial sums over this micro-batch: scale so TRL's mean over
        # micro-batches reports the whole step's value
        parts = self.current_gradient_accumulation_steps if mode == "train" else 1
        for key, value in metrics.items():
            self._metrics[mode][key].append(value * parts if key.startswith("loss/") else value)
        return loss
