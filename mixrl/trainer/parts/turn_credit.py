"""The runtime inputs of a turn-level advantage (``algo.advantage.name=mt_grpo``), and its rows.

A stateful environment's rollouts (:mod:`mixrl.trainer.env_rollout`) return ``turn_rewards``,
one list per episode; TRL merges that extra key into each row of the batch (``inputs[i]``),
where this module reads it. The advantage is computed over the global batch, like every
estimator: the rows' turn rewards are gathered as objects and their ``turn_id`` ([B, T],
:func:`mixrl.trainer.parts.batch_fields.provenance_fields`) padded to the widest process with
-1 (no turn) and gathered; the per-token result is cut back to this process's rows and width.

Owns: nothing (functions only); no TRL import.
Receives: the batch's output dict and rows, the accelerator (gathers), the global advantages.
Returns: the estimator's runtime inputs (``turn_rewards``, ``turn_ids``), this process's slice of
the per-token advantages, and the ``turn/*`` metrics.
"""

from __future__ import annotations

import torch

from mixrl.core.turn_advantages import first_minus_last, per_turn_advantages, turn_reward_matrix
from mixrl.core.uis1 import per_turn_uis1


def turn_inputs(out: dict, rows: list[dict], accelerator, needs: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """``turn_rewards`` [N_global, K] (NaN past a row's last turn) and ``turn_ids`` [N_global, T]
    of the global batch; with ``turn_matched`` in ``needs`` (UI-S1), also ``turn_matched`` [N_global, K]
    (False at a turn whose action diverged and was patched; True past a row's last turn).
    A batch without ``turn_id`` (no row went past its first turn) is one turn per row: turn 0 on
    the completion's tokens."""
    from accelerate.utils import gather_object  # deferred: accelerate loads with the trainer only

    device = out["completion_ids"].device

    def gathered(key, cast):
        local = [[cast(x) for x in (row.get(key) or [])] for row in rows]
        return gather_object(local) if accelerator.num_processes > 1 else local

    turn_rewards = turn_reward_matrix(gathered("turn_rewards", float), device=device)
    ids = out.get("turn_id")
    if ids is None:
        ids = torch.where(out["completion_mask"].bool(), 0, -1)
    ids = accelerator.pad_across_processes(ids.long(), dim=1, pad_index=-1)
    runtime = {"turn_rewards": turn_rewards, "turn_ids": accelerator.gather(ids)}
    if "turn_matched" in needs:
        flags = turn_reward_matrix([[1.0 if m else 0.0 for m in row] for row in gathered("turn_matched", bool)], device=device)
        runtime["turn_matched"] = torch.nn.functional.pad(flags, (0, turn_rewards.shape[1] - flags.shape[1]),
                                                          value=1.0).nan_to_num(1.0).bool()
    return runtime


def local_advantages(advantages: torch.Tensor, start: int, n_local: int, width: int) -> torch.Tensor:
    """This process's rows of the global advantages; a per-token [N, T] one is cut to the local width."""
    local = advantages[start : start + n_local]
    return local[:, :width] if local.dim() == 2 else local


def turn_metrics(rewards: torch.Tensor, group_ids: torch.Tensor, runtime: dict, params: dict, include=None) -> dict[str, float]:
    """``turn/advantage_first_minus_last``: the mean, over rows of two turns or more, of the first
    turn's advantage minus the last turn's (0 under GRPO's one advantage per row)."""
    if "turn_matched" in runtime:  # UI-S1's estimator (mixrl.core.uis1)
        per_turn = per_turn_uis1(rewards, group_ids, runtime["turn_rewards"], runtime["turn_matched"], include=include, **params)
    else:
        per_turn = per_turn_advantages(rewards, group_ids, runtime["turn_rewards"], include=include, **params)
    value = first_minus_last(per_turn)
    multi = (~torch.isnan(per_turn)).sum(1) >= 2
    return {"turn/multi_turn_rows": float(multi.float().mean())} | ({} if value is None else {"turn/advantage_first_minus_last": value})
