"""Token weights for (off-policy) likelihood terms (axis A4, ``weighting/``).

Signature of every registered weight::

    fn(logp, *, cutoff=None, <params>) -> Tensor [B, T]   # ALWAYS detached

``p = exp(logp)`` is the current policy's probability of the given token. The weighted
SFT loss is ``-sg(w(p)) * log p``. ``cutoff``: tokens with ``p > cutoff`` get weight 0
(CHORD's optional cutoff: already-learned tokens get no gradient).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mixrl.core.registry import Registry

TOKEN_WEIGHTS = Registry("token weight")


def _apply_cutoff(weight: Tensor, p: Tensor, cutoff: float | None) -> Tensor:
    if cutoff is not None:
        weight = torch.where(p > cutoff, torch.zeros_like(weight), weight)
    return weight.detach()


@TOKEN_WEIGHTS.register("one", bounds={"cutoff": ("[0, 1]", "a probability")})
def one(logp: Tensor, *, cutoff: float | None = None) -> Tensor:
    """Uniform weight: ``w = 1`` (plain SFT, ``-log p``).

    Formula: ``w(p) = 1``, 0 where p > {cutoff|1 (no cutoff)}

    Paper: supervised fine-tuning; CHORD with phi off (CHORD-mu), "On-Policy RL Meets
    Off-Policy Experts: Harmonizing Supervised Fine-Tuning and Reinforcement Learning via
    Dynamic Weighting".

    Parameters:
        cutoff (None): tokens with p > cutoff get weight 0.
    """
    logp = logp.detach()
    return _apply_cutoff(torch.ones_like(logp), logp.exp(), cutoff)


@TOKEN_WEIGHTS.register("p", bounds={"cutoff": ("[0, 1]", "a probability")})
def prob(logp: Tensor, *, cutoff: float | None = None) -> Tensor:
    """Probability weight (IS-SFT): ``w = sg(p)``; loss ``-sg(p) log p``.

    Formula: ``w(p) = sg(p)``, 0 where p > {cutoff|1 (no cutoff)}

    Paper: the SFT-IS baseline of CHORD ("On-Policy RL Meets Off-Policy Experts:
    Harmonizing Supervised Fine-Tuning and Reinforcement Learning via Dynamic Weighting").

    Parameters:
        cutoff (None): tokens with p > cutoff get weight 0.
    """
    p = logp.detach().exp()
    return _apply_cutoff(p, p, cutoff)


@TOKEN_WEIGHTS.register("chord_phi", bounds={"cutoff": ("[0, 1]", "a probability")})
def chord_phi(logp: Tensor, *, cutoff: float | None = None) -> Tensor:
    """CHORD-phi: ``w = sg(p (1 - p))``, peaks at p = 0.5 with value 1/4.

    Down-weights tokens the policy already knows (p -> 1) and tokens far from it (p -> 0).

    Formula: ``w(p) = sg(p (1 - p))``, 0 where p > {cutoff|1 (no cutoff)}

    Paper: CHORD with phi on, "On-Policy RL Meets Off-Policy Experts: Harmonizing
    Supervised Fine-Tuning and Reinforcement Learning via Dynamic Weighting".

    Parameters:
        cutoff (None): tokens with p > cutoff get weight 0.
    """
    p = logp.detach().exp()
    return _apply_cutoff(p * (1.0 - p), p, cutoff)


@TOKEN_WEIGHTS.register("chord_phi_clamp", bounds={"cutoff": ("(0, 1]", "a probability; log p is clamped at log(cutoff), so it must be > 0")})
def chord_phi_clamp(logp: Tensor, *, cutoff: float | None = None) -> Tensor:
    """CHORD-phi with Trinity-RFT's cutoff: ``w = sg(p (1 - p))`` and ``log p`` clamped at ``log(cutoff)``.

    Formula: ``w(p) = sg(p (1 - p))``; the nll term uses ``min(log p, log c)``, c = {cutoff|1 (no cutoff)}

    Trinity-RFT's ``sft_phi`` (``cutoff_prob``) keeps the weight of a token above the cutoff
    and clamps its log-probability instead: the token adds the constant
    ``-p (1 - p) log(cutoff)`` to the loss, with zero gradient. ``chord_phi`` with a cutoff
    gives it weight 0 (loss 0, zero gradient). The gradients are the same everywhere; only
    the loss value differs. The ``nll`` term reads ``clamps_logp`` to apply the clamp.

    Paper: CHORD, "On-Policy RL Meets Off-Policy Experts: Harmonizing Supervised Fine-Tuning
    and Reinforcement Learning via Dynamic Weighting" (arXiv 2508.11408), as shipped in
    Trinity-RFT (``sft_phi``).

    Parameters:
        cutoff (None): log p is clamped at log(cutoff) in the nll term (tokens with p > cutoff get no gradient).
    """
    return (logp.detach().exp() * (1.0 - logp.detach().exp())).detach()


#: the nll term clamps log p at log(cutoff) instead of zeroing the weight (Trinity-RFT's cutoff)
chord_phi_clamp.clamps_logp = True


def clamped_logp(logp: Tensor, cutoff: float | None) -> Tensor:
    """``min(log p, log cutoff)`` (Trinity-RFT's ``sft_phi`` cutoff): the loss keeps a
    constant value above the cutoff, with zero gradient there; ``logp`` when cutoff is None."""
    if cutoff is None:
        return logp
    return torch.clamp(logp, max=math.log(cutoff))


@TOKEN_WEIGHTS.register("luffy", bounds={
    "cutoff": ("[0, 1]", "a probability"),
    "gamma": ("> 0", "w = p / (p + gamma): gamma < 0 makes it negative or infinite, 0 makes it the constant 1"),
})
def luffy(logp: Tensor, *, cutoff: float | None = None, gamma: float = 0.1) -> Tensor:
    """LUFFY shaping as a detached weight: ``w = sg(p / (p + gamma))``.

    This is the weight form; LUFFY itself uses the *shaped ratio* with gradient, see
    ``luffy_shaped_ratio`` (the ``shaped`` term).

    Formula: ``w(p) = sg(p / (p + {gamma}))``, 0 where p > {cutoff|1 (no cutoff)}

    Paper: LUFFY, "Learning to Reason under Off-Policy Guidance" (gamma = 0.1 in the
    authors' script).

    Parameters:
        cutoff (None): tokens with p > cutoff get weight 0.
        gamma (0.1): shaping constant.
    """
    p = logp.detach().exp()
    return _apply_cutoff(p / (p + gamma), p, cutoff)


def luffy_shaped_ratio(logp: Tensor, gamma: float = 0.1) -> Tensor:
    """LUFFY's shaped off-policy ratio ``f(p) = p / (p + gamma)``, WITH gradient.

    LUFFY takes the behaviour probability of expert tokens as 1 and replaces the
    importance ratio by ``f(p)``; the expert-token loss is ``-A * f(p)`` (no clip).
    Since ``d f / d log p = p * gamma / (p + gamma)^2``, the gradient is
    ``-A * gamma p / (p + gamma)^2 * grad log p``: a token weight peaking at p = gamma with
    maximum 1/4 (cf. CHORD-phi's p(1 - p), peak at p = 0.5, same maximum).

    Not registered (it is not a detached weight). Paper: LUFFY, "Learning to Reason under
    Off-Policy Guidance".
    """
    p = logp.exp()
    return p / (p + gamma)


#: LUFFY's ``off_policy_reshape`` forms (``p_div_p_0.1`` = ``p_div_p`` with gamma 0.1, ...)
OFF_POLICY_RESHAPES = ("no_reshape", "p_div_p", "logp", "p_logp", "square_root", "pow")


def luffy_off_policy_ratio(
    logp: Tensor, reshape: str = "p_div_p", *, gamma: float = 0.1, weight: float = 0.1, pow_exp: float = 0.5
) -> Tensor:
    """LUFFY's reshaped off-policy "ratio" f(p) of an expert token, WITH gradient (its verl
    fork's ``off_policy_reshape``; the behaviour probability is taken as 1, so r = p).

    ``no_reshape``: p; ``p_div_p``: p / (p + gamma) (LUFFY's ``p_div_p_0.1`` / ``_0.3`` /
    ``_0.5`` are gamma 0.1 / 0.3 / 0.5); ``logp``: weight * log p; ``p_logp``:
    p + weight * log p; ``square_root``: sqrt(p); ``pow``: p ** pow_exp.
    """
    if reshape not in OFF_POLICY_RESHAPES:
        raise ValueError(f"off-policy reshape must be one of {', '.join(OFF_POLICY_RESHAPES)}, got {reshape!r}")
    p = logp.exp()
    if reshape == "no_reshape":
        return p
    if reshape == "p_div_p":
        return p / (p + gamma)
    if reshape == "logp":
        return weight * logp
    if reshape == "p_logp":
        return p + weight * logp
    if reshape == "square_root":
        return p.sqrt()
    return p.pow(pow_exp)
