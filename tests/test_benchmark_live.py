"""Benchmarks during training (``trainer.eval_benchmarks``, :mod:`mixrl.benchmarks.live`): the
periodic evaluation scores a benchmark suite with a subset and a smaller k, logged as
``eval/<benchmark>/<metric>``; the GPU recipes evaluate on their papers' suites."""

from __future__ import annotations

import json
from math import comb
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mixrl.benchmarks import live
from mixrl.cli.main import app
from mixrl.config.compose import compose_config
from mixrl.errors import ConfigError

runner = CliRunner()
FIXTURES = Path(__file__).parent / "fixtures" / "benchmarks"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_metrics_at_k_keep_the_protocols_kinds():
    assert live.metrics_at(["avg@32", "pass@32", "maj@32"], 4) == ["avg@4", "pass@4", "maj@4"]
    assert live.metrics_at(["avg@1"], 1) == ["avg@1"]
    assert live.metrics_at(["avg@16", "pass@1", "pass@16"], 2) == ["avg@2", "pass@2"]


def test_a_two_step_run_logs_the_arith_benchmark_beside_the_heldout_accuracy(fast_overrides, tmp_path):
    """Greedy arith benchmark = the run's held-out rows decoded greedily: eval/arith/avg@1 equals
    eval/accuracy of the same step; a sampled arith (k=4, temperature 1) logs avg@4 and pass@4,
    and pass@4 is the fraction of problems with a correct sample in its 4."""
    res = runner.invoke(app, ["train", *fast_overrides, "trainer.eval_every=2", "trainer.eval_benchmarks=arith",
                              "trainer.eval_benchmark_k=1"])
    assert res.exit_code == 0, res.output[-2000:]
    run_dir = tmp_path / "run"
    (row,) = _rows(run_dir / "eval.jsonl")
    assert row["step"] == 2 and row["arith/avg@1"] == pytest.approx(row["accuracy"])
    metrics = _rows(run_dir / "metrics.jsonl")
    assert metrics[-1]["eval/arith/avg@1"] == pytest.approx(row["accuracy"])
    assert "eval/arith/avg@1" not in metrics[0]

    cfg = compose_config([*fast_overrides, "trainer.eval_benchmarks=arith", "trainer.eval_benchmark_k=4",
                          "trainer.eval_benchmark_problems=6",
                          "trainer.eval_benchmark_overrides=['benchmarks.arith.protocol.temperature=1.0',"
                          "'benchmarks.arith.protocol.metrics=[avg@1,pass@1]']"])
    from mixrl.trainer import build
    from transformers import AutoModelForCausalLM

    tok = build.load_tokenizer(str(run_dir / "model") if (run_dir / "model").is_dir() else cfg.model.path, cfg)
    (bench,) = live.prepare(cfg, tok, build.build_reward_funcs(cfg)[0][0], eval_rows=build.load_eval_rows)
    assert (len(bench.problems), bench.samples, bench.metrics) == (6, 4, ["avg@4", "pass@4"])
    model = AutoModelForCausalLM.from_pretrained(str(run_dir / "model"))
    examples: list[dict] = []
    scores = bench.evaluate(model, tok, batch_size=8, examples=examples)
    assert set(scores) == {"avg@4", "pass@4"} and 0.0 <= scores["avg@4"] <= scores["pass@4"] <= 1.0
    assert len(examples) == 6 and {"prompt", "completion", "correct", "reward"} <= set(examples[0])


