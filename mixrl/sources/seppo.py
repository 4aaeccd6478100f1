"""SePPO's pairs: the prompt's demonstration (the winner anchor) against a completion sampled by a
previous checkpoint of the policy, which is also the reference of the pair's loss this step.

"SePPO: Semi-Policy Preference Optimization for Diffusion Alignment" (Zhang et al., arXiv
2410.05255) trains on winning samples only (no paired human data, no reward model): every K
updates the policy is saved; each step a saved checkpoint is drawn at random (all previous ones,
the initial one included) as the reference model, it generates the "reference sample" of the
prompt, and a DPO-form loss contrasts the winner with it, its sign flipped (the reference sample
treated as a winner) when the reference model fits the winner better than the policy does: the
Anchor-based Adaptive Flipper (the ``seppo`` term, :mod:`mixrl.core.preference_losses`).

Here the checkpoints are CPU copies of the policy's trainable weights kept by this injection
(its state, one file per process); the drawn one is loaded into the trainer's reference model
(``InjectContext.ref_model``) before the pair's reference log-probs are computed, so every term
that reads ``ref_logp`` this step sees that checkpoint. The reference sample is drawn on this
process with the unwrapped reference model (not through vLLM; a sharded FSDP / ZeRO-3 reference
cannot take the copy).
"""

from __future__ import annotations

import random

import torch

from mixrl.errors import ConfigError
from mixrl.sources.base import INJECTIONS, InjectContext
from mixrl.sources.nash_md import sample_mixture
from mixrl.sources.pair_builders import SpinPairs, local_groups, whole_micro_batches
from mixrl.sources.pair_rows import Side, append_sides, row_side
from mixrl.sources.pairs import PAIR_OFF_POLICY


def _params(model) -> dict[str, torch.Tensor]:
    return {n: p for n, p in getattr(model, "module", model).named_parameters()}


