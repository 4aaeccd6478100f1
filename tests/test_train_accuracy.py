"""The training ``accuracy`` metric (the policy's own rollouts) with a reward from a model: it counted
``reward >= 1``, so a reward model's scores in (0, 1) read 0 however right the completions were. It
is now the verifier's verdict where the reward names one (as held-out accuracy already was,
mixrl.rewards.components.heldout_reward), and absent, not 0, where it names none
(mixrl.trainer.parts.scoring.Scoring.correct, mixrl.rewards.components.training_judge)."""

from __future__ import annotations

import pytest
import torch

from mixrl.rewards import build_reward
from mixrl.rewards.components import training_judge
from mixrl.trainer.parts.scoring import Scoring

#: three rollouts of the arithmetic task: right, wrong, right (the `exact` verifier: the text after #### equals the answer)
TEXTS = ["8 #### 8", "3 #### 3", "3 6 #### 6"]
ROWS = [{"prompt": "3+5=", "answer": "8"}, {"prompt": "3+5=", "answer": "8"}, {"prompt": "1+2+3=", "answer": "6"}]
IDS = torch.tensor([[0, 9], [1, 9], [2, 9]])  # token 9: padding, outside the completion mask
MASK = torch.tensor([[1, 0], [1, 0], [1, 0]])
RM_SCORES = torch.tensor([0.71, 0.32, 0.64])  # what a reward model's sigmoid scores look like: never >= 1


def _scoring(fn) -> Scoring:
    def decode(ids):
        assert all(len(x) == 1 for x in ids), ids  # the padding was cut by the mask
        return [TEXTS[x[0]] for x in ids]

    return Scoring(reward_funcs=[fn], reward_weights=torch.ones(1), decode=decode, calculate=None,
                   is_conversational=lambda row: False, device="cpu")


def _gather(t):
    return torch.cat([t, t])  # two processes holding the same rows


def test_a_reward_model_with_a_verifier_counts_the_verifiers_verdicts():
    rm = build_reward("model", path="builtin:tiny-rm")  # loads nothing until called; Scoring.correct never calls it
    assert training_judge(rm) is rm.fn.verifier
    correct = _scoring(rm).correct(RM_SCORES, ROWS, IDS, MASK, gather=_gather)
    assert correct.tolist() == [True, False, True] * 2  # before: RM_SCORES >= 1, all False, accuracy 0
    assert float(correct.float().mean()) == pytest.approx(2 / 3)


def test_a_reward_model_without_a_verifier_logs_no_accuracy():
    rm = build_reward("model", path="builtin:tiny-rm", verifier="none")
    assert training_judge(rm) is None
    assert _scoring(rm).correct(RM_SCORES, ROWS, IDS, MASK, gather=_gather) is None  # before: accuracy 0.0


def test_a_rule_reward_is_its_own_verifier():
    exact = build_reward("exact")
    assert training_judge(exact) is exact
    primary = torch.tensor([1.0, 0.0, float("nan"), 1.0])  # NaN: no verdict, not correct
    correct = _scoring(exact).correct(primary, [], IDS[:0], MASK[:0], gather=_gather)
    assert correct.tolist() == [True, False, False, True]
