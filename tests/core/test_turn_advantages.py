"""MT-GRPO's turn-level advantage (``algo.advantage.name=mt_grpo``) against the formula by hand.

The example: 2 prompt groups x 3 rows, 1 to 3 turns each, rewards as ``env=arith_retry`` gives
them (+1 a correct answer, -0.5 a wrong one). The expected values are computed here from the
formula with Python's ``statistics`` (unbiased stdev), independently of ``mixrl.core.advantages``:

    A_(i,k) = A^O_i + lambda A^T_(i,k) [k < K_i - 1]
    outcome=last (default): A^O_i = (o_i - mean_g o) / (stdev_g o + eps), o_i = r_(i,K_i), for K_i >= 2;
                            A^O_i = (R_i - mean_g R) / (stdev_g R + eps), R_i = sum_k r_(i,k), for K_i = 1
    outcome=return:         A^O_i = (R_i - mean_g R) / (stdev_g R + eps) for every row
    A^T_(i,k) = (r_(i,k) - mean_(g,k) r) / (stdev_(g,k) r + eps) over the rows of g with a turn k
    (a group whose values are all equal: stdev counts as 1; one row: only centred)

as the authors' ``_assign_advantages`` / ``_compute_normalized_advantages``
(github.com/SiliangZeng/Multi-Turn-RL-Agent @ 7dbdd08bdb27810019bc1511dbd0af3c7cfaac7a,
verifiers/trainers/mt_grpo_env_trainer.py:172-208, grpo_env_trainer.py) write it for two turns: a row
with a tool result gets outcome_adv (the outcome reward functions only) + coef turn_adv on its first
turn (lines 197-202), a row without one combined_adv (turn + outcome functions, lines 205-206). The gradient test runs GRPO's clipped term
(``ppo_clip``, token-mean) on the per-token advantages and compares with autograd through the
hand-written clipped loss.
"""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from mixrl.core import ADVANTAGES
from mixrl.core import provenance as prov
from mixrl.core.objective import Objective, TermSpec, compute_objective
from mixrl.core.turn_advantages import first_minus_last, tokens_from_turns, turn_reward_matrix

EPS = 1e-4
TURNS = [  # group 0                                   group 1
    [-0.5, 1.0], [1.0], [-0.5, -0.5, -0.5],             [-0.5, -0.5, 1.0], [-0.5, 1.0], [-0.5, -0.5, -0.5],
]
GROUPS = [0, 0, 0, 1, 1, 1]


def _norm(values: list[float], x: float) -> float:
    if len(values) == 1:
        return x - values[0]
    if max(values) == min(values):
        return (x - values[0]) / (1.0 + EPS)
    return (x - statistics.mean(values)) / (statistics.stdev(values) + EPS)


def _by_hand(lam: float, outcome: str = "last") -> list[list[float]]:
    returns = [sum(t) for t in TURNS]
    finals = [t[-1] for t in TURNS]
    out = []
    for i, turns in enumerate(TURNS):
        g = [j for j in range(len(TURNS)) if GROUPS[j] == GROUPS[i]]
        if outcome == "last" and len(turns) >= 2:
            a_out = _norm([finals[j] for j in g], finals[i])
        else:
            a_out = _norm([returns[j] for j in g], returns[i])
        row = []
        for k, r in enumerate(turns):
            a_turn = _norm([TURNS[j][k] for j in g if len(TURNS[j]) > k], r)
            row.append(a_out + lam * a_turn * (k < len(turns) - 1))
        out.append(row)
    return out


def _inputs():
    rewards = torch.tensor([sum(t) for t in TURNS])
    return rewards, torch.tensor(GROUPS), turn_reward_matrix(TURNS)


def test_turn_reward_matrix_pads_with_nan():
    m = turn_reward_matrix([[1.0], [-0.5, 1.0]])
    assert m.shape == (2, 2) and m[1].tolist() == [-0.5, 1.0] and m[0, 0] == 1.0 and math.isnan(m[0, 1])