@INJECTIONS.register("seppo_pairs", bounds={
    "pairs": (">= 1", "pairs appended per step, all processes"),
    "save_every": (">= 1", "optimizer steps between two saved checkpoints"),
    "keep": (">= 1", "checkpoints kept (the newest; the initial one always)"),
    "temperature": ("> 0", "the reference model's sampling temperature"),
})
class SeppoPairs(SpinPairs):
    """SePPO's pairs: the prompt's demonstration (chosen, the winner anchor) against a completion
    sampled by a previous checkpoint of the policy, drawn at random each step, which is the
    reference model of the step.

    Formula: checkpoints pi_0, pi_{s}, pi_{2s}, ... (s = {save_every}; the initial one and the newest {keep}); each step pi_ref ~ Uniform(checkpoints); y_w = the demonstration of x, y_ref ~ pi_ref(.|x) at T = {temperature}; up to {pairs} pairs per step
    Paper: SePPO, "SePPO: Semi-Policy Preference Optimization for Diffusion Alignment" (arXiv 2410.05255): previous
    checkpoints as reference models generate the on-policy reference samples that replace the losing images
    (the authors' DwanZhang-AI/SePPO publishes no training code).

    Parameters:
        pairs (8): pairs per optimizer step, all processes (a multiple of the processes).
        save_every (20): optimizer steps between saved checkpoints (the paper saves every 30 updates).
        keep (7): checkpoints kept besides the initial one (the paper's K = 7).
        temperature (1.0): the reference model's sampling temperature (the preset reads trainer.temperature).
    """

    state_in_file = True
    provenances = ("pair_off_policy",)

    def __init__(self, *, pairs: int = 8, save_every: int = 20, keep: int = 7, temperature: float = 1.0,
                 source=None, geometry=None, seed: int = 0):
        super().__init__(pairs=pairs, source=source, geometry=geometry, seed=seed)
        if int(save_every) < 1 or int(keep) < 1 or not float(temperature) > 0:
            raise ConfigError(f"seppo_pairs: save_every={save_every} and keep={keep} must be >= 1, temperature={temperature} > 0")
        self.save_every, self.keep, self.temperature = int(save_every), int(keep), float(temperature)
        self.checkpoints: dict[int, dict[str, torch.Tensor]] = {}  # optimizer step -> CPU copy of the trainable weights

    # ---------------------------------------------------------------- checkpoints
    def _keep_checkpoint(self, policy, step: int) -> None:
        if step in self.checkpoints or (self.checkpoints and step % self.save_every):
            return
        self.checkpoints[step] = {n: p.detach().to("cpu", copy=True) for n, p in _params(policy).items() if p.requires_grad}
        later = sorted(s for s in self.checkpoints if s != min(self.checkpoints))
        for s in later[: max(len(later) - self.keep, 0)]:
            del self.checkpoints[s]

    def _draw(self, ctx: InjectContext) -> int:
        """The checkpoint of this step: the same on every process (the run's seed and the step)."""
        rng = random.Random(f"seppo:{self.seed}:{ctx.global_step}")
        return rng.choice(sorted(self.checkpoints))

    @staticmethod
    def load_into(model, weights: dict[str, torch.Tensor]) -> None:
        params = _params(model)
        missing = [n for n in weights if n not in params]
        if missing:
            raise RuntimeError(f"seppo_pairs: the reference model has no parameter {missing[0]} of the policy's checkpoint")
        with torch.no_grad():
            for n, w in weights.items():
                params[n].copy_(w.to(params[n].device, params[n].dtype))

    # ---------------------------------------------------------------- the pairs
    def after_advantages(self, ctx: InjectContext, inputs: list[dict], out: dict) -> dict:
        if ctx.ref_model is None:
            raise RuntimeError("algo.inject=seppo_pairs loads previous checkpoints into the reference model, but the trainer "
                               "has no separate reference model (model.lora.enabled=true?)")
        self._keep_checkpoint(ctx.policy, ctx.global_step)
        drawn = self._draw(ctx)
        self.load_into(ctx.ref_model, self.checkpoints[drawn])
        rng = self._rng(ctx)
        per_process = self.pairs // max(ctx.num_processes, 1)
        picks, missing = [], 0
        for g, members in local_groups(ctx, out).items():
            demos = self.source.for_prompt(inputs[members[0]]) if members[0] < len(inputs) else []
            if not demos:
                missing += 1
                continue
            picks.append((members[0], ctx.completion_ids(demos[rng.randrange(len(demos))])))
        if len(picks) > per_process:
            picks = sorted(rng.sample(picks, per_process))
        picks = picks[: whole_micro_batches(len(picks), self.geometry)]
        self.metrics = {"pairs/on_policy": 0.0, "pairs/off_policy": float(len(picks)), "pairs/seppo": float(len(picks)),
                        "pairs/seppo_no_demo": float(missing), "seppo/reference_step": float(drawn),
                        "seppo/checkpoints": float(len(self.checkpoints))}
        if not picks:
            return out
        gen = torch.Generator(device=next(ctx.ref_model.parameters()).device)
        gen.manual_seed(rng.getrandbits(63))
        sides = []
        for i, demo in picks:
            prompt = row_side(out, i, PAIR_OFF_POLICY).prompt
            ref_sample = sample_mixture(ctx.ref_model, ctx.ref_model, prompt, 1, coef=1.0, temperature=self.temperature,
                                        max_new_tokens=ctx.max_completion_length, eos_token_id=ctx.tokenizer.eos_token_id,
                                        generator=gen)[0]
            sides += [Side(prompt=prompt, completion=demo, code=PAIR_OFF_POLICY),
                      Side(prompt=prompt, completion=ref_sample, code=PAIR_OFF_POLICY)]
        return append_sides(ctx, out, sides)

    def state_dict(self) -> dict:
        return {"checkpoints": self.checkpoints}

    def load_state_dict(self, state: dict) -> None:
        self.checkpoints = dict(state.get("checkpoints") or {})


def check_seppo(cfg) -> None:
    """One-line errors for SePPO settings that cannot run: the flip choice of a seppo term, and
    the reference model the checkpoints are loaded into."""
    from mixrl.core.preference_losses import SEPPO_FLIPS  # deferred: config validation imports this module early

    for label, node in (cfg.algo.get("terms") or {}).items():
        if node is not None and node.get("name") == "seppo" and node.get("flip", "sign") not in SEPPO_FLIPS:
            raise ConfigError(f"algo.terms.{label}.flip={node.get('flip')} must be one of {', '.join(SEPPO_FLIPS)}")
    inject = cfg.algo.get("inject") or {}
    if inject.get("name") == "seppo_pairs" and bool(cfg.model.get("lora", {}).get("enabled", False)):
        raise ConfigError("algo.inject=seppo_pairs loads previous checkpoints into a separate reference model, but with "
                          "model.lora.enabled=true the reference is the adapter-less policy; set model.lora.enabled=false")
