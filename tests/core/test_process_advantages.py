"""``algo.advantage.name=capo``: per-token advantages from process rewards, against the formula by hand.

    Q_(i,t) = (R_i - sum_s C_(i,s)) + C_(i,t)          on the completion tokens (mask), 0 elsewhere
    A_(i,t) = (Q_(i,t) - mean_g Q) / (stdev_g Q + eps)  over every completion token of the included rows of group g
    (all equal: stdev counts as 1; one token: only centred; no included token: 0)

The example is CAPO's reward with reward=process's defaults (a verdict per step, baseline 1,
placement each, outcome weight 1, step weight 1): a row's reward R_i is the outcome v_i plus its
dense list's sum, and its credit is -1 on each token of a step judged wrong, so Q = v_i - [t wrong].
The expected values are computed with Python's ``statistics`` (unbiased stdev), independently of
``mixrl.core.advantages``. The gradient test runs GRPO's clipped term (``ppo_clip``, token-mean) on
the per-token advantages and compares with autograd through the hand-written clipped loss.
"""

from __future__ import annotations

import statistics

import pytest
import torch

from mixrl.core import ADVANTAGES
from mixrl.core import provenance as prov
from mixrl.core.objective import Objective, TermSpec, compute_objective
from mixrl.core.process_advantages import capo_token_rewards

EPS = 1e-6
# per row: outcome v, the credit of each completion token (a step judged wrong: -1), padding past it
ROWS = [  # group 0                                           group 1
    (1.0, [0, 0, 0, 0]), (1.0, [0, -1, -1, 0]), (0.0, [-1, -1, 0]),   (0.0, [0, 0]), (0.0, [-1, 0, 0, 0]), (1.0, [0, 0, 0]),
]
GROUPS = [0, 0, 0, 1, 1, 1]
T = 4


def _inputs():
    rewards = torch.tensor([v + sum(c) for v, c in ROWS])  # what the trainer sees: the outcome plus the list's sum
    credit = torch.zeros(len(ROWS), T)
    mask = torch.zeros(len(ROWS), T, dtype=torch.long)
    for i, (_, c) in enumerate(ROWS):
        credit[i, : len(c)] = torch.tensor(c, dtype=torch.float32)
        mask[i, : len(c)] = 1
    credit[2, 3] = 7.0  # a value past the completion (padding) is ignored
    return rewards, torch.tensor(GROUPS), credit, mask


def _by_hand(include=None) -> list[list[float]]:
    q = [[v + c for c in cs] for v, cs in ROWS]  # Q = v - [t in a wrong step]
    out = []
    for i in range(len(ROWS)):
        pool = [x for j in range(len(ROWS)) if GROUPS[j] == GROUPS[i] and (include is None or include[j]) for x in q[j]]
        row = []
        for x in q[i]:
            if not pool:
                row.append(0.0)
            elif len(pool) == 1:
                row.append(x - pool[0])
            elif max(pool) == min(pool):
                row.append((x - pool[0]) / (1.0 + EPS))
            else:
                row.append((x - statistics.mean(pool)) / (statistics.stdev(pool) + EPS))
        out.append(row + [0.0] * (T - len(row)))
    return out


def test_token_rewards_by_hand():
    rewards, _, credit, mask = _inputs()
    q = capo_token_rewards(rewards, credit, mask)
    assert q[1].tolist() == [1.0, 0.0, 0.0, 1.0]  # a right answer: 1 on every token, 0 on the wrong step's
    assert q[2].tolist() == [-1.0, -1.0, 0.0, 0.0]  # a wrong answer: -1 on the wrong step, 0 after; padding 0
    assert q[0].tolist() == [1.0] * 4


def test_values_by_hand():
    rewards, groups, credit, mask = _inputs()
    adv = ADVANTAGES.get("capo")(rewards, groups, token_credit=credit, mask=mask, eps=EPS)
    for i, row in enumerate(_by_hand()):
        assert adv[i].tolist() == pytest.approx(row, rel=1e-5, abs=1e-6)
    # one number written out: group 0's 11 tokens hold Q = 1 (x6), 0 (x2), -1 (x2), 0 (x1): mean 4/11
    pool = [1.0] * 6 + [0.0] * 3 + [-1.0] * 2
    assert adv[1, 1].item() == pytest.approx((0 - 4 / 11) / (statistics.stdev(pool) + EPS), rel=1e-5)
    # the wrong step's tokens get less than the right steps' of the same row: the credit GRPO's one number per row lacks
    assert adv[1, 1] < adv[1, 0] and adv[4, 0] < adv[4, 1]


