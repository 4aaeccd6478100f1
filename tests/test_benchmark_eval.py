"""``mixrl eval MODEL benchmarks=SUITE``: the built-in benchmark equals the held-out accuracy
training reported, pass@k comes from the streamed samples, an interrupted evaluation resumes
without regenerating, a finished one loads no model, the paper's rows show, and every mistake
is one line (exit 2) before any model loads."""

from __future__ import annotations

import json
from math import comb
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mixrl.benchmarks import runner as bench_runner
from mixrl.cli import benchmarks as command
from mixrl.benchmarks.paper import check, paper_table
from mixrl.cli.main import app
from mixrl.errors import ConfigError

from conftest import fail_model_loading

runner = CliRunner()
FIXTURES = Path(__file__).parent / "fixtures" / "benchmarks"


def _samples(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_arith_equals_the_trained_runs_heldout_accuracy_and_pass_at_k_reads_the_same_samples(fast_overrides, tmp_path):
    res = runner.invoke(app, ["train", *fast_overrides, "trainer.eval_size=24"])
    assert res.exit_code == 0, res.output[-2000:]
    run_dir = tmp_path / "run"
    summary = json.loads((run_dir / "summary.json").read_text())
    out = tmp_path / "bench.json"
    res = runner.invoke(app, ["eval", str(run_dir), "benchmarks=arith", f"benchmarks.cache_dir={tmp_path / 'cache'}",
                              "hardware.torch_threads=1", "--out", str(out)])
    assert res.exit_code == 0, res.output[-2000:]
    assert "built-in arithmetic" in res.stdout and "avg@k [95% CI]" in res.stdout
    (arith,) = json.loads(out.read_text())["benchmarks"]
    assert arith["problems"] == summary["eval_after"]["n"] == 24
    assert arith["metrics"]["avg@1"]["value"] == pytest.approx(summary["eval_after"]["accuracy"])

    # sampled: pass@k of the table is the unbiased estimator over the JSONL's own correct flags
    res = runner.invoke(app, ["eval", str(run_dir), "benchmarks=arith", f"benchmarks.cache_dir={tmp_path / 'cache'}",
                              "benchmarks.arith.protocol.samples=4", "benchmarks.arith.protocol.temperature=1.0",
                              "benchmarks.arith.protocol.metrics=[avg@4,pass@2,pass@4]", "hardware.torch_threads=1",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output[-2000:]
    (arith,) = json.loads(out.read_text())["benchmarks"]
    recs = _samples(arith["samples_file"])
    assert len(recs) == 24 * 4
    hits = [sum(r["correct"] for r in recs if r["problem"] == i) for i in range(24)]
    for k in (2, 4):
        want = sum(1 - comb(4 - c, k) / comb(4, k) for c in hits) / 24
        assert arith["metrics"][f"pass@{k}"]["value"] == pytest.approx(want)
    assert arith["metrics"]["avg@4"]["value"] == pytest.approx(sum(hits) / 96)


def _evaluate(model, cache, *extra):
    return command.evaluate(model, ["benchmarks=[aime24,math500,arc_c]", f"benchmarks.source_dir={FIXTURES}",
                                    f"benchmarks.cache_dir={cache}", "benchmarks.all.protocol.samples=2",
                                    "benchmarks.all.protocol.max_new_tokens=6", "benchmarks.backend=hf",
                                    "hardware.torch_threads=1", "trainer.eval_batch_size=2", *extra], quiet=True)


def test_an_interrupted_evaluation_resumes_and_a_finished_one_loads_no_model(tiny_model_path, tmp_path, monkeypatch):
    calls = []
    real = bench_runner.HFGenerator.generate

    def dies_on_third(self, prompts, **kw):
        calls.append(len(prompts))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, prompts, **kw)

    monkeypatch.setattr(bench_runner.HFGenerator, "generate", dies_on_third)
    with pytest.raises(KeyboardInterrupt):
        _evaluate(tiny_model_path, tmp_path)
    (aime_file,) = tmp_path.glob("aime24-*.jsonl")
    assert len(_samples(aime_file)) == 4  # 2 batches of 1 problem x 2 samples were streamed before the interruption
    assert not list(tmp_path.glob("math500-*.jsonl"))

    calls.clear()
    monkeypatch.setattr(bench_runner.HFGenerator, "generate", lambda self, prompts, **kw: calls.append(len(prompts)) or real(self, prompts, **kw))
    result = _evaluate(tiny_model_path, tmp_path)
    aime, math, arc = result["benchmarks"]
    assert (aime["reused"], aime["generated"]) == (4, 2)  # only the third problem was generated
    assert (math["generated"], arc["generated"]) == (6, 4)
    assert calls == [2, 2, 2, 2, 2, 2]  # batches of trainer.eval_batch_size=2 (problem, sample) pairs
    assert sorted((r["problem"], r["sample"]) for r in _samples(aime["samples_file"])) == [(i, j) for i in range(3) for j in range(2)]

    monkeypatch.setattr("mixrl.evaluation.saved.load_saved_model", fail_model_loading)
    again = _evaluate(tiny_model_path, tmp_path)
    assert [b["generated"] for b in again["benchmarks"]] == [0, 0, 0]
    assert again["benchmarks"][0]["metrics"] == aime["metrics"]
    # another protocol is another key: it generates (and here, loads the model)
    with pytest.raises(Exception, match="a model was loaded"):
        _evaluate(tiny_model_path, tmp_path, "benchmarks.aime24.protocol.temperature=0.9")


def test_the_papers_rows_show_beside_ours(tiny_model_path, tmp_path):
    result = command.evaluate(tiny_model_path, [
        "benchmarks=[aime24,amc]", f"benchmarks.source_dir={FIXTURES}", f"benchmarks.cache_dir={tmp_path}",
        "benchmarks.limit=1", "benchmarks.all.protocol.samples=1", "benchmarks.all.protocol.max_new_tokens=4",
        "benchmarks.backend=hf", "recipe=luffy/qwen2.5-math-7b-openr1", "model=tiny", "hardware=cpu",
        "hardware.torch_threads=1", "data.system_prompt=null"], quiet=True)
    assert result["paper_table"]["base"]["scores"]["aime24"] == 11.5
    from rich.console import Console

    con = Console(width=250, record=True)
    con.print(command.render_table(result))
    text = con.export_text()
    assert "paper: Qwen2.5-Math-7B" in text and "paper: LUFFY-Qwen-Math-7B-Zero" in text
    row = next(line for line in text.splitlines() if line.startswith("│ AIME 2024"))
    assert "11.5" in row and "29.4" in row
    avg = next(line for line in text.splitlines() if "average" in line)
    assert f"{(11.5 + 31.3) / 2:.1f}" in avg and f"{(29.4 + 65.6) / 2:.1f}" in avg
    assert "arXiv:2504.14945" in text


def test_shipped_paper_tables_validate():
    from mixrl.config.compose import compose_config

    luffy = compose_config(["recipe=luffy/qwen2.5-math-7b-openr1"])
    assert luffy.recipe_info.benchmarks == "math6"
    t = paper_table(luffy)
    assert set(t["base"]["scores"]) == {"aime24", "aime25", "amc", "math500", "minerva", "olympiadbench", "arc_c", "gpqa_diamond", "mmlu_pro"}
    # the README's averages are the means of its rows (to the printed precision)
    math6 = ["aime24", "aime25", "amc", "math500", "minerva", "olympiadbench"]
    assert sum(t["base"]["scores"][b] for b in math6) / 6 == pytest.approx(19.0, abs=0.06)
    assert sum(t["method"]["scores"][b] for b in math6) / 6 == pytest.approx(50.1, abs=0.06)
    chord = paper_table(compose_config(["recipe=chord/qwen2.5-7b-openr1"]))
    assert "arXiv:2508.11408" in chord["source"]
    assert paper_table(compose_config([])) is None
    with pytest.raises(ConfigError, match="percentage"):
        check({"source": "x", "base": {"name": "b", "scores": {"aime24": 150}}}, "t")


def test_filled_paper_rows_average_to_the_averages_their_sources_print():
    """Each row copied from a source that prints its average (AMPO's README, the RL-PLUS and
    Prefix-RFT paper notes cited in the recipes) means to that average, so a mistyped cell shows."""
    from mixrl.config.compose import compose_config

    math6 = ["aime24", "aime25", "amc", "math500", "minerva", "olympiadbench"]
    printed = {  # recipe: (base average, method average) as printed, over math6
        "ampo/qwen2.5-7b-instruct-openr1": (35.6, 41.6),
        "rl_plus/qwen2.5-math-7b-openr1": (19.0, 53.4),
        "prefix_rft/qwen2.5-math-7b-openr1": (19.0, 51.8),
    }
    for recipe, (base_avg, method_avg) in printed.items():
        t = paper_table(compose_config([f"recipe={recipe}"]))
        assert sum(t["base"]["scores"][b] for b in math6) / 6 == pytest.approx(base_avg, abs=0.06), recipe
        assert sum(t["method"]["scores"][b] for b in math6) / 6 == pytest.approx(method_avg, abs=0.06), recipe
    chord = paper_table(compose_config(["recipe=chord/phi-qwen2.5-7b-openr1"]))
    assert chord["method"]["scores"] == {"aime24": 18.2, "aime25": 17.2, "amc": 62.5, "mmlu_pro": 56.2}
    assert "Paper-Notes-en" in chord["source"] and "secondary" in chord["source"]


@pytest.mark.parametrize("args, words", [
    (["benchmarks=aime2024"], "unknown benchmark or suite 'aime2024'"),
    (["benchmarks=aime24", "benchmarks.aime24.protocol.samples=0"], "protocol.samples=0 is out of range"),
    (["benchmarks=aime24", "trainer.eval_batch_size=oops"], "eval_batch_size"),
    (["benchmarks=recipe"], "names no evaluation suite"),
    (["benchmarks=aime24", "benchmarks.backend=vllm"], None),  # vllm missing here: one line; installed: not an error
])
def test_mistakes_are_one_line_before_any_model_loads(tiny_model_path, tmp_path, monkeypatch, args, words):
    import importlib.util

    if words is None:
        if importlib.util.find_spec("vllm") is not None:
            pytest.skip("vllm is installed here")
        words = "vllm is not installed"
    monkeypatch.setattr("mixrl.evaluation.saved.load_saved_model", fail_model_loading)
    res = runner.invoke(app, ["eval", tiny_model_path, *args, f"benchmarks.cache_dir={tmp_path}"])
    assert res.exit_code == 2, res.output[-2000:]
    assert words in res.stderr and res.stderr.count("\n") <= 2 and "Traceback" not in res.output
    assert not list(tmp_path.iterdir())


def test_out_pointing_at_a_folder_is_refused_first(tiny_model_path, tmp_path, monkeypatch):
    monkeypatch.setattr("mixrl.evaluation.saved.load_saved_model", fail_model_loading)
    res = runner.invoke(app, ["eval", tiny_model_path, "benchmarks=arith", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "is a directory" in res.stderr


def test_plain_eval_without_benchmarks_is_unchanged():
    assert not command.split_overrides(["trainer.eval_size=8", "data=gsm8k"])[0]
    assert command.split_overrides(["benchmarks=math6", "benchmarks.limit=2", "seed=1"]) == (
        ["benchmarks=math6", "benchmarks.limit=2"], ["seed=1"])


def test_a_changed_problem_is_never_served_an_old_sample(tiny_model_path, tmp_path):
    """Same key (same benchmark file and protocol), but the rows changed: the samples are drawn again."""
    src = tmp_path / "aime.jsonl"
    row = {"id": 1, "problem": "What is 2+2?", "solution": "", "answer": "4", "url": "", "year": "2024"}
    src.write_text(json.dumps(row) + "\n")
    args = ["benchmarks=aime24", f"benchmarks.aime24.source={src}", f"benchmarks.cache_dir={tmp_path / 'c'}",
            "benchmarks.aime24.protocol.samples=1", "benchmarks.aime24.protocol.max_new_tokens=4", "benchmarks.backend=hf",
            "hardware.torch_threads=1"]
    assert command.evaluate(tiny_model_path, args, quiet=True)["benchmarks"][0]["generated"] == 1
    assert command.evaluate(tiny_model_path, args, quiet=True)["benchmarks"][0]["generated"] == 0
    src.write_text(json.dumps({**row, "answer": "5"}) + "\n")
    again = command.evaluate(tiny_model_path, args, quiet=True)["benchmarks"][0]
    assert (again["generated"], again["reused"]) == (1, 0)


def test_benchmarks_recipe_evaluates_the_suite_the_recipe_names(tiny_model_path, tmp_path):
    """CHORD's recipe names chord4: ``mixrl eval`` prints its four benchmarks with the paper's rows
    beside them, under the suite's protocol (the workflow's system prompt, temperature 1.0)."""
    out = tmp_path / "t.json"
    res = runner.invoke(app, [
        "eval", tiny_model_path, "benchmarks=recipe", f"benchmarks.source_dir={FIXTURES}", f"benchmarks.cache_dir={tmp_path}",
        "benchmarks.limit=1", "benchmarks.all.protocol.samples=1", "benchmarks.all.protocol.max_new_tokens=2",
        "benchmarks.backend=hf", "recipe=chord/qwen2.5-7b-openr1", "model=tiny", "hardware=cpu", "hardware.torch_threads=1",
        "--out", str(out)])
    assert res.exit_code == 0, res.output[-2000:]
    result = json.loads(out.read_text())
    assert result["suite"] == "chord4"
    assert [b["name"] for b in result["benchmarks"]] == ["aime24", "aime25", "amc", "mmlu_pro"]
    assert {b["system_prompt"] for b in result["benchmarks"]} == {
        "Please reason step by step, and put your final answer within \\boxed{}."}
    assert set(result["average"]) == {"avg@k", "pass@k", "maj@k"}
    lines = res.stdout.splitlines()
    for title, base, method in [("AIME 2024", "11.7", "18.2"), ("AIME 2025", "6.7", "17.2"), ("AMC (83)", "43.8", "62.5"),
                                ("MMLU-Pro", "24.7", "56.2")]:
        row = next(line for line in lines if line.startswith(f"│ {title}"))
        assert [c.strip() for c in row.split("│")[-3:-1]] == [base, method], row  # the paper's base and method cells
    assert "paper: Qwen2.5-7B-Instruct" in res.stdout and "paper: CHORD-phi" in res.stdout
