"""Process rewards to tokens (mixrl.core.process_rewards), against values written out by hand
from the mapping rule: token t belongs to the first step whose end character is >= t's end character."""

from __future__ import annotations

import pytest

from mixrl.core.process_rewards import step_spans, step_token_rewards, token_char_ends


def test_steps_end_after_each_separator_and_keep_it():
    assert step_spans("a\n\nbb\n\nc", "\n\n") == [(0, 3), (3, 7), (7, 8)]
    assert step_spans("8 10 #### 10", " ") == [(0, 2), (2, 5), (5, 10), (10, 12)]
    assert step_spans("ends with sep\n\n", "\n\n") == [(0, 15)]  # no empty last step
    assert step_spans("", " ") == []


def test_a_zero_width_regex_cuts_before_each_marker():
    text = "Step 1: a. Step 2: b."
    assert step_spans(text, r"(?=Step \d+:)", regex=True) == [(0, 11), (11, 21)]


def test_token_ends_come_from_the_decoded_prefixes():
    # "8", "8 ", "8 1", "8 10" and an eos that decodes to nothing more
    assert token_char_ends(["8", "8 ", "8 1", "8 10", "8 10"]) == [1, 2, 3, 4, 4]


def test_placements_by_hand():
    # text "8 10 ####" as tokens "8"," ","1","0"," ","#","#","#","#" then eos: ends 1..9, 9
    token_ends = [1, 2, 3, 4, 5, 6, 7, 8, 9, 9]
    step_ends = [2, 5, 9]  # "8 " | "10 " | "####"
    scores = [0.0, -1.0, 2.0]
    assert step_token_rewards(step_ends, token_ends, scores, "last") == [0, 0.0, 0, 0, -1.0, 0, 0, 0, 2.0, 0]
    assert step_token_rewards(step_ends, token_ends, scores, "each") == [0.0, 0.0, -1.0, -1.0, -1.0, 2.0, 2.0, 2.0, 2.0, 0]
    assert step_token_rewards(step_ends, token_ends, scores, "spread") == pytest.approx(
        [0, 0, -1 / 3, -1 / 3, -1 / 3, 0.5, 0.5, 0.5, 0.5, 0])


def test_a_token_across_a_boundary_belongs_to_the_step_of_its_last_character():
    # steps "ab|cd" (ends 2, 4); tokens "a", "bc", "d": "bc" ends at 3, inside step 2
    assert step_token_rewards([2, 4], [1, 3, 4], [5.0, 7.0], "each") == [5.0, 7.0, 7.0]
    assert step_token_rewards([2, 4], [1, 3, 4], [5.0, 7.0], "last") == [5.0, 0.0, 7.0]


def test_the_sum_of_spread_and_last_is_the_sum_of_the_scores():
    token_ends, step_ends, scores = [3, 6, 9, 12], [6, 12], [0.25, -2.0]
    for placement in ("last", "spread"):
        assert sum(step_token_rewards(step_ends, token_ends, scores, placement)) == pytest.approx(sum(scores))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="placement"):
        step_token_rewards([1], [1], [1.0], "first")
    with pytest.raises(ValueError, match="1 steps but 2 scores"):
        step_token_rewards([1], [1], [1.0, 2.0])
