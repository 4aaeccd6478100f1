"""Benchmarks as config (conf/benchmarks/), their fixtures read by the hub loader's code,
extraction and scoring on real-looking outputs, and the metrics with intervals against hand
computations."""

from __future__ import annotations

import json
from math import comb
from pathlib import Path

import numpy as np
import pytest

from mixrl.benchmarks import data, spec
from mixrl.benchmarks.metrics import benchmark_metrics, interval, per_problem, stratified_interval
from mixrl.benchmarks.scoring import (
    boxed_all, choice_letter, extract, final_answer, last_boxed, math_verify_scorer, strip_units, vote_key,
)
from mixrl.errors import ConfigError, DataError

FIXTURES = Path(__file__).parent / "fixtures" / "benchmarks"


# --------------------------------------------------------------------------- config
def test_every_shipped_file_validates_and_cites_its_source():
    names = spec.check_all()
    assert {"aime24", "aime25", "amc", "math500", "minerva", "olympiadbench", "arc_c", "gpqa_diamond", "mmlu_pro",
            "arith", "math6", "ood3"} <= set(names)
    for name in names:
        text = (spec.benchmarks_dir() / f"{name}.yaml").read_text()
        assert "cite:" in text, name
    math6 = spec.select(["benchmarks=math6"]).benchmarks
    assert [b.name for b in math6] == ["aime24", "aime25", "amc", "math500", "minerva", "olympiadbench"]
    aime = math6[0]
    assert (aime.protocol.samples, aime.protocol.temperature, aime.protocol.max_new_tokens) == (32, 0.6, 8192)
    assert aime.protocol.metrics == ["avg@32", "pass@32", "maj@32"]
    assert [b.name for b in spec.select(["benchmarks=ood3"]).benchmarks] == ["arc_c", "gpqa_diamond", "mmlu_pro"]


def test_overrides_reach_one_benchmark_or_all():
    s = spec.select(["benchmarks=[aime24,math500]", "benchmarks.all.protocol.samples=4", "benchmarks.math500.protocol.temperature=0.8",
                     "benchmarks.limit=2", "benchmarks.backend=hf"])
    aime, math = s.benchmarks
    assert aime.protocol.samples == 4 and aime.protocol.metrics == ["avg@4", "pass@4", "maj@4"]  # k capped at the samples
    assert math.protocol.temperature == 0.8 and aime.protocol.temperature == 0.6
    assert (s.limit, s.backend) == (2, "hf")


@pytest.mark.parametrize("overrides, words", [
    (["benchmarks=aime2024"], "unknown benchmark or suite 'aime2024' (did you mean: aime24"),
    (["benchmarks=aime24", "benchmarks.aime24.protocol.samples=0"], "protocol.samples=0 is out of range"),
    (["benchmarks=aime24", "benchmarks.aime24.protocol.top_p=1.5"], "top_p=1.5 is out of range"),
    (["benchmarks=aime24", "benchmarks.aime24.protocol.temperature=0"], "temperature 0 is greedy"),
    (["benchmarks=aime24", "benchmarks.aime24.protocol.metrics=[pass@64]"], "metric pass@64 needs k <= samples (32)"),
    (["benchmarks=aime24", "benchmarks.aime24.protocol.metrics=[best@2]"], "is not avg@k, pass@k or maj@k"),
    (["benchmarks=aime24", "benchmarks.aime24.extract=boxxed"], "extract='boxxed' is unknown (did you mean: boxed"),
    (["benchmarks=aime24", "benchmarks.math500.source=x.jsonl"], "names a benchmark that is not selected"),
    (["benchmarks=aime24", "benchmarks.aime24.sorce=x"], "unknown key 'benchmarks.aime24.sorce' (did you mean: source"),
    (["benchmarks=aime24", "benchmarks.limit=0"], "benchmarks.limit=0 is out of range"),
    (["benchmarks=aime24", "benchmarks.backend=tgi"], "benchmarks.backend='tgi' is unknown"),
    (["benchmarks.limit=3"], "without benchmarks=SUITE"),
    (["benchmarks=aime24", "benchmarks.source_dir=/nonexistent"], "no aime24.jsonl there"),
])
def test_bad_overrides_are_one_line(overrides, words):
    with pytest.raises(ConfigError) as e:
        spec.select(overrides)
    assert words in str(e.value) and "\n" not in str(e.value)


