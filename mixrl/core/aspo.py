"""ASPO: Advantage Shaping Policy Optimization, a clipped bias toward earlier tool calls (a shaping).

"Understanding Tool-Integrated Reasoning" (Lin and Xu, arXiv 2508.19201), section 3.3, Eq. (2):
after the correctness advantage ``A_correct`` is computed, every response that is both correct and
calls the tool gets

    A_i = A_correct,i + clip(delta (p_i - mean(p)) / mean(L), -k A_correct,i, k A_correct,i)

p and L the first tool-call positions and the total lengths of the group's correct, tool-calling
responses, delta < 0 (an earlier call than the group's mean gets more), k the share of the
correctness advantage the bias may reach (k < 1: a correct row's advantage stays positive). The
paper's runs use delta = -2.0, k = 0.7 (conservative) and delta = -2.5, k = 0.9 (aggressive).
Other responses keep A_correct. No code of the authors was found (the paper links none); a
third-party verl recipe (masoudhashemi/verl @ ee1a9a1f07fe30f4c1fc5cd4a78bc9fc1c48f7f9,
``verl/trainer/ppo/aspo.py``, ``apply_aspo_shaping``) reads Eq. (2) the same way, bounding by
``k |A|``.

Where mixrl reads the paper (said in the docstring and the preset):

* ``p_i`` is the index, in the completion, of the first token of the first tool result
  (provenance ``environment``): where the call has been written and the tool runs. The paper's
  "first code invocation position" is the call's start; the two differ by the call's own length,
  which cancels in ``p_i - mean(p)`` when calls are of about equal length.
* "correct" is the first reward function's reward reaching ``success`` (1.0: the task's 0/1 reward).
* the clip bound is ``k |A_correct,i|`` (the paper's ``k A_correct,i`` whenever A_correct >= 0,
  which it is for a correct row of a 0/1 reward; a correct row with A <= 0, e.g. in a group where
  every row is correct, gets no bias, as in the paper, where DAPO drops such groups).
"""

from __future__ import annotations

import torch
from torch import Tensor

from mixrl.core import provenance as prov
from mixrl.core.advantage_shaping import SHAPINGS, _float, _group_index, _group_sum


def first_tool_position(token_source: Tensor, mask: Tensor) -> Tensor:
    """[N] the index of each completion's first tool-result token (provenance ``environment``), -1 without one."""
    env = (token_source == prov.ENVIRONMENT) & mask.bool()
    width = env.shape[-1]
    idx = torch.arange(width, device=env.device).expand_as(env)
    first = torch.where(env, idx, torch.full_like(idx, width)).min(dim=-1).values if width else torch.zeros(env.shape[0], dtype=torch.long)
    return torch.where(first < width, first, torch.full_like(first, -1)).float()


@SHAPINGS.register("aspo", bounds={
    "delta": ("<= 0", "ASPO's delta is negative: earlier tool calls get more; a positive delta would reward later ones"),
    "k": ("[0, 1)", "the bias is at most k |A| of a correct row: k >= 1 could zero or invert a correct row's advantage"),
})
def aspo(advantages: Tensor, *, rewards: Tensor | None = None, group_ids: Tensor | None = None,
         include: Tensor | None = None, primary_rewards: Tensor | None = None, lengths: Tensor | None = None,
         tool_position: Tensor | None = None, delta: float = -2.0, k: float = 0.7, success: float = 1.0) -> Tensor:
    """ASPO: a correct, tool-calling row gets ``A + clip(delta (p - mean p) / mean L, -k|A|, k|A|)``, p its first tool call.

    The means are over the group's correct rows that call the tool and count in the group's
    statistics (``include``); every correct tool-calling row is shaped against them (an off-policy
    one too, when the trainer shapes it), every other row keeps its advantage. With delta < 0 a row that calls
    the tool earlier than those rows' mean gets a larger advantage, a later one a smaller, by at
    most k |A|: the correctness signal stays first. p: the index of the first tool-result token in
    the completion (the paper's call position plus the call's length); L: completion tokens, tool results included;
    correct: the first reward function's reward >= success.

    Formula: ``A'_i = A_i + clip({delta} (p_i - mean_g p) / mean_g L, -{k}|A_i|, {k}|A_i|)`` if R1_i >= {success} and row i calls the tool, else A_i; means over the group's correct tool-calling rows

    Paper: ASPO, "Understanding Tool-Integrated Reasoning" (arXiv 2508.19201), Eq. (2).

    Parameters:
        delta (-2.0): coefficient of the normalised call position (negative: earlier calls get more).
        k (0.7): the bias is clipped to k |A|.
        success (1.0): a row whose first reward is at least this is correct.
    """
    if tool_position is None or lengths is None or group_ids is None:
        raise ValueError("aspo needs each row's first tool-call position and length (the trainer passes them)")
    a = _float(advantages)
    r = _float(primary_rewards if primary_rewards is not None else rewards).to(a.device)
    p, length = _float(tool_position).to(a.device), _float(lengths).to(a.device)
    eligible = (r >= success) & (p >= 0)
    counted = eligible & include.to(a.device).bool() if include is not None else eligible
    inv, n = _group_index(group_ids.to(a.device))
    e = counted.to(a.dtype)
    count = _group_sum(e, inv, n)
    mean_p = _group_sum(p * e, inv, n) / count.clamp(min=1.0)
    mean_len = _group_sum(length * e, inv, n) / count.clamp(min=1.0)
    raw = delta * (p - mean_p) / mean_len.clamp(min=1.0)
    bound = k * a.abs()
    bias = torch.maximum(torch.minimum(raw, bound), -bound)
    return torch.where(eligible & (count > 0), a + bias, a)  # a group without counted rows has no means: no bias


aspo.needs = ("primary_rewards", "lengths", "tool_position")
