"""``mixrl compare`` (on run directories written by the test, numbers checked by hand),
``mixrl eval`` on a saved tiny model, and the periodic held-out evaluation callback."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.experiments.compare import compare
from mixrl.experiments.runs import find_runs, load_run
from mixrl.experiments.summary import mean_std

runner = CliRunner()


# --------------------------------------------------------------------------- fake runs
def make_run(path: Path, *, algo: str, seed: int, before: float, after: float, evals=None, metrics=None,
             steps: int = 30, rollouts_per_step: int = 64, recipe=None, config=None) -> Path:
    """A run directory as mixrl.trainer.run writes it (only what compare reads)."""
    path.mkdir(parents=True)
    summary = {
        "run_dir": str(path), "algo": algo, "recipe": recipe, "seed": seed, "steps": steps,
        "rollouts": steps * rollouts_per_step, "accuracy_before": before, "accuracy_after": after,
        "eval_before": {"accuracy": before, "n": 10.0}, "eval_after": {"accuracy": after, "n": 10.0, "accuracy/level3": after / 2},
        "wall_seconds": 10.0,
    }
    (path / "summary.json").write_text(json.dumps(summary))
    if metrics is None:
        metrics = [{"step": s, "accuracy": 0.1 * s, "reward_mean": 0.1 * s, "entropy": 1.0 / s, "completion_length": 10.0 + s}
                   for s in range(1, steps + 1)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    if evals is not None:
        (path / "eval.jsonl").write_text("".join(
            json.dumps({"step": s, "rollouts": s * rollouts_per_step, "accuracy": a, "n": 10.0}) + "\n" for s, a in evals
        ))
    (path / "config.yaml").write_text(yaml.safe_dump(config or {"algo": {"name": algo, "mix": {"mode": "none"}}, "seed": seed}))
    (path / "model").mkdir()
    return path


@pytest.fixture
def sweep(tmp_path) -> Path:
    """A multirun sweep folder: grpo x 3 seeds with eval.jsonl, chord x 2 seeds without."""
    root = tmp_path / "runs" / "multirun" / "2025-01-01" / "120000"
    # grpo: final 0.5, 0.7, 0.6; eval.jsonl at steps 10 and 20 (64 rollouts per step)
    make_run(root / "0-seed-1", algo="grpo", seed=1, before=0.2, after=0.5, evals=[(10, 0.3), (20, 0.55)])
    make_run(root / "1-seed-2", algo="grpo", seed=2, before=0.2, after=0.7, evals=[(10, 0.4), (20, 0.8)])
    make_run(root / "2-seed-3", algo="grpo", seed=3, before=0.2, after=0.6, evals=[(10, 0.65), (20, 0.6)])
    mu_rows = [{"step": s, "accuracy": 0.5, "reward_mean": 0.5, "entropy": 0.2 * s, "completion_length": 20.0, "mu": 0.1}
               for s in (1, 2, 3)]
    make_run(root / "3-chord-1", algo="chord", seed=1, before=0.2, after=0.4, metrics=mu_rows, steps=3)
    make_run(root / "4-chord-2", algo="chord", seed=2, before=0.2, after=0.8, metrics=mu_rows, steps=3)
    return root


def test_table_numbers_match_hand_computation(sweep, tmp_path):
    res = compare([sweep.parent.parent], tmp_path / "out", target=0.6)  # the date folder: runs found recursively
    rows = {r.method: r for r in res.rows}
    assert set(rows) == {"grpo", "chord"}
    g, c = rows["grpo"], rows["chord"]
    assert g.n == 3 and sorted(g.seeds) == [1, 2, 3]
    assert g.final_mean == pytest.approx(0.6)
    assert g.final_std == pytest.approx(0.1)  # sample std (n - 1) of 0.5, 0.7, 0.6
    # best: max over eval.jsonl and the final evaluation: 0.55, 0.8, 0.65
    assert g.best_mean == pytest.approx((0.55 + 0.8 + 0.65) / 3)
    # rollouts to 0.6: seed 1 never (0.3, 0.55, final 0.5), seed 2 at step 20 (1280), seed 3 at step 10 (640)
    assert (g.reached, g.with_evals) == (2, 3)
    assert g.rollouts_mean == pytest.approx((1280 + 640) / 2)
    # final entropy = last step's (1/30 in every seed); completion length = mean of 10 + s over s = 1..30
    assert g.entropy == pytest.approx(1 / 30)
    assert g.completion_length == pytest.approx(10 + 15.5)
    assert c.final_mean == pytest.approx(0.6) and c.final_std == pytest.approx(math.sqrt(0.08))
    assert c.with_evals == 0 and c.rollouts_mean is None
    assert c.entropy == pytest.approx(0.6)

    md = res.markdown.read_text()
    assert "| grpo | 3 | 0.600 ± 0.100 | 0.667 ± 0.126 | 960 (2/3) |" in md
    assert "n/a (no eval.jsonl)" in md
    data = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert data["methods"][0]["final_mean"] == pytest.approx(0.6)


def test_not_reached_and_other_metric(sweep, tmp_path):
    res = compare([sweep], tmp_path / "out", target=0.9, plots=False)
    g = next(r for r in res.rows if r.method == "grpo")
    assert g.reached == 0 and "not reached (0/3)" in res.markdown.read_text()
    res = compare([sweep], tmp_path / "out2", metric="accuracy/level3", plots=False)
    g = next(r for r in res.rows if r.method == "grpo")
    assert g.final_mean == pytest.approx(0.3)  # eval_after accuracy/level3 = after / 2


def test_start_already_at_target_counts_zero_rollouts(tmp_path):
    make_run(tmp_path / "r", algo="grpo", seed=0, before=0.7, after=0.5, evals=[(10, 0.4)])
    (row,) = compare([tmp_path / "r"], tmp_path / "out", target=0.6, plots=False).rows
    assert row.rollouts_mean == 0 and row.reached == 1
    assert row.best_mean == pytest.approx(0.5)  # the evaluation before training is not a "best"


def test_plots_written_and_title_says_which_accuracy(sweep, tmp_path):
    pytest.importorskip("matplotlib")
    res = compare([sweep], tmp_path / "out")
    for name in ("learning_curve.png", "reward.png", "entropy.png", "mu.png"):
        f = tmp_path / "out" / name
        assert f.is_file() and f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert "training accuracy" in res.curve_source  # chord runs have no eval.jsonl
    assert "learning_curve.png" in res.markdown.read_text()
    # only grpo: every run has eval.jsonl -> the held-out curve; no run logs mu -> no mu plot
    res = compare([sweep / "0-seed-1", sweep / "1-seed-2"], tmp_path / "out2")
    assert res.curve_source.startswith("held-out accuracy")
    assert not (tmp_path / "out2" / "mu.png").exists()


def test_discovery_sweep_staged_and_duplicates(sweep, tmp_path):
    staged = tmp_path / "staged"
    make_run(staged, algo="sft_then_rl", seed=0, before=0.1, after=0.6, steps=4)
    s = json.loads((staged / "summary.json").read_text())
    s["stages"] = [{"name": "sft", "run_dir": str(staged / "stage1-sft"), "steps": 2},
                   {"name": "rl", "run_dir": str(staged / "stage2-rl"), "steps": 2}]
    (staged / "summary.json").write_text(json.dumps(s))
    for i, (name, ro) in enumerate((("sft", 0), ("rl", 64))):
        make_run(staged / f"stage{i + 1}-{name}", algo=name, seed=0, before=0.1, after=0.5, steps=2, rollouts_per_step=ro,
                 evals=[(1, 0.2 + i), (2, 0.3 + i)])
    runs = find_runs([sweep, staged, sweep / "0-seed-1"])
    assert len(runs) == 6  # 5 in the sweep (no duplicate) + the staged run (its stages are not separate runs)
    run = load_run(staged)
    assert [(e["step"], e["rollouts"]) for e in run.evals] == [(1, 0), (2, 0), (3, 64), (4, 128)]


def test_group_by_config_value(tmp_path):
    for i, mu in enumerate((0.1, 0.1, 0.5)):
        make_run(tmp_path / f"r{i}", algo="chord", seed=i, before=0.1, after=0.2 + i / 10,
                 config={"algo": {"name": "chord", "mix": {"mu": mu}}, "seed": i})
    res = compare([tmp_path], tmp_path / "out", by=["algo.mix.mu"], plots=False)
    assert {r.method: r.n for r in res.rows} == {"chord algo.mix.mu=0.1": 2, "chord algo.mix.mu=0.5": 1}


def test_mean_std_helpers():
    assert mean_std([1.0, None, 3.0]) == (2.0, pytest.approx(math.sqrt(2)), 2)
    assert mean_std([None]) == (None, None, 0)
    assert mean_std([0.4]) == (0.4, None, 1)


# --------------------------------------------------------------------------- CLI
def _one_line_error(res) -> str:
    assert res.exit_code == 2, f"exit {res.exit_code}: {res.output}"
    assert "Traceback" not in res.output and res.stdout.strip() == ""
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), lines
    return lines[0]


def test_cli_compare_prints_table(sweep, tmp_path):
    res = runner.invoke(app, ["compare", str(sweep), "--out", str(tmp_path / "out"), "--target", "0.6"])
    assert res.exit_code == 0, res.output
    for text in ("grpo", "chord", "0.600 ± 0.100", "960 (2/3)", "compare.md"):
        assert text in res.stdout
    assert (tmp_path / "out" / "compare.md").is_file()


def test_cli_compare_errors(tmp_path, sweep):
    (tmp_path / "empty").mkdir()
    line = _one_line_error(runner.invoke(app, ["compare", str(tmp_path / "empty"), "--out", str(tmp_path / "o")]))
    assert "no run found" in line and "summary.json" in line
    line = _one_line_error(runner.invoke(app, ["compare", str(tmp_path / "nope")]))
    assert "does not exist" in line
    line = _one_line_error(runner.invoke(app, ["compare", str(sweep), "--metric", "acuracy", "--no-plots", "--out", str(tmp_path / "o")]))
    assert "acuracy" in line and "did you mean: accuracy" in line
    line = _one_line_error(runner.invoke(app, ["compare", str(sweep), "--by", "algo.nope", "--no-plots", "--out", str(tmp_path / "o")]))
    assert "algo.nope" in line


def test_cli_eval_errors(tmp_path):
    line = _one_line_error(runner.invoke(app, ["eval", str(tmp_path / "nope")]))
    assert "does not exist" in line
    line = _one_line_error(runner.invoke(app, ["eval", str(tmp_path)]))
    assert "config.json" in line and "adapter_config.json" in line
    line = _one_line_error(runner.invoke(app, ["eval", str(tmp_path), "trainer.eval_sise=3"]))
    assert "trainer.eval_size" in line  # overrides are checked first


def test_cli_eval_saved_model(tiny_model_path, tmp_path):
    out = tmp_path / "eval.json"
    res = runner.invoke(app, ["eval", tiny_model_path, "trainer.eval_size=6", "trainer.max_completion_length=24",
                              "logger.progress=false", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "accuracy" in res.stdout and "6 problems of builtin:arith" in res.stdout
    result = json.loads(out.read_text())
    assert result["metrics"]["n"] == 6 and 0.0 <= result["metrics"]["accuracy"] <= 1.0
    assert {"accuracy/level1", "accuracy/level2", "accuracy/level3"} <= set(result["metrics"])
    # the same numbers as evaluate_accuracy on the same rows (the CLI reuses it)
    from transformers import AutoModelForCausalLM

    from mixrl.config.compose import compose_config
    from mixrl.trainer import build
    from mixrl.evaluation.accuracy import evaluate_accuracy

    cfg = compose_config(["trainer.eval_size=6"])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    direct = evaluate_accuracy(model, build.load_tokenizer(tiny_model_path, cfg), build.load_eval_rows(cfg),
                               build.build_reward_funcs(cfg)[0][0], max_new_tokens=24)
    assert direct == result["metrics"]


@pytest.mark.slow
def test_cli_eval_lora_run(fast_overrides, tiny_model_path, tmp_path):
    """A LoRA run saves an adapter only: mixrl eval RUN_DIR merges it into the base model it was
    trained on (adapter_config.json) and evaluates that, with the run's config."""
    from transformers import AutoModelForCausalLM

    from mixrl.config.compose import compose_config
    from mixrl.trainer import build
    from mixrl.evaluation.accuracy import evaluate_accuracy
    from mixrl.evaluation.saved import adapter_base, load_saved_model

    threads = [] if any(o.startswith("hardware.torch_threads=") for o in fast_overrides) else ["hardware.torch_threads=1"]
    res = runner.invoke(app, ["train", *fast_overrides, *threads, "model.lora.enabled=true", "trainer.learning_rate=1e-2"])
    assert res.exit_code == 0, res.output[-3000:]
    run_dir = Path(fast_overrides[-1].split("=", 1)[1])
    model_dir = run_dir / "model"
    assert (model_dir / "adapter_config.json").is_file() and not (model_dir / "config.json").exists()
    assert adapter_base(model_dir) == tiny_model_path
    # 2 steps of a barely warm model earn no reward, so LoRA's B matrices are still zero: give them
    # values, so that a merged model differs from its base
    from safetensors.torch import load_file, save_file

    weights = load_file(model_dir / "adapter_model.safetensors")
    gen = torch.Generator().manual_seed(0)
    lora_b = [k for k in weights if "lora_B" in k]
    assert lora_b
    for k in lora_b:
        weights[k] = torch.randn(weights[k].shape, generator=gen) * 0.05
    save_file(weights, model_dir / "adapter_model.safetensors")

    out = tmp_path / "eval.json"
    res = runner.invoke(app, ["eval", str(run_dir), "trainer.eval_size=6", "logger.progress=false", "--out", str(out)])
    assert res.exit_code == 0, res.output[-3000:]
    result = json.loads(out.read_text())
    assert result["lora_base"] == tiny_model_path and result["metrics"]["n"] == 6

    cfg = compose_config(["trainer.eval_size=6"])
    merged = load_saved_model(model_dir, cfg)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    changed = [k for k, v in base.state_dict().items() if not torch.equal(v, merged.state_dict()[k])]
    assert changed and all("proj" in k for k in changed)  # the adapter's trained deltas are merged in
    direct = evaluate_accuracy(merged, build.load_tokenizer(str(model_dir), cfg), build.load_eval_rows(cfg),
                               build.build_reward_funcs(cfg)[0][0], max_new_tokens=24)
    assert direct == result["metrics"]

    # the adapter's base model gone: one line naming it
    (model_dir / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path / "gone")}))
    line = _one_line_error(runner.invoke(app, ["eval", str(run_dir), "trainer.eval_size=6"]))
    assert "LoRA adapter" in line and "no longer there" in line