def test_math_fixtures_score_during_training_with_a_subset_and_k(tiny_model_path, tmp_path):
    """A math suite read from the fixtures (the hub schema), 2 problems x 2 samples each."""
    cfg = compose_config([f"model.path={tiny_model_path}", "trainer.max_completion_length=8", "trainer.eval_benchmarks=[aime24,amc23]",
                          "trainer.eval_benchmark_problems=2", "trainer.eval_benchmark_k=2",
                          f"trainer.eval_benchmark_overrides=['benchmarks.source_dir={FIXTURES}',"
                          "'benchmarks.all.protocol.max_new_tokens=6']"])
    from mixrl.trainer import build
    from transformers import AutoModelForCausalLM

    tok = build.load_tokenizer(tiny_model_path, cfg)
    benches = live.prepare(cfg, tok, None, eval_rows=build.load_eval_rows)
    assert [(b.bench.name, len(b.problems), b.samples, b.max_new_tokens) for b in benches] == [
        ("aime24", 2, 2, 6), ("amc23", 2, 2, 6)]
    assert benches[0].metrics == ["avg@2", "pass@2", "maj@2"]
    scores = live.evaluate(AutoModelForCausalLM.from_pretrained(tiny_model_path), tok, benches[0], batch_size=4)
    assert scores == {"avg@2": 0.0, "pass@2": 0.0, "maj@2": 0.0}  # an untrained tiny model writes no boxed answer


@pytest.mark.parametrize("override, words", [
    ("trainer.eval_benchmarks=aime2024", "unknown benchmark or suite 'aime2024'"),
    ("trainer.eval_benchmark_k=0", "eval_benchmark_k=0 is out of range"),
    ("trainer.eval_benchmark_problems=0", "eval_benchmark_problems=0 is out of range"),
])
def test_bad_benchmark_settings_are_one_line_before_the_run_directory(fast_overrides, tmp_path, override, words):
    extra = [] if override.startswith("trainer.eval_benchmarks=") else ["trainer.eval_benchmarks=math6"]
    res = runner.invoke(app, ["train", *fast_overrides, "trainer.eval_every=2", *extra, override])
    assert res.exit_code == 2, res.output[-2000:]
    assert words in res.output
    assert not (tmp_path / "run").exists()


def test_greedy_benchmark_with_k_above_one_is_refused():
    with pytest.raises(ConfigError, match="decodes greedily"):
        live.selection(compose_config(["trainer.eval_benchmarks=arith", "trainer.eval_benchmark_k=4"]))


GPU_RECIPES = ["ampo/qwen2.5-7b-instruct-openr1", "chord/mu-qwen2.5-7b-openr1", "chord/phi-qwen2.5-7b-openr1",
               "chord/qwen2.5-7b-openr1", "exgrpo/qwen2.5-math-7b-openr1", "ghpo/qwen2.5-math-7b-math3to5",
               "kdrl/qwen2.5-math-1.5b-openr1", "luffy/qwen2.5-math-7b-openr1", "mix/qwen2.5-7b-openr1",
               "opd/qwen2.5-math-1.5b-openr1", "opsd/qwen2.5-math-1.5b-openr1", "remix/qwen2.5-math-7b-openr1"]


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_gpu_recipes_evaluate_on_their_papers_benchmarks(recipe):
    cfg = compose_config([f"recipe={recipe}"])
    t = cfg.trainer
    assert t.eval_size == 0, "no held-out training rows: the papers report benchmarks"
    assert t.eval_every > 0 and t.eval_benchmarks == cfg.recipe_info.benchmarks
    sel = live.selection(cfg)
    assert sel is not None and sel.benchmarks and t.eval_benchmark_k and t.eval_benchmark_problems


def test_pass_at_k_of_the_live_metrics_is_the_unbiased_estimator():
    from mixrl.benchmarks.metrics import per_problem

    for c in range(5):
        assert per_problem("pass@2", [True] * c + [False] * (4 - c)) == pytest.approx(1 - comb(4 - c, 2) / comb(4, 2))


