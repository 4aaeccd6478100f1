"""Regularisers: KL to a reference or teacher, entropy bonus (axis A7, ``regularizer/``).

KL estimators (Schulman, "Approximating KL divergence", 2020) estimate, per sampled
token ``y_t ~ pi_theta``, the reverse KL ``KL(pi_theta || pi_ref)``. With
``x = ref_logp - logp = log(pi_ref / pi_theta)`` (the log of r' = pi_ref / pi_theta):

* ``k1 = -x``                      unbiased, high variance, can be negative;
* ``k2 = x^2 / 2``                 biased, low variance, >= 0;
* ``k3 = exp(x) - 1 - x``          unbiased, low variance, >= 0 (GRPO's KL term);
* ``k3_clamped``: k3 with x clamped to [-20, 20] and the result clamped to [-10, 10]
  (verl's ``low_var_kl``).

Signature of every registered estimator: ``fn(logp, ref_logp) -> [B, T]`` (the per-token
penalty, to be masked and aggregated by the caller; ``ref_logp`` is treated as constant).
"""

from __future__ import annotations

import torch
from torch import Tensor

from mixrl.core._tensor import bool_mask, float_mask, zero_masked
from mixrl.core.registry import Registry

KL_ESTIMATORS = Registry("KL estimator")


def _x(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return ref_logp.detach() - logp


@KL_ESTIMATORS.register("k1")
def k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = log(pi_theta / pi_ref) = logp - ref_logp (= -x with x = ref_logp - logp).

    Unbiased estimator of KL(pi_theta || pi_ref) on tokens sampled from pi_theta; can be
    negative per token.

    Formula: ``k1 = log pi_theta(y_t) - log pi_ref(y_t)``

    Paper: Schulman, "Approximating KL Divergence" (2020); the reverse KL to a teacher of
    "KDRL: Post-Training Reasoning LLMs via Unified Knowledge Distillation and Reinforcement
    Learning" and on-policy distillation.

    Parameters: none.
    """
    return -_x(logp, ref_logp)


@KL_ESTIMATORS.register("k2")
def k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = (x^2) / 2 with x = ref_logp - logp; biased, low variance, >= 0.

    Formula: ``k2 = x^2 / 2``, ``x = log pi_ref(y_t) - log pi_theta(y_t)``

    Paper: Schulman, "Approximating KL Divergence" (2020).

    Parameters: none.
    """
    return 0.5 * _x(logp, ref_logp).pow(2)


@KL_ESTIMATORS.register("k3")
def k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 = exp(x) - 1 - x with x = ref_logp - logp (i.e. r' - 1 - log r', r' = pi_ref/pi_theta).

    Unbiased and >= 0 estimator of KL(pi_theta || pi_ref) on tokens sampled from
    pi_theta.

    Formula: ``k3 = exp(x) - 1 - x``, ``x = log pi_ref(y_t) - log pi_theta(y_t)``

    Paper: Schulman, "Approximating KL Divergence" (2020); the KL term of GRPO
    ("DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models").

    Parameters: none.
    """
    x = _x(logp, ref_logp)
    return torch.expm1(x) - x


@KL_ESTIMATORS.register("k3_clamped")
def k3_clamped(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 with x = clamp(ref_logp - logp, -20, 20) and the result clamped to [-10, 10].

    Numerically safe variant, the same clamps as verl's ``low_var_kl`` (the exp
    argument at +-20 against overflow, the penalty at 10 against outliers).

    Formula: ``clamp(exp(x) - 1 - x, -10, 10)``, ``x = clamp(log pi_ref(y_t) - log pi_theta(y_t), -20, 20)``

    Paper: Schulman, "Approximating KL Divergence" (2020); verl's ``low_var_kl`` (HybridFlow, 2024).

    Parameters: none.
    """
    x = torch.clamp(_x(logp, ref_logp), -20.0, 20.0)
    return torch.clamp(torch.expm1(x) - x, -10.0, 10.0)


def kl_penalty(logp: Tensor, ref_logp: Tensor, *, estimator: str = "k3") -> Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate [B, T] with the named estimator.

    Not masked or aggregated: multiply by the coefficient and aggregate with the mask.
    """
    return KL_ESTIMATORS.get(estimator)(logp, ref_logp)


def teacher_kl(logp: Tensor, teacher_logp: Tensor, *, estimator: str = "k1") -> Tensor:
    """Per-token reverse KL to a teacher, KL(pi_theta || pi_T), on student-sampled tokens.

    KDRL / OPD: minimise ``RKL(pi_theta || pi_T)``; with k1 the per-token value
    ``logp - teacher_logp`` is the negated teacher log-ratio "reward" of OPD.
    ``teacher_logp`` is treated as constant.
    """
    return KL_ESTIMATORS.get(estimator)(logp, teacher_logp)


def entropy_bonus(
    entropies: Tensor,
    mask: Tensor,
    *,
    coef: float,
    num_items: float | None = None,
) -> Tensor:
    """The entropy LOSS term: ``-coef * token-mean entropy`` (adding it raises entropy).

    ``num_items``: optional global token count (as in token-mean aggregation) so that
    micro-batch terms sum to the full-batch value. Empty mask: 0 (no NaN).
    """
    m = bool_mask(mask)
    total = zero_masked(entropies, m).sum()
    if num_items is not None and num_items > 0:
        denom = torch.as_tensor(float(num_items), dtype=total.dtype, device=total.device)
    else:
        denom = float_mask(m, total).sum().clamp(min=1.0)
    return -coef * total / denom
