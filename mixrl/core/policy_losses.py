"""Policy-gradient losses on sampled tokens (axis A1, ``loss/``): the registry and every loss, re-exported.

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

The registry and the output type are in :mod:`mixrl.core.policy_base`; the losses by family in
:mod:`mixrl.core.clip_losses` (ppo_clip, reshaped_ppo, sapo, m2po),
:mod:`mixrl.core.reinforce_losses` (reinforce, topr, cispo, sft) and
:mod:`mixrl.core.sequence_losses` (gspo); importing this module registers all of them, and
every name importable from it before the split still is.
"""

from __future__ import annotations

from mixrl.core.clip_losses import ON_POLICY_RESHAPES, m2_keep_mask, m2po, ppo_clip, reshaped_ppo, sapo
from mixrl.core.policy_base import POLICY_LOSSES, PolicyLossOutput, _finish, _ratio_metrics
from mixrl.core.reinforce_losses import cispo, reinforce, sft, topr
from mixrl.core.sequence_losses import gspo
from mixrl.core.turns import turn_ppo

__all__ = [
    "ON_POLICY_RESHAPES",
    "POLICY_LOSSES",
    "PolicyLossOutput",
    "_finish",
    "_ratio_metrics",
    "cispo",
    "gspo",
    "turn_ppo",
    "m2_keep_mask",
    "m2po",
    "ppo_clip",
    "reinforce",
    "reshaped_ppo",
    "sapo",
    "sft",
    "topr",
]