def test_plan_counts_the_benchmark_evaluation_by_hand():
    """chord/qwen2.5-7b-openr1: chord4, the first 32 problems (AIME has 30), k = 4, 10240 new tokens
    (the suite's protocol), on 8 processes: each generates ceil(30 x 4 / 8) = 15 AIME pairs and
    32 x 4 / 8 = 16 of AMC and MMLU-Pro; the final table is 16 samples of the math sets and one of
    MMLU-Pro's 12032 questions; the KV cache of min(eval_batch_size 32, 16) rows x (512 prompt + 10240)
    tokens at 2 L kv p bytes per token."""
    from mixrl import plan

    cfg = compose_config(["recipe=chord/qwen2.5-7b-openr1"])
    ev = plan.evaluation_counts(cfg, prompt_tokens=512)
    assert [(r["name"], r["problems"], r["samples"]) for r in ev["benchmarks"]] == [
        ("aime24", 30, 4), ("aime25", 30, 4), ("amc", 32, 4), ("mmlu_pro", 32, 4)]
    assert ev["tokens_per_eval"] == (30 + 30 + 2 * 32) * 4 * 10240
    steps, every = int(cfg.trainer.max_steps), int(cfg.trainer.eval_every)  # 1953 steps (the authors' run), every 50
    assert ev["evaluations"] == steps // every and ev["tokens_total"] == (steps // every) * ev["tokens_per_eval"]
    assert ev["final_tokens"] == (30 * 16 + 30 * 16 + 83 * 16 + 12032 * 1) * 10240
    assert ev["processes"] == 8 and ev["tokens_per_process"] == (2 * 15 + 2 * 16) * 10240
    assert ev["seconds_per_eval"] == ev["tokens_per_process"] / plan.EVAL_TOKENS_PER_S["hf"]
    e = plan.estimate(cfg, plan.model_shape(cfg), prompt_tokens=512)
    assert ev["batch_rows"] == 16 and e["eval_kv"] == 2 * 28 * (4 * 128) * 2 * (512 + 10240) * 16
    text = plan.render_plan(cfg, ["recipe=chord/qwen2.5-7b-openr1"], prompt_tokens=512)
    assert "evaluation KV cache" in text and "eval/mmlu_pro/avg@4" in text and f"{ev['tokens_per_eval']:,}" in text
    assert "634,880 on each of 8 process(es)" in text
    one = plan.evaluation_counts(compose_config(["recipe=chord/qwen2.5-7b-openr1", "hardware=gpu-1x80g"]), prompt_tokens=512)
    assert one["processes"] == 1 and one["tokens_per_process"] == one["tokens_per_eval"] and one["batch_rows"] == 32
    assert plan.evaluation_counts(compose_config([])) is None  # no benchmarks: no evaluation section
    assert "evaluation (" not in plan.render_plan(compose_config([]), [])


def test_shards_are_disjoint_cover_every_pair_and_run_the_same_batches():
    for total, world in [(15, 2), (16, 2), (7, 3), (1, 2), (0, 2)]:
        shares = [live.shard(total, r, world) for r in range(world)]
        owned = [i for idx, real in shares for i in idx[:real]]
        assert owned == list(range(total))  # disjoint, in rank order, every pair once
        assert len({len(idx) for idx, _ in shares}) == 1  # the same length on every process
    assert live.shard(15, 1, 2) == ([8, 9, 10, 11, 12, 13, 14, 14], 7)


def test_seeded_sampling_is_gumbel_max_on_the_nucleus_by_hand():
    """One step of :class:`live.SeededSampling` = the scores / T + -log(-log u) with u from the
    pair's generator, by hand; tokens outside the top-p nucleus stay -inf; and the argmax over
    many pairs is distributed as softmax(z / T) (chi-square-free check: within 0.03 on 4000 draws)."""
    import torch

    z = torch.tensor([[2.0, 1.0, 0.0, -3.0]])
    s = live.SeededSampling(seed=7, pairs=[5], temperature=0.5, top_p=0.9)
    out = s.batch(0)(torch.zeros(1, 3, dtype=torch.long), z.clone())
    g = torch.Generator().manual_seed(((7 * 1_000_003 + 5) * 100_003 + 0) % (2**63 - 1))
    u = torch.rand(4, generator=g)
    p = torch.softmax(z[0] / 0.5, -1)  # [0.867, 0.117, 0.016, ...]: the 0.9 nucleus is tokens 0 and 1
    expect = z[0] / 0.5 - torch.log(-torch.log(u))
    assert torch.allclose(out[0, :2], expect[:2]) and torch.isinf(out[0, 2:]).all()

    draws = 4000
    s = live.SeededSampling(seed=1, pairs=list(range(draws)), temperature=1.0, top_p=None)
    picks = s.batch(0)(torch.zeros(draws, 1, dtype=torch.long), z.expand(draws, 4).clone()).argmax(-1)
    freq = torch.bincount(picks, minlength=4).float() / draws
    assert torch.allclose(freq, torch.softmax(z[0], -1), atol=0.03), (freq, p)


