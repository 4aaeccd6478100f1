"""Advantages whose normaliser can vanish for rows it leaves out, singleton groups, masks with
holes and float64, against each peer's formula as its code computes it, written here as plain
python loops (the peers' code is read, not imported or copied):

* LUFFY ``compute_grpo_outcome_advantage_split`` (ElliottYan/LUFFY @ 01f4ae06,
  ``luffy/verl/verl/mix_src/mix_core_alg.py``): mean / std over the on-policy rows of the group;
  one on-policy row: mean 0, std 1; std 0 becomes 1; ``(s - mean) / (std + 1e-6)``.
* verl (volcengine/verl @ b178a3cd, ``verl/trainer/ppo/core_algos.py``):
  ``compute_reinforce_plus_plus_outcome_advantage`` (returns summed backwards, reset after a
  masked token, then ``verl_F.masked_whiten``: unbiased variance, ``rsqrt(var + 1e-8)``, in
  ``verl/utils/torch_functional.py``), ``compute_gae_advantage_return``,
  ``compute_rloo_outcome_advantage`` (one response: score kept) and
  ``compute_rloo_vectorized_outcome_advantage`` (one response: ``* (c > 1)`` gives 0).
* Trinity-RFT ``ASYMREGroupAdvantage`` (modelscope/Trinity-RFT @ d4baca61,
  ``trinity/algorithm/advantage_fn/asymre_advantage.py``): one experience: baseline 0.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch

from mixrl.core import ADVANTAGES, POLICY_LOSSES, gae_advantage_return


def luffy_grpo_split(scores, index, on_policy, eps=1e-6):
    """LUFFY's grpo_split, by hand: statistics of the on-policy rows of each prompt."""
    by_id = defaultdict(list)
    for s, i, on in zip(scores, index, on_policy):
        if on:
            by_id[i].append(s)
    mean, std = {}, {}
    for i, xs in by_id.items():
        if len(xs) == 1:
            mean[i], std[i] = 0.0, 1.0
        else:
            m = sum(xs) / len(xs)
            mean[i] = m
            std[i] = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))  # torch.std: unbiased
        if std[i] == 0:
            std[i] = 1.0
    return [(s - mean[i]) / (std[i] + eps) for s, i in zip(scores, index)]


def grpo_split(rewards, groups, on_policy, dtype=torch.float32, **params):
    return ADVANTAGES.get("grpo")(torch.tensor(rewards, dtype=dtype), torch.tensor(groups),
                                  include=torch.tensor(on_policy), **params)


