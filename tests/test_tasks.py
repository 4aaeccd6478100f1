"""The built-in ``arith`` task: determinism, splits, verifier, level mix."""

from __future__ import annotations

from collections import Counter

import pytest

from mixrl.errors import ConfigError
from mixrl.tasks import arith, get_task


def test_registry():
    assert get_task("arith") is arith
    with pytest.raises(ConfigError, match="did you mean: arith"):
        get_task("arth")


def test_generate_is_deterministic():
    a = arith.generate(200, seed=3, levels=[1, 2, 3, 4, 5, 6])
    b = arith.generate(200, seed=3, levels=[1, 2, 3, 4, 5, 6])
    c = arith.generate(200, seed=4, levels=[1, 2, 3, 4, 5, 6])
    assert a == b
    assert a != c
    assert arith.heldout_split(50) == arith.heldout_split(50)


def test_problem_fields():
    for p in arith.generate(300, seed=0, levels=arith.LEVELS, split="all"):
        assert set(p) == {"prompt", "answer", "solution", "level"}
        assert isinstance(p["level"], int) and p["level"] in arith.LEVELS
        assert p["prompt"].endswith("=")
        assert p["prompt"].count("+") == arith.num_terms(p["level"]) - 1
        terms = [int(t) for t in p["prompt"][:-1].split("+")]
        assert p["answer"] == str(sum(terms))
        assert p["solution"].endswith(f"#### {p['answer']}")
        assert set(p["prompt"] + p["solution"]) <= set(arith.ALPHABET)
        assert len(p["prompt"]) <= arith.MAX_PROMPT_CHARS
        assert len(p["solution"]) <= arith.MAX_SOLUTION_CHARS
        assert len(p["prompt"] + p["solution"]) <= 40


def test_worked_solution_example():
    p = arith.make_problem([3, 5, 2, 9])
    assert p == {"prompt": "3+5+2+9=", "answer": "19", "solution": "8 10 19 #### 19", "level": 3}


def test_train_and_heldout_never_overlap():
    levels = [1, 2, 3, 4, 5]
    train = arith.train_split(3000, seed=0, levels=levels)
    held = arith.heldout_split(1000, seed=0, levels=levels)
    train_prompts = {p["prompt"] for p in train}
    held_prompts = {p["prompt"] for p in held}
    assert not train_prompts & held_prompts
    assert all(arith.is_heldout(p) for p in held_prompts)
    assert not any(arith.is_heldout(p) for p in train_prompts)
    # the split is a property of the problem, not of the seed
    other = {p["prompt"] for p in arith.train_split(3000, seed=99, levels=levels)}
    assert not other & held_prompts


def test_heldout_fraction_is_roughly_right():
    everything = arith.generate(4000, seed=1, levels=[3], split="all")
    frac = sum(arith.is_heldout(p["prompt"]) for p in everything) / len(everything)
    assert abs(frac - arith.HELDOUT_FRACTION) < 0.03


def test_problems_are_distinct_while_possible():
    held = arith.heldout_split(200, seed=0, levels=[3])
    assert len({p["prompt"] for p in held}) == 200
    # level 1 has only ~20 held-out problems: asking for more repeats them instead of hanging
    small = arith.heldout_split(100, seed=0, levels=[1])
    assert len(small) == 100 and len({p["prompt"] for p in small}) < 30


def test_level_distribution():
    ps = arith.generate(1001, seed=0, levels=[1, 2, 4])
    counts = Counter(p["level"] for p in ps)
    assert set(counts) == {1, 2, 4}
    assert max(counts.values()) - min(counts.values()) <= 1
    # order is shuffled, not blocked by level
    assert [p["level"] for p in ps[:6]] != sorted(p["level"] for p in ps[:6]) or len(set(counts)) == 1
    # repeating a level weights it
    weighted = Counter(p["level"] for p in arith.generate(300, seed=0, levels=[1, 1, 2]))
    assert weighted[1] == 200 and weighted[2] == 100


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown arith level"):
        arith.generate(5, seed=0, levels=[0])
    with pytest.raises(ValueError, match="levels must not be empty"):
        arith.generate(5, seed=0, levels=[])
    with pytest.raises(ValueError, match="split"):
        arith.generate(5, seed=0, split="test")


def test_verifier_accepts_every_expert_solution():
    for p in arith.generate(2000, seed=5, levels=arith.LEVELS, split="all"):
        assert arith.verify(p["solution"], p["answer"]), p
        assert arith.extract_answer(p["solution"]) == p["answer"]


def test_verifier_rejects_wrong_and_malformed():
    for p in arith.generate(500, seed=6, levels=arith.LEVELS, split="all"):
        wrong = str(int(p["answer"]) + 1)
        assert not arith.verify(p["solution"].rsplit("####", 1)[0] + f"#### {wrong}", p["answer"])
    ok = "8 10 #### 10"
    assert arith.verify(ok, "10")
    assert arith.verify("8 10 ####10 \n", "10")  # spacing and trailing whitespace are fine
    assert arith.verify("#### 010", "10")  # numbers are compared as integers
    assert arith.verify("8 #### 9 #### 10", "10")  # the last answer counts
    for bad in ["8 10", "8 10 ####", "8 10 #### 10 3+4=", "8 10 #### 1 0", "#### ten", "", "10"]:
        assert not arith.verify(bad, "10"), bad
    assert arith.extract_answer(None) is None  # type: ignore[arg-type]
    assert not arith.verify(ok, "not a number")


def test_careless_solution_is_wrong_unless_last_term_is_zero():
    for p in arith.generate(500, seed=7, levels=arith.LEVELS, split="all"):
        careless = arith.careless_solution(p)
        assert set(careless) <= set(arith.ALPHABET)
        last_term = int(p["prompt"][:-1].split("+")[-1])
        assert arith.verify(careless, p["answer"]) == (last_term == 0)
    assert arith.careless_solution(arith.make_problem([3, 5, 2])) == "8 #### 8"
    assert arith.careless_solution(arith.make_problem([3, 5])) == "3 #### 3"


def test_reward_function_matches_trl_signature():
    completions = ["8 10 #### 10", "8 10 #### 11", [{"role": "assistant", "content": "#### 10"}]]
    rewards = arith.reward(
        prompts=["3+5+2="] * 3, completions=completions, answer=["10"] * 3, completion_ids=[[1]] * 3, level=[2] * 3
    )
    assert rewards == [1.0, 0.0, 1.0]
    assert arith.reward.__name__ == "arith_correct"


def test_dataset():
    ds = arith.dataset(12, seed=0, levels=[1, 2], split="heldout")
    assert len(ds) == 12
    assert set(ds.column_names) == {"prompt", "answer", "solution", "level"}
