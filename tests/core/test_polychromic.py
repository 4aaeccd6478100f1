"""``algo.advantage.name=polychromic``: the set-level advantage, against values worked out by hand.

"Polychromic Objectives for Reinforcement Learning" (arXiv 2509.25424): a set S of n rollouts
scores f(S) = (1/n sum_{i in S} r_i) * d(S); mixrl's d(S) = distinct final answers in S / n.
A_i = mean f over the group's size-n subsets that contain i - mean f over all of them.

Hand example A (n = 2), rewards [1, 1, 0, 0], answers [a, a, b, c]: the six pairs score
{01}: 1 * 1/2 = 1/2, {02} {03} {12} {13}: 1/2 * 2/2 = 1/2, {23}: 0; mean 5/12.
Rows 0, 1: (1/2 + 1/2 + 1/2)/3 - 5/12 = 1/12; rows 2, 3: (1/2 + 1/2 + 0)/3 - 5/12 = -1/12.

Hand example B (n = 3), rewards [1, 1, 1, 0], answers [a, a, a, b]: {012}: 1 * 1/3 = 1/3;
{013} {023} {123}: 2/3 * 2/3 = 4/9; mean (1/3 + 4/3)/4 = 5/12.
Rows 0-2: (1/3 + 4/9 + 4/9)/3 - 5/12 = 11/27 - 5/12 = -1/108; row 3: 4/9 - 5/12 = +1/36.
The failed but diverse row is pushed UP (GRPO pushes it down); the redundant correct rows slightly down.
"""

from __future__ import annotations

import pytest
import torch

from mixrl.core import ADVANTAGES
from mixrl.core import provenance as prov
from mixrl.core.objective import Objective, TermSpec, compute_objective
from mixrl.trainer.parts.answer_ids import answer_ids, answer_key, number_keys

POLY = ADVANTAGES.get("polychromic")


def test_pairs_by_hand():
    adv = POLY(torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.zeros(4, dtype=torch.long),
               answer_ids=torch.tensor([0, 0, 1, 2]), set_size=2)
    assert torch.allclose(adv, torch.tensor([1 / 12, 1 / 12, -1 / 12, -1 / 12]), atol=1e-7)


def test_a_failed_diverse_row_gets_a_positive_advantage():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0])
    groups = torch.zeros(4, dtype=torch.long)
    adv = POLY(rewards, groups, answer_ids=torch.tensor([0, 0, 0, 1]), set_size=3)
    assert torch.allclose(adv, torch.tensor([-1 / 108, -1 / 108, -1 / 108, 1 / 36]), atol=1e-7)
    assert float(ADVANTAGES.get("grpo")(rewards, groups)[3]) < 0  # the per-rollout baseline pushes it down


def test_groups_and_include_are_separate():
    # group 0 is example A; group 1 is example B plus an excluded row (in no set, advantage 0)
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 5.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1])
    ids = torch.tensor([0, 0, 1, 2, 3, 3, 9, 3, 4])
    include = torch.tensor([True] * 6 + [False] + [True] * 2)
    adv = POLY(rewards, groups, include=include, answer_ids=ids, set_size=3)
    # with n = 3 group 0 (4 rows, rewards [1,1,0,0], answers [a,a,b,c]): {012} 2/3*2/3=4/9, {013} 4/9,
    # {023} 1/3*1=1/3, {123} 1/3; mean 7/18; rows 0,1: (4/9+4/9+1/3)/3 - 7/18 = 11/27 - 7/18 = 1/54; rows 2,3: -1/54
    want = torch.tensor([1 / 54, 1 / 54, -1 / 54, -1 / 54, -1 / 108, -1 / 108, 0.0, -1 / 108, 1 / 36])
    assert torch.allclose(adv, want, atol=1e-7)


def test_refusals():
    # a group with fewer included rows than the set size forms no set: 0 (set_size > num_generations is a ConfigError)
    short = POLY(torch.ones(3), torch.zeros(3, dtype=torch.long), answer_ids=torch.tensor([0, 1, 2]), set_size=4)
    assert short.tolist() == [0.0, 0.0, 0.0]
    one_set = POLY(torch.tensor([1.0, 0.0, 1.0]), torch.zeros(3, dtype=torch.long), answer_ids=torch.tensor([0, 1, 2]), set_size=3)
    assert one_set.tolist() == [0.0, 0.0, 0.0]  # n = G: the group is the only set, its score minus itself
    with pytest.raises(ValueError, match="answer_ids"):
        POLY(torch.ones(3), torch.zeros(3, dtype=torch.long))


def test_policy_gradient_sign_by_hand():
    """ppo_clip, token-mean, ratio 1: d loss / d logp_(i,t) = -A_i / n_tokens, so the failed diverse row's tokens go up."""
    adv = POLY(torch.tensor([1.0, 1.0, 1.0, 0.0]), torch.zeros(4, dtype=torch.long),
               answer_ids=torch.tensor([0, 0, 0, 1]), set_size=3)
    t = 3
    mask = torch.ones(4, t)
    logp0 = -torch.rand(4, t, generator=torch.Generator().manual_seed(0)) - 0.1
    obj = Objective([TermSpec("policy", "policy", ("on_policy",), None, 1.0, "token-mean", {},
                              {"loss": {"name": "ppo_clip", "clip_low": 0.2, "clip_high": 0.2}})])
    logp = logp0.clone().requires_grad_(True)
    loss, _ = compute_objective(obj, logp=logp, mask=mask, advantages=adv.unsqueeze(1).expand(4, t),
                                token_source=torch.full((4, t), prov.ON_POLICY), old_logp=logp0.detach())
    loss.backward()
    want = torch.tensor([1 / 108, 1 / 108, 1 / 108, -1 / 36]).unsqueeze(1).expand(4, t) / (4 * t)
    assert torch.allclose(logp.grad, want, atol=1e-8)
    assert (logp.grad[3] < 0).all() and (logp.grad[:3] > 0).all()  # descent raises row 3, lowers the redundant rows


def test_answer_classes_from_completions():
    assert answer_key("so 3+4 = 7\n#### 007") == "answer:7"
    assert answer_key("no marker ") == "text:no marker"
    assert number_keys(["answer:7", "text:x", "answer:7", "answer:8"]) == [0, 1, 0, 2]

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return {1: "#### 7", 2: "#### 07", 3: "#### 8"}[ids[0]] + "x" * (len(ids) - 1)

    class Acc:
        num_processes = 1

    out = {"completion_ids": torch.tensor([[1, 0], [2, 0], [3, 0]]), "completion_mask": torch.tensor([[1, 0], [1, 0], [1, 0]])}
    assert answer_ids(out, Tok(), Acc()).tolist() == [0, 0, 1]


def _cfg(overrides):
    from mixrl.config.compose import compose_config

    return compose_config(overrides)


@pytest.mark.parametrize("override, words", [("algo.advantage.set_size=1", "set_size"), ("algo.advantage.set_size=9", "num_generations")])
def test_config_refusals_are_one_line(override, words):
    from mixrl.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        _cfg(["algo=polychromic", override])
    assert words in str(e.value) and "\n" not in str(e.value)


def test_explain_row_shows_the_set_formula():
    from mixrl.explain.render import explain_lines

    rows = dict(explain_lines(_cfg(["algo=polychromic"])))
    assert rows["advantage"].startswith("polychromic: A_i = mean_(S in sets of group g, i in S) f(S)") and "/ 4" in rows["advantage"]
