"""``MixrlGRPOTrainer``: the one place that touches TRL internals.

TRL's ``GRPOTrainer`` generates a group of completions per prompt, scores them, and
optimises a loss. mixrl keeps its generation, scoring, buffering and logging, and
replaces these methods (each listed in ``OVERRIDDEN``; their parent signatures are
pinned by ``tests/test_trl_contract.py``):

* ``_generate_and_score_completions``: runs the injections' hooks around TRL's own
  generation and scoring (``before_generation``, then TRL, then ``after_rewards``,
  the configured ``mixrl.core`` advantage, ``after_advantages``), and adds the provenance
  fields of :mod:`mixrl.sources.rows` (per-row and per-token sources, behaviour log-probs,
  group ids) plus the global token/row counts that normalise every term.
* ``_generate_single_turn``: the ``after_generation`` hook (replace or extend completions
  before they are scored); skips generation when an injection writes every completion.
* ``_calculate_rewards``: keeps the gathered reward matrix of the generation batch.
* ``_compute_loss``: one forward per kind of row (each trimmed to its own completion
  width), then ``mixrl.core.compute_objective``; a controller may set knobs first.
* ``_save_checkpoint`` / ``_load_optimizer_and_scheduler``: controller and source state
  travel with checkpoints (an injection with ``state_in_file``, e.g. a replay buffer, in a
  ``torch.save`` file of its own per process).

``staleness = k`` (``trainer.staleness``): every generation batch is sampled by the weights
as they were k optimizer steps earlier (CPU snapshots of the trainable parameters, swapped in
for generation and swapped back; the first k steps use the oldest snapshot, the initial
weights), and the rollouts' behaviour log-probs (``old_per_token_logps``) are that lagged
policy's, from a no-grad forward under the same weights. Deterministic; one machine.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import torch
from trl import GRPOTrainer

from mixrl.core import provenance as prov
from mixrl.core.objective import Objective, compute_objective, population_key
from mixrl.sources.base import InjectContext, Rollouts

OVERRIDDEN = (
    "_generate_single_turn",
    "_calculate_rewards",
    "_generate_and_score_completions",
    "_compute_loss",
    "_save_checkpoint",
    "_load_optimizer_and_scheduler",
)
STATE_FILE = "mixrl_state.json"


class MixrlGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose advantage and loss come from ``mixrl.core`` registries.

    Extra constructor arguments:
        objective: the :class:`mixrl.core.objective.Objective` built from ``cfg.algo``.
        advantage: ``(name, params, include_offpolicy)`` for ``mixrl.core.ADVANTAGES``.
        injections: ``mixrl.sources`` injections (each holding its source), called in order.
        controller: an optional ``mixrl.core.CONTROLLERS`` instance.
    """

    def __init__(
        self,
        *args,
        objective: Objective,
        advantage: tuple[str, dict, bool],
        injections: list | None = None,
        controller: Any = None,
        staleness: int = 0,
        **kwargs,
    ):
        self.objective = objective
        self.staleness = int(staleness)
        self._lag_snapshots: dict[int, dict[str, torch.Tensor]] = {}  # step -> CPU copy of the trainable weights
        self._lag_used = 0
        self.controller = controller
        self.injections = list(injections or [])
        self.advantage_name, self.advantage_params, self.advantage_include_offpolicy = advantage
        self.mixrl_rollouts = 0  # on-policy rollouts generated for training, all processes
        self.mixrl_generated_tokens = 0  # completion tokens of those rollouts (padding excluded), all processes
        self._mixrl_batch_inputs: list[dict] | None = None
        self._mixrl_rollouts: Rollouts | None = None
        self._mixrl_rewards_per_func: torch.Tensor | None = None
        self._mixrl_normalisers: dict[str, tuple[float, float]] | None = None
        self._entropy_window: list[float] = []  # step_end controllers: entropies of the step's micro-batches
        super().__init__(*args, **kwargs)

    def _inject_context(self) -> InjectContext:
        return InjectContext(
            tokenizer=self.processing_class,
            process_index=self.accelerator.process_index,
            num_processes=self.accelerator.num_processes,
            num_generations=self.num_generations,
            max_completion_length=self.max_completion_length,
            global_step=self.state.global_step,
            micro_step=self._step,
            device=self.accelerator.device,
            tokenize_prompts=lambda prompts: self._tokenize_prompts(prompts)[0],
            gather=self.accelerator.gather,
        )

    def _injecting(self) -> bool:
        return bool(self.injections) and self.model.training and self._mixrl_batch_inputs is not None

    # ------------------------------------------------------------------ generation
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        injecting = self._injecting()
        if injecting and any(inj.skips_generation for inj in self.injections):
            # every completion will be a source's: do not spend time generating rollouts
            completion_ids, logprobs = [[self.processing_class.eos_token_id] for _ in prompt_ids], None
        else:
            completion_ids, logprobs = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        rollouts = Rollouts(list(completion_ids), logprobs, [prov.ON_POLICY] * len(completion_ids))
        if injecting:
            ctx = self._inject_context()
            for inj in self.injections:
                rollouts = inj.after_generation(ctx, self._mixrl_batch_inputs, rollouts)
        self._mixrl_rollouts = rollouts
        return rollouts.completion_ids, rollouts.logprobs

    # ------------------------------------------------------------------ rewards
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._mixrl_rewards_per_func = rewards_per_func  # gathered over processes: [N_global, F]
        return rewards_per_func

    # ------------------------------------------------------------------ batch
    def _generate_and_score_completions(self, inputs):
        training = self.model.training
        if training and self.injections:
            ctx = self._inject_context()
            for inj in self.injections:
                inputs = inj.before_generation(ctx, inputs)
        self._mixrl_rollouts = None
        self._mixrl_batch_inputs = inputs
        lagged = training and self.staleness > 0
        try:
            with self._lagged_weights() if lagged else contextlib.nullcontext():
                out = super()._generate_and_score_completions(inputs)
                if lagged:
                    out["old_per_token_logps"] = self._behaviour_logps(out)
        finally:
            self._mixrl_batch_inputs = None
        mode = "train" if training else "eval"
        device = self.accelerator.device
        if lagged:
            self._metrics[mode]["staleness"].append(float(self._lag_used))
        self._add_provenance(out)
        rpf = self._mixrl_rewards_per_func
        rewards = (rpf * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)
        ctx = self._inject_context()
        if training:
            ctx.batch = out  # an injection may rewrite local rows (refill a group) before advantages
            for inj in self.injections:
                rewards = inj.after_rewards(ctx, inputs, rewards)
            ctx.batch = None
        n_global = rewards.shape[0]
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        sources = self.accelerator.gather(out["row_source"])
        group_ids = torch.arange(n_global, device=device) // num_generations
        policy_rows = _behaviour_is_policy(sources)
        include = None if self.advantage_include_offpolicy else policy_rows
        from mixrl.core import ADVANTAGES

        advantages = ADVANTAGES.get(self.advantage_name)(rewards, group_ids, include=include, **self.advantage_params)
        advantages = torch.nan_to_num(advantages, nan=0.0)
        n_local = out["completion_ids"].shape[0]
        start = self.accelerator.process_index * n_local
        out["advantages"] = advantages[start : start + n_local]
        out["group_id"] = group_ids[start : start + n_local]
        if training and self.injections:  # what a replay buffer stores with each rollout
            grouped = rewards.view(-1, num_generations)
            out["mixrl_reward"] = rewards[start : start + n_local].float()
            out["mixrl_group_mean"] = grouped.mean(1).repeat_interleave(num_generations)[start : start + n_local].float()
            out["mixrl_group_std"] = grouped.std(1).nan_to_num(0.0).repeat_interleave(num_generations)[start : start + n_local].float()

        primary = rpf[:, 0]
        on = sources == prov.ON_POLICY
        nan = float("nan")  # TRL's logger drops NaN: no on-policy rows (SFT) logs no accuracy
        self._metrics[mode]["accuracy"].append(float((primary[on] >= 1.0 - 1e-6).float().mean()) if on.any() else nan)
        self._metrics[mode]["reward_on_policy"].append(float(rewards[on].mean()) if on.any() else nan)
        if training:
            self.mixrl_rollouts += int(on.sum())
            local_on = out["row_source"] == prov.ON_POLICY
            gen = (out["completion_mask"].sum(dim=1).float() * local_on.float()).sum()
            self.mixrl_generated_tokens += int(self.accelerator.reduce(gen, reduction="sum"))
            for inj in self.injections:
                out = inj.after_advantages(ctx, inputs, out)
        for name in self.objective.selected():
            if name != "on_policy":
                n_rows = self.accelerator.reduce((out["row_source"] == prov.code(name)).sum().float(), reduction="sum")
                self._metrics[mode][f"{name}/rows"].append(float(n_rows))
        if training:
            self._log_injection_metrics(mode)
        self._mixrl_normalisers = self._global_counts(out)
        return out

    def _log_injection_metrics(self, mode: str) -> None:
        for inj in self.injections:
            for key, value in (getattr(inj, "metrics", None) or {}).items():
                self._metrics[mode][key].append(float(value))

    # ------------------------------------------------------------------ staleness
    def _trainable(self) -> dict[str, torch.Tensor]:
        model = self.accelerator.unwrap_model(self.model)
        return {n: p for n, p in model.named_parameters() if p.requires_grad}

    @contextlib.contextmanager
    def _lagged_weights(self):
        """Swap in the trainable weights of ``staleness`` optimizer steps ago (snapshots are
        taken at each generation, on CPU), then restore the current ones."""
        step = int(self.state.global_step)
        params = self._trainable()
        if step not in self._lag_snapshots:
            self._lag_snapshots[step] = {n: p.detach().to("cpu", copy=True) for n, p in params.items()}
        target = max(s for s in self._lag_snapshots if s <= max(step - self.staleness, min(self._lag_snapshots)))
        for s in [s for s in self._lag_snapshots if s < target]:
            del self._lag_snapshots[s]
        self._lag_used = step - target
        if target == step:
            yield
            return
        current = {n: p.detach().to("cpu", copy=True) for n, p in params.items()}
        try:
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(self._lag_snapshots[target][n].to(p.device))
            yield
        finally:
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(current[n].to(p.device))

    def _behaviour_logps(self, out: dict) -> torch.Tensor:
        """Per-token log-probs of the completions under the weights in place (the lagged
        ones): the rollouts' behaviour log-probs. TRL's own value is reused when it computed it."""
        if out.get("old_per_token_logps") is not None:
            return out["old_per_token_logps"]
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        att = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        with torch.no_grad():
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model, ids, att, out["completion_ids"].size(1), batch_size=self.args.per_device_train_batch_size
            )
        return logps

    def _add_provenance(self, out: dict) -> None:
        """``row_source``, ``token_source`` and ``behaviour_logp`` of the local rows, from the
        rollouts as the injections left them (all on-policy when nothing was injected)."""
        ids = out["completion_ids"]
        n, width = ids.shape
        rollouts = self._mixrl_rollouts
        if rollouts is None or len(rollouts.row_source) != n:
            rollouts = Rollouts([[]] * n, None, [prov.ON_POLICY] * n)
        row_source = torch.tensor(rollouts.row_source, dtype=torch.long, device=ids.device)
        token_source = row_source.unsqueeze(1).expand(n, width).clone()
        behaviour = torch.full((n, width), float("nan"), dtype=torch.float32, device=ids.device)
        for i in range(n):
            if rollouts.token_source[i] is not None:
                t = torch.as_tensor(rollouts.token_source[i][:width], dtype=torch.long, device=ids.device)
                token_source[i, : len(t)] = t
            if rollouts.behaviour_logp[i] is not None:
                b = torch.as_tensor(rollouts.behaviour_logp[i][:width], dtype=torch.float32, device=ids.device)
                behaviour[i, : len(b)] = b
        out["row_source"] = row_source
        out["token_source"] = token_source
        out["behaviour_logp"] = behaviour

    def _global_counts(self, out) -> dict[str, tuple[float, float]]:
        """Effective (tokens, rows) of each token population the objective normalises over.

        DDP averages gradients over W processes and each process adds up its
        gradient-accumulation micro-batches, so dividing local sums by N_global / W makes the
        step's gradient that of the global mean, whatever W and the accumulation are.
        """
        mask = out["completion_mask"].bool()
        stats = []
        pops = self.objective.populations()
        for pop in pops:
            m = (mask & prov.select(out["token_source"], pop)).float()
            stats += [m.sum(), (m.sum(-1) > 0).float().sum()]
        totals = self.accelerator.reduce(torch.stack(stats), reduction="sum")
        t = (totals / float(self.accelerator.num_processes)).tolist()
        return {population_key(p): (t[2 * i], t[2 * i + 1]) for i, p in enumerate(pops)}

    # ------------------------------------------------------------------ controllers
    def _reduce_sum(self):
        return (lambda t: self.accelerator.reduce(t, "sum")) if self.accelerator.num_processes > 1 else None

    def _controller_step_start(self, logps, inputs) -> None:
        """``step_start`` controllers (BAPO) decide on the first micro-batch of each step from
        the policy term's tokens (ratios and advantages summed over processes)."""
        c = self.controller
        if c is None or c.when != "step_start" or self._step % self.current_gradient_accumulation_steps != 0:
            return
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        tokens = next((t.tokens for t in self.objective.terms if t.kind == "policy"), ("on_policy",))
        sel = inputs["completion_mask"].bool() & prov.select(inputs["token_source"], tokens)
        ratio = torch.exp((logps.detach() - torch.where(sel, old, logps.detach())).clamp(-20, 20))
        c.step({"ratio": ratio, "advantages": inputs["advantages"], "mask": sel.float()}, reduce=self._reduce_sum())

    def _controller_step_end(self, metrics: dict) -> None:
        """``step_end`` controllers (EntroPIC) see the step's mean entropy after its last micro-batch."""
        c = self.controller
        if c is None or c.when != "step_end":
            return
        self._entropy_window.append(metrics.get("entropy", 0.0))
        if self.accelerator.sync_gradients:
            window = torch.tensor(self._entropy_window, dtype=torch.float32, device=self.accelerator.device).mean()
            window = self.accelerator.reduce(window, "mean")
            c.step({"entropy": float(window)})
            self._entropy_window = []

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if (self.controller is not None or self.injections) and self.args.should_save:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            state = {
                "controller": self.controller.state_dict() if self.controller is not None else None,
                "injections": [{"state_file": f"mixrl_injection{i}"} if inj.state_in_file else inj.state_dict()
                               for i, inj in enumerate(self.injections)],
            }
            with open(os.path.join(folder, STATE_FILE), "w") as f:
                json.dump(state, f)
        if any(inj.state_in_file for inj in self.injections):  # every process saves its own (its buffer)
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            os.makedirs(folder, exist_ok=True)
            rank = self.accelerator.process_index
            for i, inj in enumerate(self.injections):
                if inj.state_in_file:
                    torch.save(inj.state_dict(), os.path.join(folder, f"mixrl_injection{i}_rank{rank}.pt"))

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        path = os.path.join(checkpoint, STATE_FILE) if checkpoint else None
        if path and os.path.exists(path):
            with open(path) as f:
                state = json.load(f)
            if self.controller is not None and state.get("controller") is not None:
                self.controller.load_state_dict(state["controller"])
            for inj, s in zip(self.injections, state.get("injections") or []):
                if isinstance(s, dict) and "state_file" in s:
                    path = os.path.join(checkpoint, f"{s['state_file']}_rank{self.accelerator.process_index}.pt")
                    if not os.path.exists(path):
                        from mixrl.errors import ConfigError

                        raise ConfigError(
                            f"resume: {path} is missing (the checkpoint was saved by fewer processes); resume with "
                            "the same hardware.num_processes")
                    s = torch.load(path, weights_only=True)
                inj.load_state_dict(s)

    # ------------------------------------------------------------------ loss
    def _forward_by_row_kind(self, model, inputs):
        """Per-token log-probs and entropies. Rows the injections appended or wrote (another
        ``row_source`` than the rollouts) get a forward of their own, trimmed to their longest
        completion, so they cost their own tokens rather than the rollouts' padded width.
        Rows are independent: the values are those of one forward over the micro-batch, up
        to float rounding (measured: equal to 1e-6 on the pinned cases)."""
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        kinds = inputs["row_source"].unique()
        if len(kinds) == 1:
            ids = torch.cat([prompt_ids, completion_ids], dim=1)
            att = torch.cat([prompt_mask, completion_mask], dim=1)
            logps, entropies, _ = self._get_per_token_logps_and_entropies(
                model, ids, att, completion_ids.size(1), compute_entropy=True
            )
            return logps, entropies
        logps = entropies = None
        for kind in kinds:
            rows = torch.nonzero(inputs["row_source"] == kind).squeeze(1)
            w = completion_ids.size(1)
            if int(kind) != prov.ON_POLICY:
                w = int(completion_mask[rows].sum(-1).max().clamp(min=1))
            ids = torch.cat([prompt_ids[rows], completion_ids[rows, :w]], dim=1)
            att = torch.cat([prompt_mask[rows], completion_mask[rows, :w]], dim=1)
            lp, ent, _ = self._get_per_token_logps_and_entropies(model, ids, att, w, compute_entropy=True)
            if logps is None:
                logps = lp.new_zeros(completion_ids.shape)
                entropies = ent.new_zeros(completion_ids.shape)
            cols = torch.arange(w, device=rows.device).unsqueeze(0)
            logps = logps.index_put((rows.unsqueeze(1), cols), lp)
            entropies = entropies.index_put((rows.unsqueeze(1), cols), ent)
        return logps, entropies

    def _first_pass(self) -> bool:
        """Is this micro-batch seen for the first time (not a later ``num_iterations`` pass)?"""
        generate_every = self.args.steps_per_generation * self.num_iterations
        return self._step % generate_every < self.args.steps_per_generation

    def _compute_loss(self, model, inputs):
        logps, entropies = self._forward_by_row_kind(model, inputs)
        mode = "train" if self.model.training else "eval"
        if mode == "train":
            self._controller_step_start(logps, inputs)
            if self.injections and self._first_pass():
                # the rollouts' behaviour log-probs, exactly what the policy term divides by
                old = inputs.get("old_per_token_logps")
                old = logps.detach() if old is None else old
                ctx = self._inject_context()
                for inj in self.injections:
                    inj.after_forward(ctx, inputs, old)
        knobs = self.controller.knobs() if (self.controller is not None and mode == "train") else None
        loss, metrics = compute_objective(
            self.objective,
            logp=logps,
            mask=inputs["completion_mask"],
            advantages=inputs["advantages"],
            token_source=inputs["token_source"],
            old_logp=inputs.get("old_per_token_logps"),
            behaviour_logp=inputs.get("behaviour_logp"),
            ref_logp=inputs.get("ref_per_token_logps"),
            teacher_logp=inputs.get("teacher_logp"),
            entropies=entropies,
            step=self.state.global_step,
            normalisers=self._mixrl_normalisers if mode == "train" else None,
            knobs=knobs,
        )
        if mode == "train":
            self._controller_step_end(metrics)
        if self.controller is not None:
            metrics.update(self.controller.metrics())
        # loss/* parts are partial sums over this micro-batch: scale so TRL's mean over
        # micro-batches reports the whole step's value
        parts = self.current_gradient_accumulation_steps if mode == "train" else 1
        for key, value in metrics.items():
            self._metrics[mode][key].append(value * parts if key.startswith("loss/") else value)
        return loss


def _behaviour_is_policy(row_source: torch.Tensor) -> torch.Tensor:
    """Rows whose provenance was sampled by the policy (they form the groups' statistics)."""
    policy_codes = [prov.code(n) for n in prov.provenance_names() if prov.provenance(n).behaviour == "policy"]
    return torch.isin(row_source, torch.tensor(policy_codes, dtype=row_source.dtype, device=row_source.device))