def test_include_and_degenerate_groups():
    rewards, groups, credit, mask = _inputs()
    include = torch.tensor([True, False, False, True, True, True])
    adv = ADVANTAGES.get("capo")(rewards, groups, include=include, token_credit=credit, mask=mask, eps=EPS)
    for i, row in enumerate(_by_hand(include.tolist())):
        assert adv[i].tolist() == pytest.approx(row, rel=1e-5, abs=1e-6)
    # group 0's statistics are row 0's four equal tokens (std 1): row 1's wrong-step tokens get (0 - 1) / (1 + eps)
    assert adv[1, 1].item() == pytest.approx(-1.0 / (1.0 + EPS))
    none = ADVANTAGES.get("capo")(rewards, groups, include=torch.zeros(6, dtype=torch.bool), token_credit=credit, mask=mask)
    assert (none == 0).all()


def test_without_credit_every_token_gets_the_rows_reward():
    rewards, groups, _, mask = _inputs()
    adv = ADVANTAGES.get("capo")(rewards, groups, token_credit=torch.zeros(6, T), mask=mask, eps=EPS)
    r = rewards.tolist()
    pool0 = [r[j] for j in range(3) for _ in ROWS[j][1]]
    assert adv[0, 0].item() == pytest.approx((r[0] - statistics.mean(pool0)) / (statistics.stdev(pool0) + EPS), rel=1e-5)
    assert torch.allclose(adv[0, :4], adv[0, 0].expand(4))


def test_needs_and_refuses_without_inputs():
    assert ADVANTAGES.get("capo").needs == ("token_credit", "mask")
    with pytest.raises(ValueError, match="needs token_credit and mask"):
        ADVANTAGES.get("capo")(torch.zeros(2), torch.zeros(2, dtype=torch.long))


def test_gradient_through_grpos_clipped_term_by_hand():
    """ppo_clip, token-mean over the completion: loss and gradient equal autograd on
    l_t = max(-A_t r_t, -A_t clip(r_t, 0.8, 1.2)) with the hand advantages; padding gets no gradient."""
    rewards, groups, credit, mask = _inputs()
    adv = ADVANTAGES.get("capo")(rewards, groups, token_credit=credit, mask=mask, eps=EPS)
    src = torch.full((6, T), prov.ON_POLICY)
    g = torch.Generator().manual_seed(0)
    logp0 = -torch.rand(6, T, generator=g) - 0.1
    old = (logp0 + 0.3 * torch.randn(6, T, generator=g)).detach()
    obj = Objective([TermSpec("policy", "policy", ("on_policy",), None, 1.0, "token-mean", {},
                              {"loss": {"name": "ppo_clip", "clip_low": 0.2, "clip_high": 0.2}})])
    logp = logp0.clone().requires_grad_(True)
    loss, _ = compute_objective(obj, logp=logp, mask=mask.float(), advantages=adv, token_source=src, old_logp=old)
    loss.backward()

    ref = logp0.clone().requires_grad_(True)
    a = torch.tensor(_by_hand())
    r = torch.exp(ref - old)
    sel = mask.float()
    hand = (torch.maximum(-a * r, -a * torch.clamp(r, 0.8, 1.2)) * sel).sum() / sel.sum()
    hand.backward()
    assert loss.item() == pytest.approx(hand.item(), rel=1e-5)
    assert torch.allclose(logp.grad, ref.grad, atol=1e-7)
    assert (logp.grad[mask == 0] == 0).all()
    # an unclipped token's gradient is -A_t r_t / n_tokens: the wrong step of row 1 is pushed down, its right steps up
    n = float(mask.sum())
    for t in (0, 1):
        rt = float(torch.exp(logp0[1, t] - old[1, t]))
        if abs(rt - 1) <= 0.2 or (a[1, t] > 0 and rt < 1) or (a[1, t] < 0 and rt > 1):
            assert logp.grad[1, t].item() == pytest.approx(-a[1, t].item() * rt / n, rel=1e-4)


def test_trainer_credit_from_the_reward_functions():
    """mixrl.trainer.parts.token_credit on one process: each reward function's last_credit, weighted,
    on its rows' completion tokens; a length that does not match the mask is an error."""
    from types import SimpleNamespace

    from mixrl.trainer.parts.token_credit import local_token_credit, token_credit_inputs

    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    f1 = SimpleNamespace(last_credit={0: [0.0, -1.0, 0.0], 1: [-1.0, 0.0]})
    f2 = SimpleNamespace(last_credit={1: [0.5, 0.5]})
    scalar = SimpleNamespace()  # a reward function without per-token credit
    c = local_token_credit([f1, f2, scalar], torch.tensor([2.0, 1.0, 3.0]), mask)
    assert c.tolist() == [[0.0, -2.0, 0.0, 0.0], [-1.5, 0.5, 0.0, 0.0]]
    acc = SimpleNamespace(pad_across_processes=lambda t, dim, pad_index: t, gather=lambda t: t)
    got = token_credit_inputs({"completion_mask": mask}, [f1], torch.tensor([1.0]), acc)
    assert got["token_credit"][0].tolist() == [0.0, -1.0, 0.0, 0.0] and torch.equal(got["mask"], mask)
    with pytest.raises(RuntimeError, match="3 values for 2 completion tokens"):
        local_token_credit([SimpleNamespace(last_credit={1: [0.0] * 3})], torch.tensor([1.0]), mask)
