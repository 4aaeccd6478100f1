"""The policy-loss registry and the conventions every policy loss follows (axis A1, ``loss/``).

Signature of every registered loss::

    fn(logp, old_logp, advantages, mask, *, <params>) -> PolicyLossOutput

* ``logp``      [B, T] log pi_theta(y_t | s_t) of the sampled tokens (with gradient).
* ``old_logp``  [B, T] behaviour log-probs (pi_old / pi_b); always treated as constant.
* ``advantages`` [B] one per row (a [B, T] per-token tensor is accepted too).
* ``mask``      [B, T] bool or 0/1 (padding = 0).

The per-token loss is **not aggregated** (see :mod:`mixrl.core.aggregation`) and is 0 on
masked positions. Every loss first replaces padded positions of ``logp``, ``old_logp``
(and per-token advantages) by 0 with ``torch.where``, so NaN or -inf in padding gives a
finite loss and an exact zero gradient there. Notation: ``r = exp(clamp(logp - old_logp, -20, 20))``, ``A`` the
advantage, ``sg`` stop-gradient, ``p = exp(logp)``.

The losses live by family in :mod:`mixrl.core.clip_losses`, :mod:`mixrl.core.reinforce_losses`,
:mod:`mixrl.core.sequence_losses`, :mod:`mixrl.core.cov_losses`, :mod:`mixrl.core.gmpo`,
:mod:`mixrl.core.vespo` and :mod:`mixrl.core.offpolicy_reinforce`; all register in the one
:data:`POLICY_LOSSES` below. :mod:`mixrl.core.policy_losses` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from mixrl.core._tensor import bool_mask, masked_mean, zero_masked
from mixrl.core.registry import Registry

#: ``generator``: a runtime parameter of losses that draw at random (``clip_cov``): the
#: caller's ``torch.Generator``; never a config parameter. ``turn_ids``: the [B, T] turn index of
#: each token of a multi-turn row (:mod:`mixrl.core.turns`), given to losses that take it.
POLICY_LOSSES = Registry("policy loss", runtime=("generator", "turn_ids"))


@dataclass
class PolicyLossOutput:
    """Result of a policy loss.

    per_token_loss: [B, T], 0 on masked positions, not aggregated.
    clipped: [B, T] bool, tokens whose gradient the trust region clipped, masked,
        zeroed or truncated (for the clip-fraction metric); False on padding.
    metrics: scalar extras (detached), may be empty.
    """

    per_token_loss: Tensor
    clipped: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)


def _finish(loss: Tensor, clipped: Tensor, mask: Tensor, metrics=None) -> PolicyLossOutput:
    m = bool_mask(mask)
    return PolicyLossOutput(
        per_token_loss=zero_masked(loss, m),
        clipped=clipped & m,
        metrics={k: v.detach() for k, v in (metrics or {}).items()},
    )


def _ratio_metrics(ratio: Tensor, mask: Tensor) -> dict[str, Tensor]:
    return {"ratio_mean": masked_mean(ratio.detach(), mask)}