@pytest.mark.parametrize("outcome", ["last", "return"])
@pytest.mark.parametrize("lam", [1.0, 0.5])
def test_per_turn_values_by_hand(lam, outcome):
    rewards, groups, tr = _inputs()
    per_turn = ADVANTAGES.get("mt_grpo")(rewards, groups, turn_rewards=tr, turn_coef=lam, outcome=outcome)
    expected = _by_hand(lam, outcome)
    for i, row in enumerate(expected):
        assert per_turn[i, : len(row)].tolist() == pytest.approx(row, rel=1e-5, abs=1e-6)
        assert torch.isnan(per_turn[i, len(row):]).all()
    # one number written out. Group 0's turn 0 rewards (-0.5, 1, -0.5): mean 0, stdev sqrt(0.75).
    # return: the returns (0.5, 1, -1.5) have mean 0 and stdev sqrt(1.75); row 0's first turn A^O + lam A^T.
    # last: the last turns' rewards (1, 1, -0.5) have mean 0.5 and stdev sqrt(0.75) for the two-turn rows 0 and 2
    a_out = 0.5 / (math.sqrt(1.75) + EPS) if outcome == "return" else 0.5 / (math.sqrt(0.75) + EPS)
    a0 = a_out + lam * (-0.5 / (math.sqrt(0.75) + EPS))
    assert per_turn[0, 0].item() == pytest.approx(a0, rel=1e-5)
    # row 1 has one turn (no observation: the authors' "no tool result"): the return's advantage under both
    assert per_turn[1, 0].item() == pytest.approx(1.0 / (math.sqrt(1.75) + EPS), rel=1e-5)
    # group 1's turn 0 rewards are all -0.5 (std 0 counts as 1): its first turns add nothing to A^O
    assert per_turn[3, 0].item() == pytest.approx(per_turn[3, 2].item(), rel=1e-6)


def test_lambda_zero_outcome_return_is_grpo_on_every_token():
    rewards, groups, tr = _inputs()
    per_turn = ADVANTAGES.get("mt_grpo")(rewards, groups, turn_rewards=tr, turn_coef=0.0, outcome="return")
    grpo = ADVANTAGES.get("grpo")(rewards, groups, eps=EPS)
    has = ~torch.isnan(per_turn)
    assert torch.allclose(per_turn[has], grpo.unsqueeze(1).expand_as(per_turn)[has])
    # outcome=last: a multi-turn row's outcome advantage is GRPO's of the last turns' rewards, a one-turn row's of the returns
    last = ADVANTAGES.get("mt_grpo")(rewards, groups, turn_rewards=tr, turn_coef=0.0)
    finals = ADVANTAGES.get("grpo")(torch.tensor([t[-1] for t in TURNS]), groups, eps=EPS)
    multi = torch.tensor([len(t) >= 2 for t in TURNS])
    assert torch.allclose(last[:, 0], torch.where(multi, finals, grpo))


def test_unknown_outcome_is_refused():
    rewards, groups, tr = _inputs()
    with pytest.raises(ValueError, match="outcome must be one of"):
        ADVANTAGES.get("mt_grpo")(rewards, groups, turn_rewards=tr, outcome="final")


def test_tokens_get_their_turns_advantage_observations_zero():
    rewards, groups, tr = _inputs()
    # row 0: turn 0 (2 tokens), an observation (2), turn 1 (1), padding; row 1: one turn of 3 tokens
    ids = torch.full((6, 6), -1)
    ids[0] = torch.tensor([0, 0, -1, -1, 1, -1])
    ids[1, :3] = 0
    ids[2] = torch.tensor([0, -1, 1, -1, 2, 2])
    adv = ADVANTAGES.get("mt_grpo")(rewards, groups, turn_rewards=tr, turn_ids=ids)
    per_turn = ADVANTAGES.get("mt_grpo")(rewards, groups, turn_rewards=tr)
    e = _by_hand(1.0)
    assert adv[0].tolist() == pytest.approx([e[0][0], e[0][0], 0, 0, e[0][1], 0], abs=1e-6)
    assert adv[1].tolist() == pytest.approx([e[1][0]] * 3 + [0] * 3, abs=1e-6)
    assert adv[2].tolist() == pytest.approx([e[2][0], 0, e[2][1], 0, e[2][2], e[2][2]], abs=1e-6)
    assert (adv[3:] == 0).all()  # rows with no token of any turn
    assert torch.equal(tokens_from_turns(per_turn, ids), adv)
    # a turn id past the row's rewards (a turn without a reward) gets 0, not a neighbour's value
    assert tokens_from_turns(per_turn, torch.tensor([[0] * 6] * 5 + [[5] * 6]))[5].abs().sum() == 0


def test_first_minus_last_by_hand():
    rewards, groups, tr = _inputs()
    per_turn = ADVANTAGES.get("mt_grpo")(rewards, groups, turn_rewards=tr)
    e = _by_hand(1.0)
    multi = [row for row in e if len(row) >= 2]
    assert first_minus_last(per_turn) == pytest.approx(statistics.mean(r[0] - r[-1] for r in multi), rel=1e-5)
    assert first_minus_last(turn_reward_matrix([[1.0], [0.5]])) is None


def test_needs_turn_rewards():
    with pytest.raises(ValueError, match="needs turn_rewards"):
        ADVANTAGES.get("mt_grpo")(torch.zeros(2), torch.zeros(2, dtype=torch.long))
    assert ADVANTAGES.get("mt_grpo").needs == ("turn_rewards", "turn_ids")


