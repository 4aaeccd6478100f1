"""Multi-turn rows: tokens a tool or environment wrote are never trained, turns are numbered
per row, and the turn-level ratio (Turn-PPO / ST-PPO) against values and gradients by hand.

The equivalence tests compose GRPO and LUFFY (a mixed family: expert rows in the group) once
per module, and compare a row whose tool tokens carry the ``environment`` provenance with the
same row whose tool tokens are simply out of the mask.
"""

from __future__ import annotations

import math

import pytest
import torch

from mixrl.core import provenance as prov
from mixrl.core.objective import Objective, TermSpec, compute_objective
from mixrl.core.turns import turn_ids, turn_log_ratio, turn_ppo

ON, EXP, ENV = prov.ON_POLICY, prov.EXPERT, prov.ENVIRONMENT


def test_turn_ids_number_the_policy_runs_of_each_row():
    m = torch.tensor([[1, 1, 0, 0, 1, 0, 1, 1], [0, 1, 1, 1, 1, 1, 0, 0]])
    assert turn_ids(m).tolist() == [[0, 0, -1, -1, 1, -1, 2, 2], [-1, 0, 0, 0, 0, 0, -1, -1]]


def test_turn_log_ratio_is_the_mean_over_the_turns_tokens():
    lr = torch.tensor([[0.1, 0.3, 9.0, -0.2]])
    turns = torch.tensor([[0, 0, -1, 1]])
    out = turn_log_ratio(lr, torch.tensor([[1, 1, 0, 1]]), turns)
    assert out[0].tolist() == pytest.approx([0.2, 0.2, 0.0, -0.2])


def test_turn_ppo_value_and_gradient_by_hand():
    """Two turns: (t0, t1) ratio exp(mean(0.1, 0.3)) = e^0.2 > 1.2, clipped for A > 0 (zero
    gradient); (t3) ratio e^-0.05 inside the clip: l = -A w, dl/dlogp_3 = -A w. t2 is a tool's."""
    logp = torch.tensor([[-0.4, -0.7, -0.3, -1.05]], requires_grad=True)
    old = torch.tensor([[-0.5, -1.0, -0.3, -1.0]])
    mask = torch.tensor([[1, 1, 0, 1]])
    turns = torch.tensor([[0, 0, -1, 1]])
    a = 2.0
    out = turn_ppo(logp, old, torch.tensor([a]), mask, clip_low=0.2, clip_high=0.2, turn_ids=turns)
    w0, w1 = math.exp(0.2), math.exp(-0.05)
    expected = [-a * min(w0, 1.2), -a * min(w0, 1.2), 0.0, -a * w1]
    assert out.per_token_loss[0].tolist() == pytest.approx(expected, rel=1e-6)
    assert out.clipped[0].tolist() == [True, True, False, False]
    out.per_token_loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, 0.0, 0.0, -a * w1], rel=1e-6)


def test_turn_ppo_gradient_of_an_unclipped_turn_spreads_the_turn_ratio():
    """d l_t / d logp_u = -A w_k for u = t (GSPO-token form): each token's own log-prob, the turn's ratio."""
    logp = torch.tensor([[-0.5, -0.9, -0.2]], requires_grad=True)
    old = torch.tensor([[-0.55, -0.85, -0.2]])
    a = -1.0
    out = turn_ppo(logp, old, torch.tensor([a]), torch.ones(1, 3), turn_ids=torch.tensor([[0, 0, 1]]))
    w0 = math.exp((0.05 - 0.05) / 2)
    assert out.per_token_loss[0].tolist() == pytest.approx([-a * w0, -a * w0, -a * 1.0], rel=1e-6)
    out.per_token_loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-a * w0, -a * w0, -a], rel=1e-6)


def test_turn_ppo_without_turns_is_gspos_sequence_ratio():
    from mixrl.core.sequence_losses import gspo
    logp = torch.tensor([[-0.5, -0.9, -0.2]])
    old = torch.tensor([[-0.52, -0.85, -0.25]])
    args = (logp, old, torch.tensor([1.5]), torch.ones(1, 3))
    assert torch.allclose(turn_ppo(*args, clip_low=0.1, clip_high=0.1).per_token_loss,
                          gspo(*args, clip_low=0.1, clip_high=0.1).per_token_loss)


def test_policy_term_passes_the_batchs_turns_to_a_turn_level_loss():
    logp = torch.tensor([[-0.4, -0.7, -0.3, -1.05]], requires_grad=True)
    old = torch.tensor([[-0.5, -1.0, -0.3, -1.0]])
    src = torch.tensor([[ON, ON, ENV, ON]])
    obj = Objective([TermSpec("policy", "policy", ("on_policy",), None, 1.0, "token-mean", {},
                              {"loss": {"name": "turn_ppo", "clip_low": 0.2, "clip_high": 0.2}})])
    loss, _ = compute_objective(obj, logp=logp, mask=torch.ones(1, 4), advantages=torch.tensor([2.0]),
                                token_source=src, old_logp=old, turn_ids=turn_ids(src != ENV))
    assert loss.item() == pytest.approx((2 * -2.0 * 1.2 - 2.0 * math.exp(-0.05)) / 3, rel=1e-6)  # token-mean over 3 tokens


# --------------------------------------------------------------------------- tool tokens are never trained

@pytest.fixture(scope="module")
def objectives():
    from mixrl.config.builders import build_objective
    from mixrl.config.compose import compose_config
    return {name: build_objective(compose_config([f"algo={name}", "algo.kl.coef=0.05", "algo.entropy_coef=0.01"])) for name in ("grpo", "luffy")}


def _row_batch():
    """Row 0: a rollout with a tool call (tokens 2-3 a tool's result); row 1: an expert
    trajectory, its tool result at tokens 1-2; padding at the end of row 1."""
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(2, 6, generator=g) - 0.1
    old = (logp + 0.05 * torch.randn(2, 6, generator=g)).detach()
    old[1] = float("nan")  # an expert row: no behaviour log-prob
    ref = (logp + 0.1 * torch.randn(2, 6, generator=g)).detach()
    tool = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0]], dtype=torch.bool)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    src = torch.tensor([[ON] * 6, [EXP] * 6])
    return logp, old, ref, tool, mask, src


@pytest.mark.parametrize("name", ["grpo", "luffy"])
def test_tool_tokens_count_as_if_they_were_out_of_the_mask(objectives, name):
    logp0, old, ref, tool, mask, src = _row_batch()
    adv = torch.tensor([0.7, 1.3])
    entropies = torch.rand(2, 6, generator=torch.Generator().manual_seed(1))
    runs = {}
    for kind in ("environment", "unmasked"):
        logp = logp0.clone().requires_grad_(True)
        if kind == "environment":
            s, m = src.masked_fill(tool, ENV), mask
        else:
            s, m = src, mask * (~tool).long()
        loss, _ = compute_objective(objectives[name], logp=logp, mask=m, advantages=adv, token_source=s,
                                    old_logp=torch.where(s == EXP, torch.full_like(old, float("nan")), old),
                                    ref_logp=ref, entropies=entropies)
        loss.backward()
        runs[kind] = (loss.detach(), logp.grad.clone())
    assert runs["environment"][0].item() == pytest.approx(runs["unmasked"][0].item(), rel=1e-6)
    assert torch.allclose(runs["environment"][1], runs["unmasked"][1], atol=1e-7)
    assert (runs["environment"][1][tool] == 0).all()
    assert runs["environment"][1][~tool & mask.bool()].abs().sum() > 0  # the policy's own tokens do train
