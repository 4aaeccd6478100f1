"""reward=math_think_format: CHORD's math reward, the accuracy minus 0.1 without the <think> format.

Expected values by hand from the authors' code (Trinity-RFT @ 9051d637, read from the
yanxi-chen/Trinity-RFT mirror): trinity/common/rewards/math_reward.py:59-65 returns
{"accuracy": acc, "format_score": -0.1 if with_think and not validate_think_pattern(response)},
and the workflow sums them (customized_math_workflows.py:80); validate_think_pattern
(eval_utils.py:111-124) wants exactly one "<think>" and one "</think>", the opening tag first.
"""

import pickle

import pytest

from mixrl.errors import ConfigError
from mixrl.rewards import REWARDS, build_reward
from mixrl.rewards.builtin import think_format_ok


@pytest.mark.parametrize("text, ok", [
    ("<think>\n2 + 2 = 4 </think>\nSo \\boxed{4}", True),
    ("So \\boxed{4}", False),                          # no tags: count 0
    ("</think> then <think> \\boxed{4}", False),       # closing tag first
    ("<think> a <think> b </think> \\boxed{4}", False),  # two opening tags
    ("<think> a </think> b </think> \\boxed{4}", False),  # two closing tags
    ("<think> only the opening \\boxed{4}", False),
])
def test_think_format_check(text, ok):
    assert think_format_ok(text) is ok


@pytest.mark.parametrize("text, gold, expected", [
    ("<think>\n2 + 2 = 4 </think>\nSo \\boxed{4}", "4", 1.0),   # correct, format ok: 1 + 0
    ("So \\boxed{4}", "4", 0.9),                                  # correct, no format: 1 - 0.1
    ("<think> 2 + 3 </think> \\boxed{5}", "4", 0.0),             # wrong, format ok: 0 + 0
    ("<think> a <think> b </think> \\boxed{5}", "4", -0.1),     # wrong, two openings: 0 - 0.1
    ("</think> <think> \\boxed{4}", "4", 0.9),                    # correct, tags out of order
])
def test_math_think_format_by_hand(text, gold, expected):
    fn = build_reward("math_think_format")
    assert fn(prompts=["q"], completions=[text], answer=[gold]) == [pytest.approx(expected)]
    # chat completions are scored on the assistant's content
    chat = [[{"role": "assistant", "content": text}]]
    assert fn(prompts=["q"], completions=chat, answer=[gold]) == [pytest.approx(expected)]


def test_math_think_format_params_and_errors():
    fn = build_reward("math_think_format", format_penalty=0.25, answer_column="gold")
    assert fn(prompts=["q"], completions=["\\boxed{4}"], gold=["4"]) == [pytest.approx(0.75)]
    assert fn(prompts=["q"], completions=["\\boxed{4}"], gold=[None]) == [None]  # no gold: TRL ignores the row
    assert pickle.loads(pickle.dumps(fn))(prompts=["q"], completions=["<think></think>\\boxed{4}"], gold=["4"]) == [1.0]
    assert "math_think_format" in REWARDS
    with pytest.raises(ConfigError, match="format_penalty"):
        build_reward("math_think_format", format_penalty=-1)
    with pytest.raises(ConfigError, match="unknown param"):
        build_reward("math_think_format", penalty=0.1)


def test_reward_option_composes():
    from mixrl.config.compose import compose_config

    cfg = compose_config(["reward=math_think_format"])
    assert cfg.reward.name == "math_think_format" and cfg.reward.params.format_penalty == 0.1
