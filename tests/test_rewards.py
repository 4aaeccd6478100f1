"""Rewards: the built-ins (exact, math), user rewards by import path, and the error messages."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pickle  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from mixrl.errors import ConfigError, DataError  # noqa: E402
from mixrl.rewards import (  # noqa: E402
    REWARDS,
    build_reward,
    completion_text,
    register_reward,
)

FIXTURES = Path(__file__).parent / "fixtures"

GSM8K_GOLD = "She sells 24 * 3 = <<24*3=72>>72 dollars' worth.\n#### 72"


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg, msg
    return msg


def chat(text):
    return [{"role": "assistant", "content": text}]


# ----------------------------------------------------------------------------- registry


def test_builtins_registered_and_named():
    assert {"exact", "math"} <= set(REWARDS)
    for name in ("exact", "math"):
        fn = build_reward(name)
        assert fn.__name__ == name
        assert callable(fn)


def test_builtins_are_picklable_and_named_for_trl():
    from trl.trainer.utils import get_callable_name

    for name in ("exact", "math"):
        fn = pickle.loads(pickle.dumps(build_reward(name, marker="ANSWER:")))
        assert get_callable_name(fn) == name
        assert fn(prompts=["q"], completions=["ANSWER: 7"], answer=["7"]) == [1.0]


def test_register_reward_custom_name(monkeypatch):
    monkeypatch.setattr(REWARDS, "_items", dict(REWARDS._items))  # the registry as it was, after the test

    @register_reward("_test_const")
    def const(*, value: float = 0.5):
        def constant(prompts, completions, **kwargs):
            return [value] * len(completions)

        return constant

    fn = build_reward("_test_const", value=2.0)
    assert fn([None], ["x"]) == [2.0]
    with pytest.raises(ValueError, match=r"^reward '_test_const' is already registered \(.*\.const\), so .*<lambda> cannot take it; choose another name$"):
        register_reward("_test_const")(lambda: None)  # a taken name is refused (the one registry type)
    assert REWARDS["_test_const"] is const


# ----------------------------------------------------------------------------- exact


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        ("Some work.\n#### 72", "72", 1.0),
        ("#### 72  ", " 72 ", 1.0),
        ("reasoning\n#### 72", GSM8K_GOLD, 1.0),  # the gold is a full GSM8K solution
        ("#### 72\nDone.", "72", 1.0),  # text on later lines is not part of the answer
        ("72", "72", 1.0),  # no marker: the whole completion
        ("#### 1 then #### 72", "72", 1.0),  # the last marker counts
        ("#### 73", "72", 0.0),
        ("#### 72.0", "72", 0.0),  # exact, not numeric
        ("The answer is 72", "72", 0.0),
        ("####", "72", 0.0),
        ("", "72", 0.0),
    ],
)
def test_exact(completion, gold, expected):
    fn = build_reward("exact")
    assert fn(prompts=["q"], completions=[completion], answer=[gold]) == [expected]


def test_exact_chat_completions_and_batch():
    fn = build_reward("exact")
    out = fn(
        prompts=[[{"role": "user", "content": "q"}]] * 3,
        completions=[chat("#### 72"), chat("#### 5"), [{"role": "assistant", "content": [{"type": "text", "text": "#### 72"}]}]],
        answer=[GSM8K_GOLD, GSM8K_GOLD, "72"],
        trainer_state=None,
        completion_ids=[[1], [2], [3]],
    )
    assert out == [1.0, 0.0, 1.0]


def test_exact_custom_marker_and_column():
    fn = build_reward("exact", marker="Answer:", answer_column="label")
    assert fn([None, None], ["so\nAnswer: Paris", "Answer: Rome"], label=["Paris", "Paris"]) == [1.0, 0.0]


# ----------------------------------------------------------------------------- math


@pytest.mark.parametrize(
    "completion, gold",
    [
        ("#### 72", "72"),
        ("so the total is\n#### $72.", GSM8K_GOLD),
        ("#### 1,234", "1234"),
        ("#### $1,234.00", "#### 1234"),
        ("#### +5", "5"),
        ("#### 72 apples", "72"),
        ("The answer is \\boxed{72}.", "72"),
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{\\dfrac{3}{4}}", "3/4"),
        ("\\boxed{0.75}", "\\frac{3}{4}"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}"),
        ("\\boxed{-\\frac12}", "-0.5"),
        ("\\boxed{2\\frac{1}{2}}", "5/2"),
        ("\\boxed{10\\text{ cm}}", "10"),
        ("\\boxed{\\text{(B)}}", "B"),
        ("\\boxed{90^\\circ}", "90"),
        ("The answer is $50\\%$.", "50"),  # \\boxed{50\\%} is not parsed by math-verify 0.9 (docs/math_reward_comparison.md)
        ("\\boxed{1{,}000}", "1000"),
        ("$\\boxed{x = 3}$", "$3$"),
        ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)"),
        ("\\boxed{9\\pi}", "We find $\\pi r^2 = \\boxed{9\\pi}$."),  # MATH-style gold solution
        ("\\boxed{\\boxed{7}}", "7"),
        ("I think it is 36, no wait, 42.", "42"),  # last number
        ("about 0.333333", "1/3"),  # float_rounding: 6 decimals
        ("3.50", "3.5"),
        ("72.00", "72"),
        ("\\boxed{{72}}", "72"),
        (chat("\\boxed{72}"), "72"),
    ],
)
def test_math_positive(completion, gold):
    assert build_reward("math")(prompts=["q"], completions=[completion], answer=[gold]) == [1.0]


@pytest.mark.parametrize(
    "completion, gold",
    [
        ("#### 73", "72"),
        ("\\boxed{71.9}", "72"),
        ("1000001", "1000000"),  # integers compare exactly
        ("\\boxed{\\frac{1}{3}}", "0.33"),
        ("\\boxed{9}", "9\\pi"),
        ("no number here", "72"),
        ("", "72"),
        ("\\boxed{", "72"),
        ("\\boxed{\\frac{1}{0}}", "1"),
        ("#### 72", "#### 27"),
        (chat("\\boxed{5}"), "72"),
    ],
)
def test_math_negative(completion, gold):
    assert build_reward("math")(prompts=["q"], completions=[completion], answer=[gold]) == [0.0]


def test_math_extract_latest_wins_and_choice():
    math_fn = build_reward("math")
    assert math_fn([None], ["\\boxed{5}\n#### 7"], answer=["7"]) == [1.0]
    # a markdown heading '#### Step 1' before the boxed answer does not shadow it
    assert math_fn([None], ["#### Step 1\nx\n#### Step 2\nSo \\boxed{5}."], answer=["5"]) == [1.0]
    only_boxed = build_reward("math", extract=["boxed"])
    assert only_boxed([None, None, None], ["#### 7", "it is 7", "\\boxed{7}"], answer=["7", "7", "7"]) == [0.0, 0.0, 1.0]
    no_expr = build_reward("math", extract=["marker", "boxed"])
    assert no_expr([None, None], ["it is 7", "#### 7"], answer=["7", "7"]) == [0.0, 1.0]
    # the boxed answer comes before a plain number written after it
    assert math_fn([None], ["\\boxed{5} and then 6"], answer=["5"]) == [1.0]
    only_expr = build_reward("math", extract=["expr"])
    assert only_expr([None, None], ["so 3 and then 6", "\\boxed{5} and then 6"], answer=["6", "5"]) == [1.0, 0.0]


def test_math_verify_equivalences_the_old_parser_missed():
    """Symbolic equality (math-verify's SymPy comparison), not string matching."""
    fn = build_reward("math")
    cases = [("\\boxed{\\sqrt{18}}", "3\\sqrt{2}"), ("\\boxed{1 + 2x}", "2x + 1"), ("\\boxed{\\{3,2,1\\}}", "\\{1, 2, 3\\}"),
             ("\\boxed{(-\\infty, 2] \\cup [5, +\\infty)}", "(-\\infty, 2] \\cup [5, \\infty)"), ("\\boxed{1.5 \\times 10^{3}}", "1500"),
             ("The final answer is $\\frac{6}{8}$.", "\\frac{3}{4}"), ("#### [1,3)", "[1, 3)")]
    assert fn([None] * len(cases), [c for c, _ in cases], answer=[g for _, g in cases]) == [1.0] * len(cases)
    wrong = [("\\boxed{[1,3]}", "[1, 3)"), ("\\boxed{2\\sqrt{3}}", "3\\sqrt{2}"), ("\\boxed{(2,1)}", "(1, 2)")]
    assert fn([None] * 3, [c for c, _ in wrong], answer=[g for _, g in wrong]) == [0.0] * 3


def test_math_float_rounding_param():
    loose = build_reward("math", float_rounding=2)
    assert loose([None], ["\\boxed{0.33}"], answer=["1/3"]) == [1.0]
    assert build_reward("math")([None], ["\\boxed{0.33}"], answer=["1/3"]) == [0.0]


def test_math_reward_pickles():
    import pickle

    fn = pickle.loads(pickle.dumps(build_reward("math")))
    assert fn([None], ["\\boxed{\\frac12}"], answer=["0.5"]) == [1.0]


@pytest.mark.parametrize("name", ["exact", "math"])
@pytest.mark.parametrize(
    "weird",
    [None, 123, 4.5, [], {}, [None], [{"role": "assistant", "content": None}], [[["deep"]]], object(),
     "\\boxed{" * 50, "\\frac{" * 200 + "1", "9" * 5000, "\x00\udcff", "#### " + "}" * 30],
)
def test_rewards_never_raise_on_weird_output(name, weird):
    out = build_reward(name)(prompts=["q"], completions=[weird], answer=["72"])
    assert out == [0.0]


@pytest.mark.parametrize("name", ["exact", "math"])
def test_missing_gold_gives_none_and_weird_gold_is_safe(name):
    fn = build_reward(name)
    assert fn([None] * 4, ["#### 72"] * 4, answer=[None, "", "  ", 72]) == [None, None, None, 1.0]


def test_missing_answer_column_is_a_data_error():
    with pytest.raises(DataError) as e:
        build_reward("math")(prompts=["q"], completions=["#### 1"], question=["q"], trainer_state=None)
    msg = one_line(e)
    assert "'answer'" in msg and "question" in msg and "data.answer_column" in msg
    assert "trainer_state" not in msg


def test_helpers():
    assert completion_text(chat("hi")) == "hi"
    assert completion_text([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]) == "a"
    assert completion_text(None) == ""


# ----------------------------------------------------------------------------- errors


def test_unknown_reward_name():
    with pytest.raises(ConfigError) as e:
        build_reward("mth")
    msg = one_line(e)
    assert "unknown reward 'mth'" in msg
    assert "did you mean: math" in msg
    assert "built-in rewards: exact, judge, math, math_after_think, math_format, math_think_format, model, process" in msg  # the verifiers and the rewards from models
    assert "my_pkg.rewards:my_reward" in msg  # explains the dotted-path form


def test_unknown_param_did_you_mean():
    with pytest.raises(ConfigError) as e:
        build_reward("math", float_roundin=3)
    msg = one_line(e)
    assert "'float_roundin'" in msg and "did you mean: float_rounding" in msg and "reward.params" in msg


def test_bad_param_values():
    with pytest.raises(ConfigError) as e:
        build_reward("math", extract=["boxd"])
    assert "did you mean: boxed" in one_line(e)
    with pytest.raises(ConfigError):
        build_reward("math", extract=[])
    with pytest.raises(ConfigError):
        build_reward("math", float_rounding=0)
    with pytest.raises(ConfigError):
        build_reward("math", timeout_seconds=-1)
    with pytest.raises(ConfigError):
        build_reward("exact", marker="")
    with pytest.raises(ConfigError):
        build_reward("")


# ----------------------------------------------------------------------------- user rewards


@pytest.fixture
def helpers_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))