# --------------------------------------------------------------------------- periodic evaluation
def test_periodic_eval_schedule_and_rng_isolation(tiny_model_path, tmp_path):
    from transformers import AutoModelForCausalLM, TrainerControl, TrainerState

    from mixrl.config.compose import compose_config
    from mixrl.trainer import build
    from mixrl.evaluation.periodic import PeriodicEvalCallback

    cfg = compose_config(["trainer.eval_size=4", "trainer.eval_every=2", "trainer.eval_pass_k=2", "trainer.max_completion_length=16"])
    tok = build.load_tokenizer(tiny_model_path, cfg)
    cb = PeriodicEvalCallback.from_config(cfg, tmp_path, tok, build.load_eval_rows(cfg), build.build_reward_funcs(cfg)[0][0],
                                          model=AutoModelForCausalLM.from_pretrained(tiny_model_path))
    assert [s for s in range(7) if cb.due(s)] == [2, 4, 6]
    state = TrainerState()
    logs_by_step = {}
    torch.manual_seed(123)
    rng = torch.get_rng_state()
    for step in (1, 2, 3):
        state.global_step = step
        cb.on_step_end(None, state, TrainerControl())
        logs = {"loss": 0.0}
        cb.on_log(None, state, TrainerControl(), logs=logs)
        logs_by_step[step] = logs
    assert torch.equal(torch.get_rng_state(), rng), "a sampled evaluation changed the training RNG"
    rows = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2]
    assert {"accuracy", "pass@2", "accuracy/level1", "n", "seconds"} <= set(rows[0])
    assert "eval/accuracy" not in logs_by_step[1] and logs_by_step[2]["eval/accuracy"] == rows[0]["accuracy"]
    # reproducible: the same step evaluates with the same seed
    assert cb.evaluate(cb.model, 2) == {k: v for k, v in rows[0].items() if k not in ("step", "seconds")}


