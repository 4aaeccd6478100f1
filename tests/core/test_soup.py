"""SOUP (mixrl.sources.tokenmix): the historical prefix of a stored rollout, its tokens'
provenance and recorded log-probs, and the token-level ratios of the policy term, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from mixrl.core import provenance as prov
from mixrl.core.objective import Objective, TermSpec, compute_objective
from mixrl.sources.base import InjectContext, Rollouts
from mixrl.sources.replay import Entry, ReplaySource
from mixrl.sources.rows import splice_prefixes
from mixrl.sources.tokenmix import HISTORICAL, HistoricalPrefix, cut_length

ON = prov.ON_POLICY
L = math.log


def test_cut_length_keeps_one_token_for_the_policy():
    assert cut_length(10, 0.5, 24) == 5
    assert cut_length(10, 0.99, 24) == 9  # never the whole stored completion
    assert cut_length(10, 0.01, 24) == 1
    assert cut_length(10, 0.9, 4) == 3  # the policy samples at least one token
    assert cut_length(1, 0.5, 24) == 0


def _ctx(step=3):
    return InjectContext(tokenizer=None, process_index=0, num_processes=1, num_generations=2, max_completion_length=8,
                         global_step=step, micro_step=0, device=torch.device("cpu"),
                         tokenize_prompts=lambda ps: [[7, 7] if p == "a" else [9] for p in ps], gather=lambda t: t)


def test_the_last_slot_of_a_group_continues_a_stored_rollout_with_its_log_probs():
    """Groups of 2: prompt 'a' has a stored rollout from step 1 ([1, 2, 3, 4], log-probs -0.1 .. -0.4),
    prompt 'b' none. Only slot 1 of group 'a' gets a prefix: 2 of 4 tokens (fraction 0.5); after
    generation those tokens are historical with the stored -0.1, -0.2; the continuation stays on-policy."""
    src = ReplaySource(capacity=8)
    src.buffer.add(Entry(prompt=[7, 7], completion=[1, 2, 3, 4], logp=[-0.1, -0.2, -0.3, -0.4], reward=1.0,
                         advantage=0.5, group_mean=0.5, group_std=0.5, step=1))
    src.buffer.add(Entry(prompt=[7, 7], completion=[5, 6], logp=[-1.0, -1.0], reward=0.0,
                         advantage=-0.5, group_mean=0.5, group_std=0.5, step=3))  # this step's: too young
    inj = HistoricalPrefix(per_group=1, prefix_min=0.5, prefix_max=0.5, min_age=1, revisit=0.0, source=src)
    inputs = [{"prompt": "a"}, {"prompt": "a"}, {"prompt": "b"}, {"prompt": "b"}]
    ctx = _ctx()
    prefixes = inj.generation_prefixes(ctx, inputs)
    assert prefixes == [[], [1, 2], [], []]
    ids, lps, ts = splice_prefixes([[8], [8, 0], [8], [8]], None, prefixes, max_len=8,
                                   prefix_code=prov.code("prefix"), continuation_code=ON)
    out = inj.after_generation(ctx, inputs, Rollouts(ids, lps, [ON] * 4, token_source=ts))
    assert out.completion_ids[1] == [1, 2, 8, 0]
    assert out.token_source[1] == [HISTORICAL, HISTORICAL, ON, ON]
    assert out.behaviour_logp[1] == [-0.1, -0.2]
    assert out.token_source[0] is None and out.behaviour_logp[0] is None
    assert inj.metrics["soup/prefixed_rows"] == 1.0


def test_token_level_ratios_against_each_behaviour_by_hand():
    """One row, A = 1: a historical prefix token (p = 0.5, pi_hist = 0.25: r = 2, clipped at 1.2, no
    gradient) and a continuation token (p = pi_old = 0.5: r = 1). Token-mean over the two:
    L = (-1.2 - 1) / 2, dL/dlogp = [0, -1/2]."""
    logp = torch.tensor([[L(0.5), L(0.5)]], requires_grad=True)
    obj = Objective([TermSpec("policy", "policy", ("on_policy", "historical"), None, 1.0, "token-mean", {},
                              {"loss": {"name": "ppo_clip"}})])
    loss, metrics = compute_objective(obj, logp=logp, mask=torch.ones(1, 2), advantages=torch.tensor([1.0]),
                                      token_source=torch.tensor([[HISTORICAL, ON]]),
                                      old_logp=torch.tensor([[L(0.5), L(0.5)]]),
                                      behaviour_logp=torch.tensor([[L(0.25), float("nan")]]))
    assert loss.item() == pytest.approx((-1.2 - 1.0) / 2)
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([0.0, -0.5])
    assert metrics["clip_frac"] == pytest.approx(0.5)
