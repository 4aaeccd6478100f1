"""reward=math_after_think: LUFFY / RL-PLUS / ExGRPO's reward (their reward_impl_version=3).

Expected values worked out by hand from the authors' code (ElliottYan/LUFFY at commit
01f4ae066249e6965ce0d5512ccdf99a12895c74): luffy/verl/verl/mix_src/main_mix_ppo.py:90-96 puts
"<think>\\n" before the decoded response; math_verify_reward.py:36-41 keeps
response.split("</think>")[1] (the text between the first </think> and the next) and returns not
correct when "</think>" is missing; :14-18 parses that text with math-verify's default extraction
and the gold answer as "$gold$", verify(gold, answer); :52-57 returns is_correct (1 or 0)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pickle  # noqa: E402

import pytest  # noqa: E402

from mixrl.errors import ConfigError  # noqa: E402
from mixrl.rewards import build_reward  # noqa: E402
from mixrl.rewards.think import answer_after_reasoning  # noqa: E402

CASES = [
    # (completion, gold, authors' value, why)
    ("Let me add. 3 + 4 = 7.\n</think>\nThe answer is $\\boxed{7}$.", "7", 1.0, "closed reasoning, boxed answer after it"),
    ("Let me add. 3 + 4 = 7. The answer is $\\boxed{7}$.", "7", 0.0, "no </think>: 0 whatever the answer"),
    ("3 + 4 = 7 </think> so $\\boxed{8}$", "7", 0.0, "wrong answer after </think>"),
    ("guess $\\boxed{7}$ </think> The answer is $\\boxed{5}$.", "7", 0.0, "only the text after </think> is read"),
    # a second </think> ends the answer: split("</think>")[1] is the text between the two
    ("a </think> $\\boxed{7}$ </think> $\\boxed{5}$", "7", 1.0, "the first answer segment"),
    ("a </think> $\\boxed{7}$ </think> $\\boxed{5}$", "5", 0.0, "the text after a second </think> is not read"),
    ("x</think>The answer is $\\frac{1}{2}$", "\\frac{1}{2}", 1.0, "LaTeX without \\boxed (default extraction)"),
    ("x</think>\n\\boxed{\\frac{2}{4}}", "\\frac12", 1.0, "equivalent fractions (math-verify)"),
    ("x</think>", "7", 0.0, "nothing after </think>"),
]


@pytest.mark.parametrize("completion, gold, expected, why", CASES, ids=[c[3] for c in CASES])
def test_math_think_matches_the_authors_reward(completion, gold, expected, why):
    fn = build_reward("math_after_think")
    assert fn(prompts=["q"], completions=[completion], answer=[gold]) == [expected]
    # chat completions score the same
    assert fn(prompts=["q"], completions=[[{"role": "assistant", "content": completion}]], answer=[gold]) == [expected]


def test_math_think_differs_from_math_where_the_authors_do():
    """reward=math scores the whole completion; math_after_think 0 without </think> and only the answer segment."""
    think, plain = build_reward("math_after_think"), build_reward("math")
    no_close = "The answer is $\\boxed{7}$."
    assert plain(prompts=["q"], completions=[no_close], answer=["7"]) == [1.0]
    assert think(prompts=["q"], completions=[no_close], answer=["7"]) == [0.0]
    two = "r </think> $\\boxed{7}$ </think> $\\boxed{5}$"
    assert plain(prompts=["q"], completions=[two], answer=["5"]) == [1.0]  # the last \boxed
    assert think(prompts=["q"], completions=[two], answer=["5"]) == [0.0]


def test_answer_segment_and_missing_gold():
    assert answer_after_reasoning("a</think>b</think>c") == "b"
    assert answer_after_reasoning("a</think>b") == "b"
    assert answer_after_reasoning("no close") is None
    assert answer_after_reasoning("a<end>b", "<end>") == "b"
    fn = build_reward("math_after_think")
    assert fn(prompts=["q", "q"], completions=["</think> 7", "</think> 7"], answer=[None, " "]) == [None, None]
    assert pickle.loads(pickle.dumps(fn))(prompts=["q"], completions=["</think>$\\boxed{3}$"], answer=["3"]) == [1.0]


def test_custom_delimiter_and_bad_params():
    fn = build_reward("math_after_think", delimiter="<|answer|>")
    assert fn(prompts=["q"], completions=["r <|answer|> $\\boxed{3}$"], answer=["3"]) == [1.0]
    assert fn(prompts=["q"], completions=["r </think> $\\boxed{3}$"], answer=["3"]) == [0.0]
    for bad, match in (({"delimiter": ""}, "delimiter must be a non-empty string"),
                       ({"float_rounding": 0}, "float_rounding must be an integer >= 1"),
                       ({"timeout_seconds": 0}, "timeout_seconds must be an integer >= 1 or null")):
        with pytest.raises(ConfigError, match=match) as e:
            build_reward("math_after_think", **bad)
        assert "\n" not in str(e.value)


def test_the_luffy_fixtures_traces_score_1_and_without_their_close_0():
    """tests/fixtures/luffy_openr1.jsonl (the schema of Elliott/Openr1-Math-46k-8192): every R1 trace
    closes its reasoning and boxes the gold answer, so the authors' reward gives each 1; the same
    trace with "</think>" removed gives 0."""
    import json
    from pathlib import Path

    rows = [json.loads(line) for line in (Path(__file__).parent / "fixtures" / "luffy_openr1.jsonl").read_text().splitlines()]
    traces = [r["target"][0]["content"] for r in rows]
    golds = [r["reward_model"]["ground_truth"] for r in rows]
    fn = build_reward("math_after_think")
    assert fn(prompts=["q"] * len(rows), completions=traces, answer=golds) == [1.0] * len(rows)
    unclosed = [t.replace("</think>", "") for t in traces]
    assert fn(prompts=["q"] * len(rows), completions=unclosed, answer=golds) == [0.0] * len(rows)
