"""The runtime inputs of a per-token advantage from dense rewards (``algo.advantage.name=capo``).

The reward functions that returned per-token lists keep their per-token credit
(:class:`mixrl.rewards.registry.CheckedReward` ``last_credit``: ``reward=process``'s step rewards
without the outcome); this module weights them by the reward weights into this process's
``[B, T]`` matrix, pads it to the widest process and gathers it with the completion mask, as
:mod:`mixrl.trainer.parts.turn_credit` does for turns. The estimator runs over the global batch.

Owns: nothing (functions only); no TRL import.
Receives: the batch's output dict, the reward functions and their weights, the accelerator (gathers).
Returns: the estimator's runtime inputs (``token_credit``, ``mask``).
"""

from __future__ import annotations

import torch

from mixrl.rewards.protocol import DenseCredit


def local_token_credit(reward_funcs: list, reward_weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] the weighted per-token credit of this process's rows (0 where no reward gave one).

    Formula: C_{i,t} = sum_f w_f c^f_{i,t} over the reward functions f that returned a list for row i"""
    credit = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    weights = reward_weights.to(mask.device)
    for f, fn in enumerate(reward_funcs):
        for row, values in (fn.last_credit if isinstance(fn, DenseCredit) else {}).items():
            n = int(mask[row].sum()) if row < mask.shape[0] else -1
            if n != len(values):
                raise RuntimeError(f"a dense reward's credit of row {row} has {len(values)} values for {n} completion tokens "
                                   "(an injection rewrote the row after scoring?)")
            credit[row, :n] += float(weights[f]) * torch.tensor(values, dtype=torch.float32, device=mask.device)
    return credit


def token_credit_inputs(out: dict, reward_funcs: list, reward_weights: torch.Tensor, accelerator) -> dict[str, torch.Tensor]:
    """``token_credit`` and ``mask`` ([N_global, T_max]) of the global batch."""
    mask = out["completion_mask"]
    credit = local_token_credit(reward_funcs, reward_weights, mask)
    credit = accelerator.pad_across_processes(credit, dim=1, pad_index=0)
    padded_mask = accelerator.pad_across_processes(mask.long(), dim=1, pad_index=0)
    return {"token_credit": accelerator.gather(credit), "mask": accelerator.gather(padded_mask)}