def test_gradient_through_grpos_clipped_term_by_hand():
    """GRPO's ``ppo_clip`` (token-mean over on-policy tokens) on the per-token advantages: loss and
    gradient equal autograd on l_t = max(-A_t r_t, -A_t clip(r_t, 0.8, 1.2)); observation tokens
    (provenance environment) get no gradient."""
    rewards, groups, tr = _inputs()
    ON, ENV = prov.ON_POLICY, prov.ENVIRONMENT
    ids = torch.tensor([[0, 0, -1, -1, 1, 1], [0, 0, 0, 0, 0, 0], [0, -1, 1, -1, 2, 2],
                        [0, -1, 1, -1, 2, 2], [0, 0, -1, 1, 1, 1], [0, -1, 1, 1, -1, 2]])
    src = torch.where(ids >= 0, ON, ENV)
    mask = torch.ones(6, 6)
    adv = ADVANTAGES.get("mt_grpo")(rewards, groups, turn_rewards=tr, turn_ids=ids)
    g = torch.Generator().manual_seed(0)
    logp0 = -torch.rand(6, 6, generator=g) - 0.1
    old = (logp0 + 0.3 * torch.randn(6, 6, generator=g)).detach()  # ratios both inside and outside [0.8, 1.2]
    obj = Objective([TermSpec("policy", "policy", ("on_policy",), None, 1.0, "token-mean", {},
                              {"loss": {"name": "ppo_clip", "clip_low": 0.2, "clip_high": 0.2}})])
    logp = logp0.clone().requires_grad_(True)
    loss, _ = compute_objective(obj, logp=logp, mask=mask, advantages=adv, token_source=src, old_logp=old, turn_ids=ids)
    loss.backward()

    ref = logp0.clone().requires_grad_(True)
    sel = (ids >= 0).float()  # the hand formula: turn tokens only, token-mean over them
    a = torch.tensor(_tokens_by_hand(ids))
    r = torch.exp(ref - old)
    per_tok = torch.maximum(-a * r, -a * torch.clamp(r, 0.8, 1.2))
    hand = (per_tok * sel).sum() / sel.sum()
    hand.backward()
    assert loss.item() == pytest.approx(hand.item(), rel=1e-5)
    assert torch.allclose(logp.grad, ref.grad, atol=1e-7)
    assert (logp.grad[ids < 0] == 0).all() and logp.grad[ids >= 0].abs().sum() > 0
    clipped = (r - 1).abs() > 0.2
    assert bool((clipped & (ids >= 0)).any()) and bool((~clipped & (ids >= 0)).any())  # both branches are exercised


def _tokens_by_hand(ids: torch.Tensor) -> list[list[float]]:
    e = _by_hand(1.0)
    return [[e[i][k] if 0 <= k < len(e[i]) else 0.0 for k in row] for i, row in enumerate(ids.tolist())]


def test_trainer_inputs_and_local_rows_on_one_process():
    """mixrl.trainer.parts.turn_credit on one process: the rows' turn_rewards as a NaN-padded
    matrix, the batch's turn_id (or one turn per row when the batch has none), and the per-token
    advantages cut back to this process's rows and width."""
    from types import SimpleNamespace

    from mixrl.trainer.parts.turn_credit import local_advantages, turn_inputs, turn_metrics

    acc = SimpleNamespace(num_processes=1, pad_across_processes=lambda t, dim, pad_index: t, gather=lambda t: t)
    out = {"completion_ids": torch.zeros(2, 4, dtype=torch.long), "completion_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]),
           "turn_id": torch.tensor([[0, -1, 1, 1], [0, 0, 0, 0]])}
    got = turn_inputs(out, [{"turn_rewards": [-0.5, 1.0]}, {"turn_rewards": [1.0]}], acc)
    assert got["turn_rewards"][0].tolist() == [-0.5, 1.0] and math.isnan(got["turn_rewards"][1, 1])
    assert torch.equal(got["turn_ids"], out["turn_id"])
    single = turn_inputs({**out, "turn_id": None}, [{"turn_rewards": [1.0]}] * 2, acc)["turn_ids"]
    assert single.tolist() == [[0, 0, 0, -1], [0, 0, -1, -1]]
    wide = torch.arange(18.0).view(3, 6)
    assert torch.equal(local_advantages(wide, 1, 2, 4), wide[1:3, :4])
    assert torch.equal(local_advantages(torch.arange(3.0), 1, 2, 4), torch.tensor([1.0, 2.0]))
    m = turn_metrics(torch.tensor([0.5, 1.0]), torch.zeros(2, dtype=torch.long), got, {"turn_coef": 1.0, "eps": EPS})
    per_turn = ADVANTAGES.get("mt_grpo")(torch.tensor([0.5, 1.0]), torch.zeros(2, dtype=torch.long), turn_rewards=got["turn_rewards"])
    assert m == {"turn/multi_turn_rows": 0.5, "turn/advantage_first_minus_last": pytest.approx(float(per_turn[0, 0] - per_turn[0, 1]))}