@pytest.mark.parametrize("path", ["reward_helpers:length_reward", "reward_helpers.length_reward"])
def test_dotted_path_function(helpers_on_path, path):
    fn = build_reward(path)
    assert fn.__name__ == "length_reward"
    assert fn(prompts=["q", "q"], completions=["short", chat("a much longer completion")]) == [1.0, 0.0]


def test_file_path_function():
    fn = build_reward(f"{FIXTURES / 'reward_helpers.py'}:length_reward")
    assert fn(["q"], ["ok"]) == [1.0]


def test_dotted_path_factory_with_params(helpers_on_path):
    fn = build_reward("reward_helpers:contains_reward", word="cat", score=2.0)
    assert fn(["q", "q"], ["a cat", "a dog"]) == [2.0, 0.0]
    assert fn.__name__ == "contains"


def test_dotted_path_class_factory_gets_a_name(helpers_on_path):
    fn = build_reward("reward_helpers.KeywordReward", keyword="yes")
    assert fn(["q", "q"], ["yes", "no"]) == [1.0, 0.0]
    assert fn.__name__ == "KeywordReward"


def test_plain_function_rejects_params(helpers_on_path):
    with pytest.raises(ConfigError) as e:
        build_reward("reward_helpers:length_reward", max_len=3)
    msg = one_line(e)
    assert "plain reward function" in msg and "max_len" in msg and "reward.params" in msg


