"""SRPO (mixrl.core.srpo, mixrl.sources.verdict): the entropy-weighted self-distillation term by
hand (value and gradient), the routing of failed rollouts, and the routed objective."""

from __future__ import annotations

import math

import pytest
import torch

from mixrl.core import provenance as prov
from mixrl.core.objective import Objective, TermSpec, compute_objective
from mixrl.core.terms import TERMS, TermInputs
from mixrl.sources.base import InjectContext
from mixrl.sources.verdict import FAILED, RouteByOutcome

ON = prov.ON_POLICY


def test_srpo_distill_value_and_gradient_by_hand():
    """Tokens: log p = [-0.5, -2.0], log q = [-1.5, -1.0], H_T = [0, ln 4], tau = 1:
    w = [1, 1/4]; l = w (log p - log q)^2 / 2 = [0.5, 0.125]; grad = w (log p - log q) = [1, -0.25]."""
    logp = torch.tensor([[-0.5, -2.0]], requires_grad=True)
    x = TermInputs(logp=logp, mask=torch.ones(1, 2, dtype=torch.bool), advantages=torch.zeros(1),
                   behaviour_logp=logp.detach(), teacher_logp=torch.tensor([[-1.5, -1.0]]),
                   teacher_entropy=torch.tensor([[0.0, math.log(4.0)]]))
    out = TERMS.get("srpo_distill")(x, tau=1.0)
    assert out.per_token[0].tolist() == pytest.approx([0.5, 0.125])
    out.per_token.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([1.0, -0.25])
    assert out.metrics["srpo/weight"] == pytest.approx(0.625)


def test_srpo_tau_scales_the_entropy():
    """tau = 2: w = exp(-ln 4 / 2) = 1/2."""
    logp = torch.tensor([[-2.0]], requires_grad=True)
    x = TermInputs(logp=logp, mask=torch.ones(1, 1, dtype=torch.bool), advantages=torch.zeros(1),
                   behaviour_logp=logp.detach(), teacher_logp=torch.tensor([[-1.0]]),
                   teacher_entropy=torch.tensor([[math.log(4.0)]]))
    out = TERMS.get("srpo_distill")(x, tau=2.0)
    assert out.per_token.item() == pytest.approx(0.25)


def _ctx(primary):
    return InjectContext(tokenizer=None, process_index=0, num_processes=1, num_generations=2, max_completion_length=4,
                         global_step=0, micro_step=0, device=torch.device("cpu"), tokenize_prompts=lambda p: [],
                         gather=lambda t: t, primary_rewards=torch.tensor(primary))


def test_failed_rollouts_are_routed_and_correct_ones_kept():
    """Rows: correct rollout, failed rollout, an expert row with reward 0 (not a rollout: untouched)."""
    out = {
        "completion_ids": torch.zeros(3, 2, dtype=torch.long),
        "row_source": torch.tensor([ON, ON, prov.EXPERT]),
        "token_source": torch.tensor([[ON, ON], [ON, ON], [prov.EXPERT, prov.EXPERT]]),
    }
    out = RouteByOutcome(threshold=1.0).after_advantages(_ctx([1.0, 0.0, 0.0]), [], out)
    assert out["token_source"].tolist() == [[ON, ON], [FAILED, FAILED], [prov.EXPERT, prov.EXPERT]]


def test_routed_objective_by_hand():
    """One correct row (A = 1, r = 1, 1 token) and one failed row (1 token, log p = -0.5, log q = -1.5,
    H_T = 0): token-mean over both rows' tokens: L = (-1 + 0.5) / 2; the failed row's advantage is
    not used; gradients: correct -1/2 (policy), failed (log p - log q) / 2 = 0.5."""
    logp = torch.tensor([[-1.0], [-0.5]], requires_grad=True)
    obj = Objective([
        TermSpec("policy", "policy", ("on_policy",), ("on_policy", "failed"), 1.0, "token-mean", {}, {"loss": {"name": "ppo_clip"}}),
        TermSpec("distill", "srpo_distill", ("failed",), ("on_policy", "failed"), 1.0, "token-mean", {}, {"tau": 1.0}),
    ])
    loss, metrics = compute_objective(obj, logp=logp, mask=torch.ones(2, 1), advantages=torch.tensor([1.0, -7.0]),
                                      token_source=torch.tensor([[ON], [FAILED]]), teacher_logp=torch.tensor([[float("nan")], [-1.5]]),
                                      teacher_entropy=torch.tensor([[float("nan")], [0.0]]))
    assert loss.item() == pytest.approx((-1.0 + 0.5) / 2)
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-0.5, 0.5])
    assert metrics["loss/distill"] == pytest.approx(0.25)
