"""The sampler in training (mixrl.trainer.parts.sampler_rounds): 2-step runs of the tiny model.

Dynamic sampling trains on informative groups only and says what it paid; a picker's choice
reaches every source (expert rows, replay, a teacher); the per-prompt history travels with
checkpoints and a resumed run continues exactly as the uninterrupted one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from mixrl.cli.main import app

runner = CliRunner()
SMALL = ["trainer.prompts_per_step=2", "trainer.micro_batch_size=8", "trainer.eval_size=0", "data.train_size=32",
         "trainer.max_completion_length=16"]


def _train(fast_overrides, run_dir: Path, extra: list[str]):
    base = [o for o in fast_overrides if not o.startswith("run_dir=")]
    res = runner.invoke(app, ["train", *base, *SMALL, *extra, f"run_dir={run_dir}"])
    assert res.exit_code == 0, res.output[-3000:]
    return res


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_dynamic_sampling_trains_informative_groups_and_reports_what_it_paid(fast_overrides, tmp_path, monkeypatch):
    from mixrl.trainer.grpo import MixrlGRPOTrainer
    from mixrl.trainer.parts.sampler_rounds import SamplerRounds

    trained_groups = []
    original = MixrlGRPOTrainer._sampler_rounds

    def spy(self, *args, **kwargs):
        out, rows = original(self, *args, **kwargs)
        rewards = self.batch_in_flight.rewards_per_func[:, 0].view(-1, self.num_generations)
        trained_groups.append((rewards.max(1).values - rewards.min(1).values).tolist())
        return out, rows

    filtered = []
    original_filter = SamplerRounds.filter_rows

    def spy_filter(self, rewards, advantages):
        out, metrics = original_filter(self, rewards, advantages)
        filtered.append((self.filled.clone(), out.view(-1, self.num_generations).clone()))
        return out, metrics

    monkeypatch.setattr(MixrlGRPOTrainer, "_sampler_rounds", spy)
    monkeypatch.setattr(SamplerRounds, "filter_rows", spy_filter)
    res = _train(fast_overrides, tmp_path / "run", ["sampler=dynamic", "sampler.max_rounds=8"])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    s = summary["sampler"]
    assert s["name"] == "dynamic" and s["trained"] == 2 * 2 * 4  # 2 steps x 2 prompts x 4 rollouts
    assert s["generated"] >= s["trained"] and s["generated"] % 8 == 0  # whole rounds of 2 prompts x 4
    assert summary["rollouts"] == s["generated"]  # the budget counts every generated rollout
    assert f"sampler: {s['generated']} rollouts generated for {s['trained']} trained" in res.output
    rows = _rows(tmp_path / "run")
    assert [r["sampler/generated_per_trained"] for r in rows] and all(r["sampler/generated_per_trained"] >= 1 for r in rows)
    assert len(trained_groups) == 2
    assert int(sum(f.sum() for f, _ in filtered)) == s["short_groups"]
    for (filled, adv), spreads in zip(filtered, trained_groups):
        for is_filled, a, spread in zip(filled.tolist(), adv, spreads):
            # a kept group's rewards differ; a topped-up (dropped) group trains with advantage 0
            assert (bool((a == 0).all()) and spread == 0) if is_filled else spread > 0, (is_filled, a, spread)


def test_no_sampler_is_todays_trainer(fast_overrides, tmp_path):
    from mixrl.config.compose import compose_config
    from mixrl.config.sampler import build_sampler, sampler_active

    cfg = compose_config([])
    assert not sampler_active(cfg) and build_sampler(cfg) == (None, None)
    assert sampler_active(compose_config(["sampler=dynamic"]))


@pytest.mark.parametrize("extra", [
    ["algo=chord"],                                  # expert rows
    ["algo=remix"],                                  # replay
    ["algo=kdrl", "TEACHER"],                        # a teacher (conftest's 8-step one: the built-in is 600 steps)
], ids=["expert", "replay", "teacher"])
def test_every_source_sees_the_picked_prompts(extra, fast_overrides, tiny_teacher_path, tmp_path, monkeypatch):
    """The picker's prompts are the ones the injections see before generation."""
    extra = [f"teacher.source.models=[{tiny_teacher_path}]" if e == "TEACHER" else e for e in extra]
    from mixrl.trainer.parts.injection_context import Injections
    from mixrl.trainer.parts.sampler_rounds import SamplerRounds

    seen = []
    original = SamplerRounds.pick

    def spy(self, inputs):
        rows, idx = original(self, inputs)
        picked = [self.dataset[i]["prompt"] for i in idx]
        seen.append((picked, []))
        return rows, idx

    before = Injections.before_generation

    def record(self, ctx, rows_in):  # what the injections see before generation, after the last pick
        seen[-1][1].append([r["prompt"] for r in rows_in][:: self.num_generations])
        return before(self, ctx, rows_in)

    monkeypatch.setattr(SamplerRounds, "pick", spy)
    monkeypatch.setattr(Injections, "before_generation", record)
    _train(fast_overrides, tmp_path / "run", [*extra, "sampler=thompson"])
    assert len(seen) == 2
    for picked, ctx in seen:
        assert ctx and ctx[0] == picked  # the injections got exactly the picked prompts
    rows = _rows(tmp_path / "run")
    assert all(r["sampler/prompts_tracked"] >= 2 for r in rows)


def _stop_after_checkpoint(monkeypatch, step: int):
    from mixrl.trainer.grpo import MixrlGRPOTrainer

    class Stop(BaseException):
        pass

    save = MixrlGRPOTrainer._save_checkpoint

    def save_then_stop(self, model, trial):
        save(self, model, trial)
        if self.state.global_step == step:
            raise Stop()

    monkeypatch.setattr(MixrlGRPOTrainer, "_save_checkpoint", save_then_stop)
    return Stop