def test_factory_param_errors(helpers_on_path):
    with pytest.raises(ConfigError) as e:
        build_reward("reward_helpers:contains_reward")
    assert "needs param(s) word" in one_line(e)
    with pytest.raises(ConfigError) as e:
        build_reward("reward_helpers:contains_reward", wrod="x")
    assert "did you mean: word" in one_line(e)
    with pytest.raises(ConfigError) as e:
        build_reward("reward_helpers:broken_factory", threshold=-1)
    assert "threshold must be >= 0" in one_line(e)


def test_module_not_importable():
    with pytest.raises(ConfigError) as e:
        build_reward("no_such_pkg_xyz.rewards:fn")
    msg = one_line(e)
    assert "no_such_pkg_xyz.rewards" in msg and "could not be imported" in msg
    with pytest.raises(ConfigError) as e:
        build_reward("no_such_pkg_xyz.rewards.fn")
    assert "no_such_pkg_xyz" in one_line(e)
    with pytest.raises(ConfigError) as e:
        build_reward("missing/dir/rewards.py:fn")
    assert "not found" in one_line(e)


def test_attribute_missing(helpers_on_path):
    with pytest.raises(ConfigError) as e:
        build_reward("reward_helpers:length_rewrd")
    msg = one_line(e)
    assert "reward_helpers" in msg and "'length_rewrd'" in msg and "did you mean: length_reward" in msg