def _train(overrides: list[str], run_dir: Path) -> list[dict]:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MIXRL_LAUNCHED")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "mixrl.cli.main", "train", *overrides, f"run_dir={run_dir}"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return _rows(run_dir / "eval.jsonl")


@pytest.mark.slow  # 47 s alone: make test-slow
def test_two_processes_share_the_benchmark_and_log_what_one_process_logs(tiny_model_path, tmp_path):
    """hardware=cpu-2proc: each process generates 8 of the 5 x 3 sampled (problem, sample) pairs
    (the second's last one a discarded repeat), the results are gathered, and eval/arith/* equals
    the 1-process run's on the same weights (learning rate 1e-30: below float32 rounding) and seed: the samples are seeded per pair."""
    base = ["trainer.prompts_per_step=2", "algo.num_generations=2", "trainer.max_steps=1", "trainer.eval_every=1",
            "trainer.learning_rate=1e-30", "trainer.eval_size=6", "trainer.max_completion_length=8", "data.train_size=8",
            "logger.progress=false", "hardware.torch_threads=1", f"model.path={tiny_model_path}",
            "trainer.eval_benchmarks=arith", "trainer.eval_benchmark_k=3", "trainer.eval_benchmark_problems=5",
            "trainer.eval_benchmark_overrides=['benchmarks.arith.protocol.temperature=1.0',"
            "'benchmarks.arith.protocol.metrics=[avg@1,pass@1]']"]
    (one,) = _train([*base, "hardware=cpu"], tmp_path / "one")
    (two,) = _train([*base, "hardware=cpu-2proc"], tmp_path / "two")
    keys = ["arith/avg@3", "arith/pass@3", "accuracy"]
    assert {k: two[k] for k in keys} == {k: one[k] for k in keys}
    # (the untrained tiny model scores 0 here: the completions themselves are compared below)


def test_sharded_samples_are_the_unsharded_samples(fast_overrides, tiny_model_path, monkeypatch):
    """The completions each of two processes generates for its share, concatenated in rank order,
    are the one-process completions, text for text (sampled, temperature 1, 5 problems x 3)."""
    import torch
    from transformers import AutoModelForCausalLM

    from mixrl.trainer import build

    cfg = compose_config([*fast_overrides, "trainer.eval_benchmarks=arith", "trainer.eval_benchmark_k=3",
                          "trainer.eval_benchmark_problems=5",
                          "trainer.eval_benchmark_overrides=['benchmarks.arith.protocol.temperature=1.0',"
                          "'benchmarks.arith.protocol.metrics=[avg@1,pass@1]']"])
    tok = build.load_tokenizer(tiny_model_path, cfg)
    (bench,) = live.prepare(cfg, tok, build.build_reward_funcs(cfg)[0][0], eval_rows=build.load_eval_rows)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)

    def texts(rank: int, world: int, batch_size: int) -> list[str]:
        seen: list = []
        monkeypatch.setattr(live, "_world", lambda: (rank, world))
        monkeypatch.setattr(live, "_gather", lambda obj: seen.append(obj) or [obj])
        torch.manual_seed(3)
        try:
            bench.evaluate(model, tok, batch_size=batch_size)
        except ValueError:  # one share alone is not every problem's k samples: no metrics
            pass
        return seen[0][0]

    whole = texts(0, 1, 8)
    assert len(whole) == 15 and len(set(whole)) > 5  # sampled: the samples differ
    assert texts(0, 2, 3) + texts(1, 2, 5) == whole  # other shares, other batch compositions, same samples