# --------------------------------------------------------------------------- fixtures through the hub loader's code
def test_fixtures_mirror_the_hub_schemas():
    """The fixture rows carry the dataset cards' column names, types and nesting."""
    def first(name):
        return json.loads((FIXTURES / f"{name}.jsonl").read_text().splitlines()[0])
    assert set(first("aime24")) == {"id", "problem", "solution", "answer", "url", "year"}
    assert isinstance(first("aime24")["answer"], str) and isinstance(first("aime24")["id"], int)
    assert isinstance(first("amc")["answer"], float)  # AI-MO/aimo-validation-amc stores answers as floats
    assert set(first("math500")) == {"problem", "solution", "answer", "subject", "level", "unique_id"}
    assert isinstance(first("olympiadbench")["final_answer"], list)
    assert set(first("arc_c")["choices"]) == {"text", "label"}
    assert {"Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3", "Record ID"} <= set(first("gpqa_diamond"))
    assert isinstance(first("mmlu_pro")["options"], list) and first("mmlu_pro")["answer"] in "ABCDEFGHIJ"


def test_source_dir_reads_every_fixture_through_the_hub_loader(monkeypatch):
    """benchmarks.source_dir swaps only the source string: the rows go through the same
    mixrl.data.reading._load_raw (datasets.load_dataset) and column mapping as a hub id."""
    import mixrl.data.reading as reading

    seen = []
    real = reading._load_raw
    monkeypatch.setattr(reading, "_load_raw", lambda src, **kw: seen.append((src, kw)) or real(src, **kw))
    sel = spec.select(["benchmarks=[math6,ood3,amc23]", f"benchmarks.source_dir={FIXTURES}"])
    got = {b.name: data.load_problems(b) for b in sel.benchmarks}
    assert [Path(s).name for s, _ in seen] == [f"{b.name}.jsonl" for b in sel.benchmarks]
    assert seen[-1][1] == {"split": "test", "subset": None, "config_prefix": "benchmarks.amc23"}
    assert got["olympiadbench"][0].answer == "$25$"  # final_answer.0
    assert got["amc"][0].answer == "43.0"
    assert got["math500"][0].id == "test/precalculus/fixture-1.json"
    arc = got["arc_c"][1]  # numeric labels kept
    assert arc.labels == ["1", "2", "3"] and arc.answer == "2" and "2) copper" in arc.problem
    gpqa = got["gpqa_diamond"][0]
    assert gpqa.labels == ["A", "B", "C", "D"] and f"{gpqa.answer}) 10^-4 eV" in gpqa.problem  # shuffled, gold follows
    assert "ANSWER: $LETTER" in gpqa.problem
    assert got["mmlu_pro"][1].problem.endswith("A) lung\nB) liver\nC) heart\nD) kidney") and got["mmlu_pro"][1].answer == "C"