def test_not_callable(helpers_on_path):
    with pytest.raises(ConfigError) as e:
        build_reward("reward_helpers:NOT_CALLABLE")
    assert "not a function" in one_line(e)


def test_module_with_broken_import(tmp_path, monkeypatch):
    (tmp_path / "broken_rewards_mod.py").write_text("import not_a_real_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as e:
        build_reward("broken_rewards_mod:fn")
    msg = one_line(e)
    assert "not_a_real_dependency_xyz" in msg and "install" in msg


def test_a_factory_declaring_context_receives_the_runs_context_at_construction(monkeypatch):
    """The rewards' protocol (mixrl.rewards.protocol): a factory's ``context`` parameter is the run's
    RewardContext, never a config param; ``context.timeout_s`` bounds the built reward's calls."""
    from mixrl.rewards.protocol import RewardContext
    from mixrl.rewards.registry import REWARDS, reward_params

    seen = []

    def factory(*, scale: float = 1.0, context=None):
        seen.append(context)
        return lambda prompts, completions, **kw: [scale] * len(completions)

    monkeypatch.setitem(REWARDS._items, "_test_context", factory)  # removed again after the test
    assert reward_params(factory) == {"scale": 1.0}  # not a config param
    ctx = RewardContext(device="cpu", policy_path="/p", tokenizer=None, timeout_s=3.0)
    fn = build_reward("_test_context", context=ctx, scale=2.0)
    assert seen == [ctx] and fn.timeout_s == 3.0 and fn(prompts=["q"], completions=["a"]) == [2.0]
    build_reward("_test_context")
    assert seen[-1] is None  # built outside a run (config validation): nothing known
    with pytest.raises(ConfigError, match="remove reward.params.context"):
        build_reward("_test_context", context={"device": "cpu"})


def test_a_verifier_is_read_through_the_declared_protocol():
    """heldout_reward / training_judge read ``verifier`` (protocol.Verified) through the CheckedReward wrapper."""
    from mixrl.rewards.components import heldout_reward, training_judge

    exact = build_reward("exact")
    judged = build_reward("judge", url="http://127.0.0.1:9", verifier="math")
    silent = build_reward("judge", url="http://127.0.0.1:9", verifier="none")
    assert heldout_reward(exact) is exact and training_judge(exact) is exact  # a rule: itself
    assert heldout_reward(judged) is judged.fn.verifier is training_judge(judged)
    assert heldout_reward(silent) is silent and training_judge(silent) is None  # a model's score is no verdict