# --------------------------------------------------------------------------- grpo_split
def test_grpo_split_all_equal_rollouts_and_a_differing_expert_row_match_luffy():
    # LUFFY's central case: the rollouts of prompt 0 all fail, its expert row succeeds; prompt 1
    # all succeed, the expert fails; prompt 2 is an ordinary mixed group
    rewards = [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    groups = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    on = [True, True, True, False] * 3
    got = grpo_split(rewards, groups, on)
    want = luffy_grpo_split(rewards, groups, on)
    assert got.tolist() == pytest.approx(want, rel=1e-6, abs=1e-7)
    assert got[3].item() == pytest.approx(1 / (1 + 1e-6)) and got[7].item() == pytest.approx(-1 / (1 + 1e-6))
    assert got[:3].tolist() == [0.0, 0.0, 0.0]  # the all-equal rollouts themselves: exactly 0
    assert got.abs().max().item() < 2.0  # was (1 - 0) / (0 + 1e-6) = 1e6 for row 3


def test_grpo_split_zero_variance_with_every_row_included_gives_zero_as_before():
    assert grpo_split([0.5, 0.5, 0.5], [4, 4, 4], [True, True, True]).tolist() == [0.0, 0.0, 0.0]
    assert luffy_grpo_split([0.5, 0.5, 0.5], [4, 4, 4], [True] * 3) == [0.0, 0.0, 0.0]


def test_grpo_split_non_dyadic_equal_rewards_still_count_as_zero_spread():
    # LUFFY tests std == 0 exactly; torch.std of seven float32 0.1s is 8.0e-9, not 0, and LUFFY then
    # gives the expert row (0.7 - 0.1) / (8e-9 + 1e-6) = 6e5. mixrl tests the spread (max == min):
    # LUFFY's rule applied to the exact std (0), i.e. (0.7 - 0.1) / (1 + 1e-6)
    assert torch.std(torch.full((7,), 0.1)).item() > 0
    got = grpo_split([0.1] * 7 + [0.7], [0] * 8, [True] * 7 + [False])
    assert got.tolist()[:7] == [0.0] * 7
    assert got[7].item() == pytest.approx(0.6 / (1 + 1e-6), rel=1e-6)


def test_grpo_split_singleton_group_is_centred_where_luffy_divides_by_one():
    # documented difference: one on-policy row + one expert row. LUFFY (and verl's grpo): mean 0,
    # std 1, every row r / (1 + eps); mixrl: the std is undefined, rows are centred on the one
    # included reward and not scaled
    rewards, groups, on = [0.0, 1.0], [0, 0], [True, False]
    assert luffy_grpo_split(rewards, groups, on) == pytest.approx([0.0, 1 / (1 + 1e-6)])
    assert grpo_split(rewards, groups, on).tolist() == [0.0, 1.0]
    rewards = [1.0, 0.0]  # here they differ: LUFFY [1/(1+eps), 0], mixrl [0, -1]
    assert luffy_grpo_split(rewards, groups, on) == pytest.approx([1 / (1 + 1e-6), 0.0])
    assert grpo_split(rewards, groups, on).tolist() == [0.0, -1.0]


def test_grpo_split_float64_keeps_its_dtype_and_precision():
    rewards = [0.25, 0.25, 0.25 + 1e-12, 0.25, 3.0]
    groups, on = [0] * 5, [True, True, True, True, False]
    got = grpo_split(rewards, groups, on, dtype=torch.float64)
    assert got.dtype == torch.float64
    assert got.tolist() == pytest.approx(luffy_grpo_split(rewards, groups, on), rel=1e-9)


def test_grpo_batch_scale_and_batch_norm_divide_by_one_when_the_included_batch_is_flat():
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 3.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    inc = torch.tensor([True, True, True, True, False, False])
    # by hand: group 0 mean 1, group 1 mean 1 (its one included row); batch std of the included
    # rewards 0 -> 1: A = (r - mean_g) / (1 + eps)
    got = ADVANTAGES.get("grpo")(rewards, groups, include=inc, scale="batch")
    assert got.tolist() == pytest.approx([0.0, 0.0, 0.0, 0.0, -1 / (1 + 1e-6), 2 / (1 + 1e-6)])
    got = ADVANTAGES.get("batch_norm")(rewards, groups, include=inc)
    assert got.tolist() == pytest.approx([0.0, 0.0, 0.0, 0.0, -1 / (1 + 1e-6), 2 / (1 + 1e-6)])


# --------------------------------------------------------------------------- REINFORCE++
def masked_whiten(values, mask, eps=1e-8):
    """verl's masked_whiten over a list of rows: mean and unbiased variance over the mask's tokens."""
    sel = [v for row, mrow in zip(values, mask) for v, m in zip(row, mrow) if m]
    mean = sum(sel) / len(sel)
    var = sum((v - mean) ** 2 for v in sel) / len(sel) * (len(sel) / (len(sel) - 1))
    return [[(v - mean) / math.sqrt(var + eps) for v in row] for row in values]


def verl_reinforce_pp(scores, lengths, mask, gamma=1.0):
    """verl's compute_reinforce_plus_plus_outcome_advantage, by hand: the score on the last
    response token, returns backwards, the running return reset after a masked token."""
    returns = []
    for s, n, mrow in zip(scores, lengths, mask):
        tok = [s if t == n - 1 else 0.0 for t in range(len(mrow))]
        running, row = 0.0, [0.0] * len(mrow)
        for t in reversed(range(len(mrow))):
            running = tok[t] + gamma * running
            row[t] = running
            running = running * mrow[t]
        returns.append(row)
    white = masked_whiten(returns, mask)
    return [[w * m for w, m in zip(wrow, mrow)] for wrow, mrow in zip(white, mask)]


def test_reinforce_pp_restarts_the_return_after_a_masked_token_as_verl():
    # row 0: turn 1 (tokens 0-1), an observation (2-3, masked), turn 2 (4-5): only turn 2 gets R
    # row 1: no holes, 4 tokens then padding; row 2: a hole at its very first token
    scores = [1.0, 0.0, 2.0]
    lengths = [6, 4, 5]
    mask = [[1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 0]]
    got = ADVANTAGES.get("reinforce_pp")(torch.tensor(scores), torch.zeros(3), lengths=torch.tensor(lengths, dtype=torch.float32),
                                         mask=torch.tensor(mask))
    want = verl_reinforce_pp(scores, lengths, mask)
    assert got.shape == (3, 6)
    assert got.tolist() == [pytest.approx(w, abs=1e-5) for w in want]
    # hand numbers: returns on the mask's tokens: row 0 [0, 0, 1, 1], row 1 [0] * 4, row 2 [2] * 4;
    # 12 tokens, mean 10 / 12, so row 0's first turn is below the mean like row 1's tokens
    assert got[0, 0].item() == pytest.approx(got[1, 0].item()) and got[0, 0].item() < 0 < got[0, 4].item()
    # the mask's last 1 is the reward position when lengths are not given
    again = ADVANTAGES.get("reinforce_pp")(torch.tensor(scores), torch.zeros(3), mask=torch.tensor(mask))
    assert torch.allclose(again, got)


def test_reinforce_pp_without_holes_equals_the_per_row_form():
    scores, lengths = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([2.0, 4.0, 1.0, 3.0])
    mask = (torch.arange(4).unsqueeze(0) < lengths.unsqueeze(1)).long()
    rows = ADVANTAGES.get("reinforce_pp")(scores, torch.zeros(4), lengths=lengths)
    tokens = ADVANTAGES.get("reinforce_pp")(scores, torch.zeros(4), lengths=lengths, mask=mask)
    assert torch.allclose(tokens, rows.unsqueeze(1) * mask, atol=1e-6)


def test_reinforce_pp_flat_included_rows_divide_an_excluded_row_by_one():
    scores, lengths = torch.tensor([1.0, 1.0, 0.0]), torch.tensor([2.0, 3.0, 2.0])
    inc = torch.tensor([True, True, False])
    got = ADVANTAGES.get("reinforce_pp")(scores, torch.zeros(3), lengths=lengths, include=inc)
    assert got.tolist() == pytest.approx([0.0, 0.0, -1 / math.sqrt(1 + 1e-8)])  # was -1 / sqrt(1e-8) = -1e4
    got = ADVANTAGES.get("reinforce_pp_baseline")(scores, torch.tensor([0, 0, 0]), lengths=lengths, include=inc)
    assert got.abs().max().item() < 2.0


# --------------------------------------------------------------------------- GAE
def verl_gae(rewards, values, mask, gamma, lam):
    """verl's compute_gae_advantage_return before whitening, by hand (masked tokens pass through)."""
    out = []
    for r, v, m in zip(rewards, values, mask):
        next_v, last, row = 0.0, 0.0, [0.0] * len(r)
        for t in reversed(range(len(r))):
            delta = r[t] + gamma * next_v - v[t]
            step = delta + gamma * lam * last
            next_v = v[t] * m[t] + (1 - m[t]) * next_v
            last = step * m[t] + (1 - m[t]) * last
            row[t] = last
        out.append(row)
    return out


def test_gae_keeps_float64_and_its_precision():
    r = [[0.0, 0.0, 1.0 + 1e-12], [0.0, 1.0, 0.0]]
    v = [[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]
    m = [[1, 1, 1], [1, 0, 1]]  # row 1: a hole, passed through as verl does
    adv, ret = gae_advantage_return(torch.tensor(r, dtype=torch.float64), torch.tensor(v, dtype=torch.float64),
                                    torch.tensor(m), gamma=0.9, lam=0.95)
    assert adv.dtype == ret.dtype == torch.float64
    want = verl_gae(r, v, m, 0.9, 0.95)
    masked = [[a * k for a, k in zip(row, mrow)] for row, mrow in zip(want, m)]
    assert adv.tolist() == [pytest.approx(w, rel=1e-12, abs=1e-15) for w in masked]
    assert adv[0, 2].item() - (1.0 + 1e-12 - 0.3) == pytest.approx(0.0, abs=1e-15)  # float32 would lose the 1e-12
    per_row = ADVANTAGES.get("gae")(torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64), torch.zeros(3))
    assert per_row.dtype == torch.float64


def test_gae_whitening_divides_by_one_when_the_included_tokens_are_flat():
    r = torch.tensor([[0.0, 1.0], [0.0, 1.0], [0.0, 5.0]])
    v = torch.zeros(3, 2)
    mask = torch.ones(3, 2)
    inc = torch.tensor([True, True, False])
    out = ADVANTAGES.get("gae")(torch.zeros(3), torch.zeros(3), include=inc, token_rewards=r, values=v, mask=mask, gamma=1.0, lam=1.0)
    # raw advantages (gamma = lam = 1, V = 0): the return, [1, 1] per row; the included tokens are
    # all 1 -> variance 0 counts as 1; row 2's return 5 becomes (5 - 1) / sqrt(1 + 1e-8)
    assert out.tolist() == [pytest.approx([0.0, 0.0]), pytest.approx([0.0, 0.0]), pytest.approx([4 / math.sqrt(1 + 1e-8)] * 2)]


# --------------------------------------------------------------------------- RLOO, AsymRE
def verl_rloo(scores, index, vectorized):
    """verl's rloo (a one-response group keeps its score) or rloo_vectorized (it gets 0), by hand."""
    by_id = defaultdict(list)
    for s, i in zip(scores, index):
        by_id[i].append(s)
    out = []
    for s, i in zip(scores, index):
        n = len(by_id[i])
        if n > 1:
            mean = sum(by_id[i]) / n
            out.append(s * n / (n - 1) - mean * n / (n - 1))
        else:
            out.append(0.0 if vectorized else s)
    return out


@pytest.mark.parametrize("singleton_reward,vectorized", [(False, True), (True, False)])
def test_rloo_singleton_matches_rloo_vectorized_by_default_and_rloo_with_the_option(singleton_reward, vectorized):
    scores, index = [1.0, 0.0, 0.5, 0.75], [0, 0, 0, 9]  # group 9 has one response
    got = ADVANTAGES.get("rloo")(torch.tensor(scores), torch.tensor(index), singleton_reward=singleton_reward)
    assert got.tolist() == pytest.approx(verl_rloo(scores, index, vectorized))
    assert got[3].item() == (0.75 if singleton_reward else 0.0)


def test_asymre_lone_row_trains_with_minus_the_shift_where_trinity_gives_its_reward():
    # mixrl: dr_grpo gives a row alone in its group A = 0, the asymre loss adds -shift: the
    # per-token gradient on log p is -(A - shift) = -0.1. Trinity-RFT: baseline 0, A = R, no shift.
    rewards, groups, inc = torch.tensor([0.3, 1.0]), torch.tensor([0, 0]), torch.tensor([True, False])
    adv = ADVANTAGES.get("dr_grpo")(rewards, groups, include=inc)
    assert adv.tolist() == pytest.approx([0.0, 0.7])
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    out = POLICY_LOSSES.get("asymre")(logp, logp.detach(), adv[:1], torch.ones(1, 2), baseline_shift=-0.1)
    out.per_token_loss.sum().backward()
    assert logp.grad.tolist() == [pytest.approx([-0.1, -0.1])]
    trinity_lone = 0.3 - 0.0  # Trinity: group_baseline 0 for one experience
    assert trinity_lone != pytest.approx(-(-0.1))
