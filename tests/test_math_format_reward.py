"""AMPO's reward (reward=math_format): the verifier mixed with a format score, and a repetition
penalty on non-zero rewards; the expected values are worked out by hand from the authors' code
(EnigmaYYYY/AMPO @ 647e2e4de7f0bdcd2787fa9941d4dbc317facb7e):

* math_verify_reward.py:200  score = (1 - c) * correct + c * format_score, c = 0.1;
* workers/reward_manager/format.py:3-24 (R1_nothink): <answer> and </answer> once each, and the
  text fullmatches '.*<answer>.*</answer>.*';
* mix_dapo_trainer.py:859-868 + utils/reward_score/repetition.py:3-33: words = split on whitespace,
  then on '_'; a 10-word window seen 10 times -> -1, added to the reward's non-zero entries only.
"""

from __future__ import annotations

import pytest

from mixrl.errors import ConfigError
from mixrl.rewards import build_reward
from mixrl.rewards.components import heldout_reward, training_judge
from mixrl.rewards.format_math import format_score, repetition_penalty

LOOP = "a b c d e f g h i j "  # 10 words


@pytest.mark.parametrize("text, expected", [
    ("so <answer>4</answer>", 1.0),
    ("<answer>4</answer> and <answer>5</answer>", 0.0),   # each tag must occur exactly once
    ("</answer> 4 <answer>", 0.0),                          # once each, but out of order: no fullmatch
    ("<answer>4", 0.0),
    ("\\boxed{4}", 0.0),
])
def test_format_score_is_their_r1_nothink_check(text, expected):
    assert format_score(text) == expected


def test_repetition_penalty_counts_10_word_windows():
    assert repetition_penalty(LOOP * 10) == -1.0      # the window a..j at offsets 0, 10, ..., 90: 10 times
    assert repetition_penalty(LOOP * 9 + "a") == 0.0  # a..j 9 times, b..a 9 times: below the limit of 10
    assert repetition_penalty(LOOP.replace(" ", "_") * 10) == -1.0  # '_' splits words as a space does
    assert repetition_penalty("x " * 10) == 0.0        # 10 words: not more than the window, never penalised
    assert repetition_penalty("x " * 11, window=10, limit=2) == -1.0  # two windows, both x*10


def test_math_format_reward_values_by_hand():
    fn = build_reward("math_format")
    texts = [
        "\\boxed{4} <answer>4</answer>",          # correct, formatted: 0.9 * 1 + 0.1 * 1 = 1.0
        "\\boxed{4}",                              # correct, no tags: 0.9
        "\\boxed{5} <answer>5</answer>",           # wrong, formatted: 0.1
        "\\boxed{5}",                              # wrong, no tags: 0.0
        "\\boxed{4} <answer>4</answer> " + LOOP * 10,  # 1.0 - 1 = 0.0
        "\\boxed{4} " + LOOP * 10,                 # 0.9 - 1 = -0.1
        "\\boxed{5} <answer>5</answer> " + LOOP * 10,  # 0.1 - 1 = -0.9
        "\\boxed{5} " + LOOP * 10,                 # 0.0 stays 0.0: the penalty only meets non-zero rewards
    ]
    got = fn(None, texts, answer=["4"] * len(texts))
    assert got == pytest.approx([1.0, 0.9, 0.1, 0.0, 0.0, -0.1, -0.9, 0.0])
    # their "correct" (r > 0.1 + 0.5) is r >= 0.6 on these values; accuracy is the verifier's alone
    assert [r >= 0.6 for r in got] == [True, True, False, False, False, False, False, False]
    assert heldout_reward(fn)(None, texts, answer=["4"] * len(texts)) == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert training_judge(fn) is heldout_reward(fn)


def test_math_format_switches_and_bad_params():
    plain = build_reward("math_format", format_coef=0.0, repetition_penalty=0.0)
    assert plain(None, ["\\boxed{4} " + LOOP * 10, "\\boxed{4} <answer>4</answer>"], answer=["4", "4"]) == [1.0, 1.0]
    assert build_reward("math_format")(None, ["\\boxed{4}"], answer=[None]) == [None]
    for bad, match in [({"format_coef": 1.0}, "format_coef"), ({"repetition_penalty": 1.0}, "repetition_penalty"),
                       ({"repetition_window": 0}, "repetition_window"), ({"tags": []}, "tags")]:
        with pytest.raises(ConfigError, match=match) as e:
            build_reward("math_format", **bad)
        assert "\n" not in str(e.value)