def test_a_suite_sets_its_papers_protocol_and_reads_the_fixtures_through_the_hub_loader(monkeypatch):
    """chord4 (CHORD's four columns) sets the protocol of the authors' Trinity-RFT example on the
    benchmarks it selects; their files keep theirs; the command line still wins; the fixtures go
    through the same loader as the hub ids."""
    import mixrl.data.reading as reading

    seen = []
    real = reading._load_raw
    monkeypatch.setattr(reading, "_load_raw", lambda src, **kw: seen.append(Path(src).name) or real(src, **kw))
    sel = spec.select(["benchmarks=chord4", f"benchmarks.source_dir={FIXTURES}"])
    assert [b.name for b in sel.benchmarks] == ["aime24", "aime25", "amc", "mmlu_pro"]
    aime, mmlu = sel.benchmarks[0], sel.benchmarks[3]
    assert (aime.protocol.samples, aime.protocol.temperature, aime.protocol.top_p, aime.protocol.max_new_tokens) == (16, 1.0, 1.0, 10240)
    assert aime.protocol.metrics == ["avg@16", "pass@16", "maj@16"] and aime.template == "{problem}"
    assert aime.system_prompt == "Please reason step by step, and put your final answer within \\boxed{}."
    assert (mmlu.protocol.samples, mmlu.protocol.metrics, mmlu.protocol.temperature) == (1, ["avg@1"], 1.0)
    assert mmlu.template == "{problem}\n\n{choices}" and mmlu.scorer == "choice"  # the file's, merged under the suite's
    got = [data.load_problems(b) for b in sel.benchmarks]
    assert seen == ["aime24.jsonl", "aime25.jsonl", "amc.jsonl", "mmlu_pro.jsonl"] and all(got)
    assert spec.select(["benchmarks=aime24"]).benchmarks[0].protocol.temperature == 0.6  # alone: its own file
    cli = spec.select(["benchmarks=chord4", "benchmarks.all.protocol.samples=2", "benchmarks.amc.protocol.temperature=0.6"])
    assert [b.protocol.metrics for b in cli.benchmarks][2:] == [["avg@2", "pass@2", "maj@2"], ["avg@2"]]
    assert cli.benchmarks[2].protocol.temperature == 0.6 and cli.benchmarks[0].protocol.temperature == 1.0
    assert aime.key_payload() != spec.select(["benchmarks=aime24"]).benchmarks[0].key_payload()
    with pytest.raises(ConfigError, match="aime24 is in chord4 and math6 under different protocols; select one of them"):
        spec.select(["benchmarks=[chord4,math6]"])


def test_a_suites_bad_settings_are_one_line(monkeypatch, tmp_path):
    for name in ("aime24", "amc"):
        (tmp_path / f"{name}.yaml").write_text((spec.benchmarks_dir() / f"{name}.yaml").read_text())
    monkeypatch.setattr(spec, "benchmarks_dir", lambda: tmp_path)
    for body, words in [("set: {aime25: {protocol: {samples: 2}}}", "set.aime25 is not a benchmark of the suite"),
                        ("set: {all: {sorce: x}}", "set.all must be a mapping with keys from"),
                        ("set: {all: {protocol: {samples: 2}}}", "metric avg@32 needs k <= samples (2)")]:
        (tmp_path / "s.yaml").write_text(f"name: s\ntitle: s\nsuite: [aime24, amc]\n{body}\ncite: x\n")
        with pytest.raises(ConfigError) as e:
            spec.select(["benchmarks=s"])
        assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_hub_id_offline_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    bench = spec.select(["benchmarks=aime24"]).benchmarks[0]
    with pytest.raises(DataError) as e:
        data.load_problems(bench)
    assert "HuggingFaceH4/aime_2024" in str(e.value) and "benchmarks.aime24.source" in str(e.value)


def test_a_missing_column_names_the_columns():
    bench = spec.select(["benchmarks=math500", "benchmarks.math500.columns.problem=question"]).benchmarks[0]
    with pytest.raises(DataError, match=r"column 'question' not found .*columns: answer, level, problem"):
        data.problems(bench, [{"problem": "p", "answer": "1", "level": 1}])


# --------------------------------------------------------------------------- extraction and scoring
def test_boxed_with_nested_braces_and_several_boxes():
    out = r"First try \boxed{\frac{1}{2}}... no wait. So $x = \boxed{\left( 3, \frac{\pi}{2} \right)}$."
    assert boxed_all(out) == [r"\frac{1}{2}", r"\left( 3, \frac{\pi}{2} \right)"]
    assert last_boxed(out) == r"\left( 3, \frac{\pi}{2} \right)"
    assert last_boxed(r"\boxed{\sqrt{\frac{a}{b}} + {c}}") == r"\sqrt{\frac{a}{b}} + {c}"
    assert last_boxed(r"unclosed \boxed{\frac{1}{2}") is None
    assert last_boxed("no box at all") is None
    assert extract("boxed", "So the final answer is $42$.") == "42"  # no box: the answer marker
    assert extract("boxed", "I give up.") is None