@pytest.mark.slow  # kill-and-resume, three runs of 4 steps each (4-6 CPU-s): make test-slow
@pytest.mark.parametrize("sampler", ["dynamic", "curriculum"])
def test_resume_with_sampler_state_is_exact(sampler, fast_overrides, tmp_path, monkeypatch):
    """Interrupted right after the step-2 checkpoint and resumed: the same weights, losses,
    sampler counters and per-prompt history as the run left alone (4 steps)."""
    from safetensors.torch import load_file

    extra = [f"sampler={sampler}", "trainer.max_steps=4", "trainer.save_steps=2", "trainer.save_total_limit=10"]
    _train(fast_overrides, tmp_path / "full", extra)
    with monkeypatch.context() as m:
        stop = _stop_after_checkpoint(m, 2)
        with pytest.raises(stop):
            runner.invoke(app, ["train", *[o for o in fast_overrides if not o.startswith("run_dir=")], *SMALL, *extra,
                                f"run_dir={tmp_path / 'cut'}"])
    cut = tmp_path / "cut"
    assert (cut / "trainer" / "checkpoint-2" / "mixrl_sampler.json").is_file()
    res = runner.invoke(app, ["train", f"resume={cut}", "logger.progress=false", "hardware.torch_threads=1"])
    assert res.exit_code == 0, res.output[-3000:]
    wa, wb = (load_file(str(d / "model" / "model.safetensors")) for d in (tmp_path / "full", cut))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    ra, rb = _rows(tmp_path / "full"), _rows(cut)
    assert [r["step"] for r in rb] == [1, 2, 3, 4]
    for x, y in zip(ra, rb):
        for key in ("loss", "reward_mean", "sampler/generated_per_trained", "sampler/prompts_tracked"):
            if key in x:
                assert x[key] == y[key], (x["step"], key, x[key], y[key])
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (tmp_path / "full", cut))
    assert sa["sampler"] == sb["sampler"] and sa["rollouts"] == sb["rollouts"]
    a = json.loads((tmp_path / "full" / "trainer" / "checkpoint-4" / "mixrl_sampler.json").read_text())
    b = json.loads((cut / "trainer" / "checkpoint-4" / "mixrl_sampler.json").read_text())
    assert a == b


def test_length_curriculum_and_row_filter(fast_overrides, tmp_path, monkeypatch):
    """``sampler.length`` caps each step's completions (linear 4 -> 16 over 2 steps: 4, then 10);
    a row filter (A-LoL's) zeroes the advantage of the rows it drops, and only theirs."""
    from mixrl.trainer.grpo import MixrlGRPOTrainer
    from mixrl.trainer.parts.sampler_rounds import SamplerRounds

    widths, advantages = [], []
    original = SamplerRounds.filter_rows

    def spy(self, rewards, adv):
        out, metrics = original(self, rewards, adv)
        advantages.append((adv.clone(), out.clone()))
        return out, metrics

    generate = MixrlGRPOTrainer._sampler_rounds

    def spy_generate(self, *args, **kwargs):
        out, rows = generate(self, *args, **kwargs)
        widths.append(int(out["completion_mask"].sum(1).max()))
        return out, rows

    monkeypatch.setattr(SamplerRounds, "filter_rows", spy)
    monkeypatch.setattr(MixrlGRPOTrainer, "_sampler_rounds", spy_generate)
    _train(fast_overrides, tmp_path / "run", ["+sampler.rows.alol={name: nonnegative_advantage}",
                                              "sampler.length={name: linear, start: 4, end: 16, steps: 2}"])
    rows = _rows(tmp_path / "run")
    assert [r["sampler/max_completion_length"] for r in rows] == [4.0, 10.0]
    assert widths[0] <= 4 and widths[1] <= 10
    for before, after in advantages:
        assert torch.equal(after, before.clamp(min=0) * (before >= 0))  # negative ones are 0, the rest unchanged


def test_hard_only_routing_prefixes_exactly_the_prompts_the_history_marks_hard(fast_overrides, tmp_path, monkeypatch):
    """POPE routed by the sampler: on levels 5-6 (the tiny model fails them) with 4 training
    prompts, 2 per step, every prompt is seen by step 2; from then on the first 2 rollouts of
    its group (per_group=2 of 4) continue from an oracle prefix, and a prompt not yet seen (or
    not hard) never gets one."""
    from mixrl.sources.prefix import PrefixCondition

    calls = []
    original = PrefixCondition.generation_prefixes

    def spy(self, ctx, inputs):
        hard = [ctx.prompt_hard(row) for row in inputs]
        prefixes = original(self, ctx, inputs)
        calls.append((ctx.global_step, hard, [len(p) > 0 for p in prefixes]))
        return prefixes

    monkeypatch.setattr(PrefixCondition, "generation_prefixes", spy)
    _train(fast_overrides, tmp_path / "run", ["recipe=pope/hard-routed-arith-tiny", "data.levels=[5,6]",
                                              "data.train_size=4", "trainer.max_steps=4", "sampler.hard_below=0.5",
                                              "algo.inject.per_group=2"])
    assert len(calls) == 4
    for step, hard, prefixed in calls:
        expected = [h and i % 4 < 2 for i, h in enumerate(hard)]
        assert prefixed == expected, (step, hard, prefixed)  # prefixed iff the history says hard (first 2 slots)
    assert not any(calls[0][1])  # step 0: nothing seen, nothing hard
    assert any(p for _, _, pre in calls[2:] for p in pre)  # seen prompts that failed get guided later
