"""The step-time benchmark (``python -m bench.throughput``): its turn-taking and ratio
logic and where its files go (fast), and one end-to-end run with minimal counts (slow, well
under a minute) that writes into the folder ``--out`` names and leaves docs/results/ as it was."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.throughput import StepRecord, Turns, VariantResult, paired_ratio  # noqa: E402


def test_turns_run_one_step_at_a_time_round_robin():
    """Each participant holds the turn from one take() to the next: steps never overlap and
    run in round-robin order once every participant has arrived; a participant that finishes
    early drops out of the rotation."""
    names, steps = ["a", "b", "c"], {"a": 3, "b": 1, "c": 3}
    turns = Turns(names, seed=0, interleaved=True, device="cpu")
    log, running = [], []

    def participant(name):
        if name == "c":  # a slow set-up: the first round waits for it
            time.sleep(0.2)
            log.append(("c arrives", 0))
        try:
            for i in range(steps[name]):
                turns.take(name)
                running.append(name)
                assert len(running) == 1, f"{running} run at once"
                log.append((name, i))
                time.sleep(0.002)
                running.remove(name)
        finally:
            turns.done(name)

    threads = [threading.Thread(target=participant, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert log == [("c arrives", 0), ("a", 0), ("b", 0), ("c", 0), ("a", 1), ("c", 1), ("a", 2), ("c", 2)]


def test_turns_keep_one_rng_stream_per_participant():
    """Interleaving does not change what each participant draws: its stream is the one it
    would have had alone (seeded at its first turn, saved and restored around switches)."""
    import torch

    def draws(interleaved: bool, names: list[str]) -> dict[str, list[float]]:
        turns = Turns(names, seed=7, interleaved=interleaved, device="cpu")
        out = {n: [] for n in names}

        def participant(name):
            try:
                for _ in range(3):
                    turns.take(name)
                    out[name].append(float(torch.rand(())))
            finally:
                turns.done(name)

        if interleaved:
            ths = [threading.Thread(target=participant, args=(n,)) for n in names]
            [t.start() for t in ths]
            [t.join(timeout=30) for t in ths]
        else:
            for n in names:
                participant(n)
        return out

    alone = draws(False, ["a"])["a"]
    together = draws(True, ["a", "b"])
    assert together["a"] == alone and together["b"] == alone


def test_turns_abort_releases_waiters():
    turns = Turns(["a", "b"], seed=0, interleaved=True, device="cpu")
    errors = []

    def b():
        try:
            turns.take("b")  # waits: it is a's turn
        except Exception as e:  # noqa: BLE001
            errors.append(type(e).__name__)

    t = threading.Thread(target=b)
    t.start()
    turns.take("a")  # both have arrived: a runs
    time.sleep(0.05)
    turns.abort(RuntimeError("a failed"))
    t.join(timeout=10)
    assert errors == ["Aborted"]


def test_paired_ratio():
    def res(name, secs):
        r = VariantResult(name, name)
        r.records = [StepRecord(step=0, seconds=9.0, measured=False)] + [StepRecord(step=i + 1, seconds=s) for i, s in enumerate(secs)]
        return r

    d = paired_ratio(res("a", [1.1, 2.2, 3.0]), res("b", [1.0, 2.0, 3.0]))
    assert d["n"] == 3  # warm-up steps are not paired
    assert d["paired_median"] == pytest.approx(1.1)
    assert d["ratio_of_medians"] == pytest.approx(2.2 / 2.0)
    assert paired_ratio(res("a", [1.0]), None) is None


def test_padding_fraction_and_trained_tokens_per_second_by_hand():
    """--lengths variable's columns: plain TRL's padding from its batch (every row padded to the
    step's widest), a mixrl trainer's from its logged batch/padding_fraction, trained tokens/s."""
    import torch

    from bench.timer import StepTimer

    timer = StepTimer("trl", None, "cpu", warmup=0, total_steps=2)
    out = {"prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]), "completion_mask": torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])}
    timer.current, timer._t0 = StepRecord(step=1), time.perf_counter()
    timer.count_tokens(out)
    timer.end()
    rec = timer.result.records[0]
    # real: 2 + 3 prompt + 4 + 1 completion = 10 tokens; forward: 2 rows x (3 + 4) = 14
    assert rec.forward_tokens == 14 and rec.padding_fraction == pytest.approx(1 - 10 / 14)
    rec.seconds, rec.rollout_seconds = 3.0, 1.0
    assert rec.trained_tokens_per_second == pytest.approx(10 / 2.0)

    class Logged:  # a mixrl trainer: the step's forwards as run (packed, trimmed, budgeted)
        _metrics = {"train": {"batch/padding_fraction": [0.5, 0.25]}}

    timer.current, timer._t0 = StepRecord(step=2), time.perf_counter()
    timer.count_tokens(out)
    timer.trainer_metrics(Logged())
    timer.end()
    assert timer.result.records[1].padding_fraction == 0.25


def test_varlen_variants_name_their_batching():
    """--lengths variable: the plain mixrl variants are padded (padding_free's default auto would pack them)
    and generate padded (trainer.generation's default auto would pick compact)."""
    from bench.varlen import base_and_overrides

    pad = "trainer.generation=padded"
    assert base_and_overrides("grpo", 9) == ("grpo", ["trainer.padding_free=false", pad])
    assert base_and_overrides("chord-budget", 9) == ("chord", ["trainer.padding_free=false", "trainer.max_tokens_per_micro_batch=9", pad])
    assert base_and_overrides("grpo-pf", 9) == ("grpo", ["trainer.padding_free=true", pad])
    assert base_and_overrides("grpo-pf-budget", 9) == ("grpo", ["trainer.padding_free=true", "trainer.max_tokens_per_micro_batch=9", pad])
    assert base_and_overrides("trl", 9) == ("trl", [pad])
    # -cb: generated by transformers' continuous batching, after the batching's own overrides
    assert base_and_overrides("trl-cb", 9) == ("trl", ["trainer.generation=continuous"])
    assert base_and_overrides("grpo-cb", 9) == ("grpo", ["trainer.padding_free=false", "trainer.generation=continuous"])
    assert base_and_overrides("grpo-pf-budget-cb", 9) == (
        "grpo", ["trainer.padding_free=true", "trainer.max_tokens_per_micro_batch=9", "trainer.generation=continuous"])
    # -sp: padded generation, each group's prompt prefilled once
    assert base_and_overrides("grpo-pf-budget-sp", 9) == (
        "grpo", ["trainer.padding_free=true", "trainer.max_tokens_per_micro_batch=9", "trainer.generation=shared-prefill"])
    # -fs: the same config; the trainer's scoring forwards in fixed row chunks (bench.variants.build_variant)
    assert base_and_overrides("grpo-budget-fs", 9) == base_and_overrides("grpo-budget", 9)
    # -compact: padded generation, the finished rows no longer computed
    assert base_and_overrides("grpo-compact", 9) == ("grpo", ["trainer.padding_free=false", "trainer.generation=compact"])
    assert base_and_overrides("grpo-pf-budget-compact", 9) == (
        "grpo", ["trainer.padding_free=true", "trainer.max_tokens_per_micro_batch=9", "trainer.generation=compact"])


def test_row_stops_end_each_row_at_its_length(tiny_model_path):
    """bench.row_stops: with eos suppressed, both engines end row i after lengths[i] tokens; padded
    generate pads the finished rows until the longest is done; outside the block they run unchanged."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.generation import ContinuousBatchingConfig

    from bench.row_stops import RowStops

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    stops = RowStops(model)
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ("1+2=", "13+4=", "7*8=", "100-3=")]
    gen = GenerationConfig(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id,
                           eos_token_id=tok.eos_token_id)
    lengths = [1, 3, 6, 2]
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = (ids != tok.pad_token_id).long()
    with torch.no_grad():
        with stops.lengths(lengths):
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)[:, width:]
            cb = model.generate_batch(prompts, generation_config=gen, progress_bar=False,
                                      continuous_batching_config=ContinuousBatchingConfig(num_blocks=16, page_size=16, max_batch_tokens=64))
        free = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)[:, width:]
    assert out.shape[1] == max(lengths)  # the batch ran until its longest row was done
    assert [int((row != tok.pad_token_id).sum()) for row in out] == lengths
    assert [len(o.generated_tokens) for o in cb.values()] == lengths
    assert [o.generated_tokens for o in cb.values()] == [row[:n].tolist() for row, n in zip(out, lengths)]  # greedy: the same tokens
    assert free.shape[1] == 8  # no block: min_new_tokens holds every row to 8 tokens


def _tree(folder: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under ``folder``: its mtime (ns) and bytes."""
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_out_names_where_every_file_goes(tmp_path, monkeypatch):
    """``--out DIR``: bench.md and profile.txt in DIR; no --out: a new runs/bench/throughput-<time>/
    (never docs/results/); a ``.md`` path: the report itself, the profile beside it (``<name>-profile.txt``
    unless it is bench.md: docs/results/bench-varlen.md leaves bench.md's profile.txt alone); '' : no files;
    an explicit --profile-out wins."""
    from bench.throughput import parse_args

    monkeypatch.chdir(tmp_path)
    o = parse_args(["--out", "elsewhere"])
    assert (o.out, o.profile_out) == ("elsewhere/bench.md", "elsewhere/profile.txt")
    o = parse_args([])
    assert re.fullmatch(r"runs/bench/throughput-\d{8}-\d{6}/bench\.md", o.out), o.out
    assert o.profile_out == str(Path(o.out).parent / "profile.txt")
    o = parse_args(["--out", "docs/results"])  # how the committed report is made
    assert (o.out, o.profile_out) == ("docs/results/bench.md", "docs/results/profile.txt")
    o = parse_args(["--out", "x/report.md"])
    assert (o.out, o.profile_out) == ("x/report.md", "x/report-profile.txt")  # not bench.md's profile.txt
    o = parse_args(["--out", "", "--json", "m.json"])
    assert (o.out, o.profile_out, o.json) == ("", "", "m.json")
    o = parse_args(["--out", "d", "--profile-out", ""])
    assert (o.out, o.profile_out) == ("d/bench.md", "")
    o = parse_args(["--out", "d", "--profile-out", "p/prof.txt"])
    assert o.profile_out == "p/prof.txt"
    assert list(tmp_path.iterdir()) == []  # resolving paths creates nothing


def test_vllm_steps_out_follows_the_same_rule(tmp_path, monkeypatch):
    from bench.vllm_steps import parse_args

    monkeypatch.chdir(tmp_path)
    assert parse_args(["--out", "elsewhere"]).out == "elsewhere/bench-vllm.md"
    assert re.fullmatch(r"runs/bench/vllm-\d{8}-\d{6}/bench-vllm\.md", parse_args([]).out)
    assert parse_args(["--out", "docs/results"]).out == "docs/results/bench-vllm.md"
    assert parse_args(["--out", ""]).out == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, words", [
    (["--only", "grpo,nope"], "unknown variant(s) nope in --only"),
    (["--out", "a-file"], "--out a-file is a file"),
    (["--steps", "0"], "--steps >= 1"),
    (["--set", "trainer.nope=1"], "unknown key 'trainer.nope'"),  # found when the config is composed, before any model loads
    (["--only", "trl,trl-cb"], "trl-cb (continuous batching) need --lengths variable"),
    (["--only", "trl,grpo-sp"], "grpo-sp (shared prefill, compact) need --lengths variable"),
])
def test_bad_options_exit_2_with_one_line_and_create_nothing(args, words, tmp_path):
    (tmp_path / "a-file").write_text("x")
    before = _tree(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    res = subprocess.run([sys.executable, "-m", "bench.throughput", *args], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert words in res.stderr.strip().splitlines()[-1]
    assert _tree(tmp_path) == before


@pytest.mark.slow
def test_bench_end_to_end_minimal(tiny_model_path, tmp_path):
    """One tiny run with ``--out`` elsewhere: every file lands there and docs/results/ (the
    committed report and profile) keeps its files, bytes and mtimes."""
    out_dir = tmp_path / "elsewhere"
    docs_before = _tree(REPO / "docs" / "results")
    runs_before = sorted((REPO / "runs" / "bench").glob("*")) if (REPO / "runs" / "bench").exists() else []
    cmd = [sys.executable, "-m", "bench.throughput", "--warmup", "1", "--steps", "1", "--threads", "1", "--quiet",
           "--model", tiny_model_path, "--set", "trainer.prompts_per_step=2", "--set", "algo.num_generations=2",
           "--set", "trainer.max_completion_length=8", "--out", str(out_dir), "--json", str(tmp_path / "bench.json")]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    assert time.perf_counter() - t0 < 120  # ~30 s on a loaded 2-core machine
    assert _tree(REPO / "docs" / "results") == docs_before
    assert (sorted((REPO / "runs" / "bench").glob("*")) if (REPO / "runs" / "bench").exists() else []) == runs_before
    assert sorted(p.name for p in out_dir.iterdir()) == ["bench.md", "profile.txt"]
    data = json.loads((tmp_path / "bench.json").read_text())
    assert set(data["results"]) == {"trl", "grpo", "chord", "floor"}
    for name, r in data["results"].items():
        measured = [s for s in r["records"] if s["measured"]]
        assert len(measured) == 1 and measured[0]["seconds"] > 0, name
        assert measured[0]["rollout_tokens"] == 2 * 2 * 8, name  # --lengths fixed: every completion 8 tokens
    assert data["results"]["chord"]["records"][-1]["expert_tokens"] > 0
    assert {"grpo_vs_trl", "chord_vs_grpo", "grpo_vs_floor"} <= set(data["ratios"])
    md = (out_dir / "bench.md").read_text()
    assert "python -m bench.throughput" in md and "commit" in md and "(1) mixrl grpo / plain TRL" in md
    assert "[`" + str(out_dir / "profile.txt") + "`](profile.txt)" in md  # linked beside the report
    profile = (out_dir / "profile.txt").read_text()
    assert "cProfile" in profile and "mixrl/trainer/grpo.py" in profile and "torch.profiler" in profile
    assert "mixrl step-time benchmark" in res.stdout


@pytest.mark.slow
def test_bench_varlen_continuous_minimal(tiny_model_path, tmp_path):
    """--lengths variable with the continuous-batching and shared-prefill variants: every variant trains
    the same drawn lengths, each rollout's generation is timed, and the report has the rollout phase and
    ratios (9) and (10)."""
    cmd = [sys.executable, "-m", "bench.throughput", "--lengths", "variable", "--length-median", "3", "--warmup", "0",
           "--steps", "1", "--threads", "1", "--quiet", "--only", "trl,trl-cb,grpo-pf-budget-cb,grpo-pf-budget,grpo-pf-budget-sp",
           "--model", tiny_model_path,
           "--set", "trainer.prompts_per_step=2", "--set", "algo.num_generations=2", "--set", "trainer.max_completion_length=8",
           "--out", str(tmp_path / "out"), "--json", str(tmp_path / "bench.json")]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    data = json.loads((tmp_path / "bench.json").read_text())
    tokens = {name: [s["rollout_tokens"] for s in r["records"]] for name, r in data["results"].items()}
    assert tokens["trl"] == tokens["trl-cb"] == tokens["grpo-pf-budget-cb"] == tokens["grpo-pf-budget-sp"], tokens
    assert all(0 < s["generate_seconds"] <= s["rollout_seconds"] for r in data["results"].values() for s in r["records"])
    md = (tmp_path / "out" / "bench.md").read_text()
    assert "## Rollout phase" in md and "(9) mixrl grpo-pf-budget-cb / plain TRL" in md
    assert "(10) mixrl grpo-pf-budget-sp / plain TRL" in md and "step / grpo-pf-budget (prefill per row)" in md