def test_final_answer_and_choice_letters():
    assert final_answer("...\nThe answer is: 7 apples.\nDone") == "7 apples"
    assert choice_letter("Let me think. The answer is (C).", "ABCD") == "C"
    assert choice_letter("blah\nANSWER: B", "ABCD") == "B"
    assert choice_letter(r"so \boxed{\text{D}}", "ABCD") == "D"
    assert choice_letter("Options (A) and (B) are wrong, so (D) is right", "ABCD") == "D"
    assert choice_letter("The answer is (E).", "ABCD") is None  # not an option
    assert choice_letter("I am not sure.", "ABCD") is None
    assert choice_letter("The answer is 2) copper", ["1", "2", "3"]) == "2"


def test_math_verify_scores_equivalent_forms():
    score = math_verify_scorer()
    assert score(r"\frac{1}{2}", "0.5") and score("0.5", r"\frac12")
    assert score(r"\left( 3, \frac{\pi}{2} \right)", r"\left( 3, \frac{\pi}{2} \right)")
    assert score("142", "142.0")  # AMC's float answers
    assert score(r"1.6 \text{ cm}", "1.6") and score(r"12^\circ", "12")  # units dropped
    assert strip_units(r"4.5 \mathrm{~m}") == "4.5"
    assert score("$25$", "$25$") and score("25", "$25$")  # OlympiadBench golds carry $
    assert not score("3", "4") and not score(None, "4") and not score("", "4")
    assert vote_key(r"\left( 3, \pi \right)") == vote_key("(3,\\pi)")


# --------------------------------------------------------------------------- metrics
def test_per_problem_metrics_by_hand():
    c = [True, False, False, True, False]  # n=5, c=2
    assert per_problem("avg@5", c) == pytest.approx(2 / 5)
    assert per_problem("pass@2", c) == pytest.approx(1 - comb(3, 2) / comb(5, 2))  # 0.7
    assert per_problem("pass@1", c) == pytest.approx(0.4)
    votes = ["7", "8", "8", "7", None]
    assert per_problem("maj@3", c, votes) == 0.0  # "8" twice in the first 3, wrong
    assert per_problem("maj@4", c, votes) == 1.0  # 7 and 8 tie at 2: the first seen ("7") wins, right
    assert per_problem("maj@1", [False], [None]) == 0.0  # no answer: no vote


def test_benchmark_metrics_values_and_intervals():
    correct = [[True, True], [True, False], [False, False], [False, False]]
    votes = [["1", "1"], ["2", "3"], ["4", "4"], [None, None]]
    m = benchmark_metrics(["avg@2", "pass@2", "maj@2"], correct, votes)
    assert m["avg@2"]["value"] == pytest.approx((1 + 0.5 + 0 + 0) / 4)
    assert m["pass@2"]["value"] == pytest.approx(2 / 4)
    assert m["maj@2"]["value"] == pytest.approx(2 / 4)  # problem 2: "2" and "3" tie, "2" (right) first
    for v in m.values():
        assert 0 <= v["low"] <= v["value"] <= v["high"] <= 1


def test_interval_matches_the_normal_approximation_on_many_problems():
    x = [1.0] * 100 + [0.0] * 100  # mean 0.5, standard error sqrt(0.25/200) = 0.0354
    low, high = interval(x)
    assert low == pytest.approx(0.5 - 1.96 * 0.0354, abs=0.01) and high == pytest.approx(0.5 + 1.96 * 0.0354, abs=0.01)
    assert interval([0.3]) == (0.3, 0.3) and interval([1.0, 1.0]) == (1.0, 1.0)


def test_stratified_interval_resamples_within_benchmarks():
    # benchmark a: 30 problems at 0/1 (mean 0.5), b: 200 at 0.25 (no spread): only a's spread counts,
    # and the mean of means weighs each benchmark once: (0.5 + 0.25) / 2, half-width 1.96 * sqrt(0.25/30) / 2
    a, b = [1.0, 0.0] * 15, [0.25] * 200
    low, high = stratified_interval([a, b])
    half = 1.96 * np.sqrt(0.25 / 30) / 2
    assert (low + high) / 2 == pytest.approx(0.375, abs=0.02)
    assert high - low == pytest.approx(2 * half, rel=0.2)