@pytest.mark.slow
def test_train_with_eval_every_writes_eval_jsonl(fast_overrides, tmp_path):
    """A 2-step run with trainer.eval_every=1: eval.jsonl rows at steps 1 and 2, the same
    values logged as eval/* in metrics.jsonl, and the last row equals the final evaluation."""
    threads = [] if any(o.startswith("hardware.torch_threads=") for o in fast_overrides) else ["hardware.torch_threads=1"]
    res = runner.invoke(app, ["train", *fast_overrides, "trainer.eval_every=1", *threads])
    assert res.exit_code == 0, res.output
    run_dir = Path(fast_overrides[-1].split("=", 1)[1])
    rows = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert [(r["step"], r["rollouts"]) for r in rows] == [(1, 16), (2, 32)]  # 4 prompts x 4 generations per step
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["eval/accuracy"] for m in metrics] == [r["accuracy"] for r in rows]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["accuracy_after"] == rows[-1]["accuracy"]  # greedy, same weights
    res = runner.invoke(app, ["compare", str(run_dir), "--out", str(tmp_path / "cmp")])
    assert res.exit_code == 0, res.output


def test_runs_whose_configs_differ_beyond_the_seed_are_not_pooled(tmp_path):
    def cfg(seed, lr):
        return {"algo": {"name": "grpo"}, "seed": seed, "run_dir": f"r{seed}", "trainer": {"learning_rate": lr}}

    make_run(tmp_path / "a", algo="grpo", seed=0, before=0.2, after=0.5, config=cfg(0, 5e-5))
    make_run(tmp_path / "b", algo="grpo", seed=1, before=0.2, after=0.7, config=cfg(1, 5e-5))
    make_run(tmp_path / "c", algo="grpo", seed=0, before=0.2, after=0.1, config=cfg(0, 1e-2))
    result = compare([tmp_path], tmp_path / "out", plots=False)
    by_label = {r.method: sorted(r.seeds) for r in result.rows}
    assert by_label == {"grpo trainer.learning_rate=5e-05": [0, 1], "grpo trainer.learning_rate=0.01": [0]}
    assert "trainer.learning_rate=0.01" in result.markdown.read_text()


def test_seeds_of_one_config_are_pooled(tmp_path):
    for seed in (0, 1, 2):
        make_run(tmp_path / f"s{seed}", algo="grpo", seed=seed, before=0.2, after=0.5,
                 config={"algo": {"name": "grpo"}, "seed": seed, "run_dir": f"runs/s{seed}", "logger": {"progress": seed > 0}})
    (row,) = compare([tmp_path], tmp_path / "out", plots=False).rows
    assert row.method == "grpo" and row.n == 3
