"""ALP's layerwise perturbation (``algo.perturbation``): noise on the input hidden states of every
decoder layer in the loss forward, so the policy in the ratio's numerator is the perturbed one.

:class:`LayerPerturbation` adds, before each decoder layer, ``sigma * rms(h) * eps`` to its input
hidden states ``h`` (``rms`` per token over the hidden size, not differentiated; ``eps ~ N(0, I)``
fresh each forward). It acts only in forwards that build a graph on a model in training mode, the
loss's: generation, the behaviour, old-policy and reference log-probs run without gradient, so
the ratio is ``pi_perturbed / pi_inference`` as ALP's is. Gradient checkpointing would recompute
a layer with new noise in the backward pass: refused at config time.

Paper: "Adaptive Layerwise Perturbation: Unifying Off-Policy Corrections for LLM RL" (Ye et al.
2026, arXiv 2603.19470). Our reading (from the abstract; the authors' code was not found): the perturbation
is Gaussian with a fixed scale relative to each token's hidden-state RMS (``sigma``); the paper's
perturbations are learnable (adapted during the update), which is not implemented.

Owns: the hooks it registered (nothing to checkpoint). Receives sigma at construction and the
model at :meth:`LayerPerturbation.attach`.
"""

from __future__ import annotations

import torch
from torch import nn


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's decoder layers: the first ``ModuleList`` of one repeated class named ``*Layer``
    or ``*Block`` (``model.model.layers`` for Qwen2 / Llama)."""
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module):
            kinds = {type(m).__name__ for m in module}
            if len(kinds) == 1 and (next(iter(kinds)).endswith("Layer") or next(iter(kinds)).endswith("Block")):
                return list(module)
    return []


class LayerPerturbation:
    """``h <- h + sigma * sg(rms(h)) * eps`` before every decoder layer, in gradient-building forwards."""

    def __init__(self, *, sigma: float, generator: torch.Generator | None = None):
        if not sigma > 0:
            raise ValueError(f"perturbation: sigma must be > 0, got {sigma}")
        self.sigma = float(sigma)
        self.generator = generator
        self.handles: list = []

    def noise_like(self, h: torch.Tensor) -> torch.Tensor:
        eps = torch.randn(h.shape, generator=self.generator, dtype=h.dtype, device="cpu" if self.generator is not None else h.device)
        rms = h.detach().float().pow(2).mean(-1, keepdim=True).sqrt().to(h.dtype)
        return self.sigma * rms * eps.to(h.device)

    def _hook(self, module, args, kwargs):
        if not (module.training and torch.is_grad_enabled()):
            return None
        if args:
            return (args[0] + self.noise_like(args[0]), *args[1:]), kwargs
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + self.noise_like(kwargs["hidden_states"])}
        return None

    def attach(self, model: nn.Module) -> int:
        """Hook every decoder layer of ``model``; returns how many."""
        layers = decoder_layers(model)
        if not layers:
            raise ValueError(f"perturbation: no decoder layers found in {type(model).__name__}")
        self.handles = [layer.register_forward_pre_hook(self._hook, with_kwargs=True) for layer in layers]
        return len(self.handles)

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


def add_perturbation(trainer, cfg) -> LayerPerturbation | None:
    """Hook ``trainer.model``'s decoder layers when ``algo.perturbation`` is set; the hooks stay
    for the run (they act only in gradient-building forwards)."""
    spec = cfg.algo.get("perturbation")
    if spec is None:
        return None
    part = LayerPerturbation(sigma=float(spec.get("sigma", 0.01)))
    part.attach(trainer.model)
    return part
