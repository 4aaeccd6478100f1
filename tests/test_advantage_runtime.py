"""The trainer's runtime inputs to advantages: OPO's completion lengths, ReMax's greedy
baseline and MT-GRPO's per-turn rewards, each in a 2-step run on a tiny model. The ReMax baseline
of the first step is recomputed here independently: greedy ``generate`` of the saved start model on
the same prompts, scored with the same (patched) reward."""

from __future__ import annotations

import json

import pytest
import torch

from mixrl.core.advantages import ADVANTAGES


def _record(monkeypatch, name):
    calls = []
    fn = ADVANTAGES.get(name)

    def wrapped(rewards, group_ids, **kw):
        out = fn(rewards, group_ids, **kw)
        calls.append({"rewards": rewards.clone(), "group_ids": group_ids.clone(), **{k: v for k, v in kw.items() if torch.is_tensor(v)}, "out": out})
        return out

    wrapped.needs = getattr(fn, "needs", ())
    monkeypatch.setitem(ADVANTAGES._items, name, wrapped)
    return calls


def _train(overrides):
    from typer.testing import CliRunner

    from mixrl.cli.main import app

    res = CliRunner().invoke(app, ["train", *overrides, "trainer.save_steps=0"])
    assert res.exit_code == 0, res.stdout[-2000:]


def test_opo_gets_the_completion_lengths(monkeypatch, fast_overrides, tmp_path):
    calls = _record(monkeypatch, "opo")
    _train(["algo=grpo", "algo.advantage.name=opo", *fast_overrides])
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(calls) == 2
    for call, row in zip(calls, rows):
        L, r, g = call["lengths"], call["rewards"], call["group_ids"]
        assert (L.min().item(), L.max().item()) == (row["completions/min_length"], row["completions/max_length"])  # TRL's own counts
        assert L.mean().item() == pytest.approx(row["completion_length"], rel=1e-5)
        for i in range(len(r)):  # the length-weighted baseline, as a loop
            js = [j for j in range(len(r)) if int(g[j]) == int(g[i])]
            base = sum(float(L[j]) * float(r[j]) for j in js) / sum(float(L[j]) for j in js)
            assert call["out"][i].item() == pytest.approx(float(r[i]) - base, abs=1e-5)


def test_remax_baseline_is_the_greedy_completion_reward(monkeypatch, fast_overrides, tiny_model_path, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mixrl.rewards import builtin
    from mixrl.trainer.parts.remax_baseline import RemaxBaseline

    seen = []
    original = RemaxBaseline.greedy_rewards

    def spy(self, policy, generation_config, out, inputs, group_ids):
        b, metrics = original(self, policy, generation_config, out, inputs, group_ids)
        seen.append((out["prompt_ids"].clone(), out["prompt_mask"].clone(), b.clone()))
        return b, metrics

    monkeypatch.setattr(RemaxBaseline, "greedy_rewards", spy)
    # the barely trained tiny model answers nothing right: score the text itself, so that greedy
    # completions that differ get different rewards (the run's reward functions see this score)
    monkeypatch.setattr(builtin, "_exact_score", lambda text, gold, *, marker: float(len(text.strip()) % 5))
    calls = _record(monkeypatch, "remax")
    _train(["algo=remax", *fast_overrides])
    assert len(calls) == 2 and len(seen) == 2
    for call in calls:
        assert torch.equal(call["out"], call["rewards"] - call["baseline_rewards"])
    ids, mask, baseline = seen[0]  # step 1 runs the start model: regenerate greedily here
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    with torch.no_grad():
        seq = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=24,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    texts = tok.batch_decode(seq[:, ids.shape[1]:], skip_special_tokens=True)
    expected = [float(len(t.strip()) % 5) for t in texts]
    assert baseline.tolist() == pytest.approx(expected)
    assert len(set(expected)) > 1  # the check can tell completions apart
    groups = baseline.view(-1, 4)  # algo.num_generations=4: one greedy completion per prompt
    assert bool((groups == groups[:, :1]).all())


GRPO_SPLIT = ["algo=luffy", "algo.advantage.name=grpo", "algo.advantage_include_offpolicy=false"]  # LUFFY's adv_estimator=grpo_split


def test_grpo_split_trains_with_luffys_number_for_an_expert_row_beside_equal_rollouts(monkeypatch, fast_overrides):
    # LUFFY's compute_grpo_outcome_advantage_split (ElliottYan/LUFFY @ 01f4ae06,
    # luffy/verl/verl/mix_src/mix_core_alg.py): on-policy statistics, std 0 -> 1. The tiny model
    # fails most problems, so some groups' rollouts all get 0 while their expert row gets 1: before
    # mixrl divided by 1 there, those rows got 1e6 and the magnitude guard stopped this run.
    calls = _record(monkeypatch, "grpo")
    _train([*GRPO_SPLIT, *fast_overrides])
    assert len(calls) == 2
    flat_cases = 0
    for call in calls:
        r, g, inc, out = call["rewards"].tolist(), call["group_ids"].tolist(), call["include"].tolist(), call["out"]
        for gid in set(g):
            rows = [i for i in range(len(r)) if g[i] == gid]
            on = [r[i] for i in rows if inc[i]]
            if len(on) < 2 or max(on) != min(on):
                continue
            for i in rows:  # LUFFY's (s - mean) / (1 + 1e-6), by hand
                assert out[i].item() == pytest.approx((r[i] - on[0]) / (1 + 1e-6), abs=1e-6)
                flat_cases += (not inc[i]) and r[i] != on[0]
        assert out.abs().max().item() <= 1000.0
    assert flat_cases >= 1, "no expert row beside all-equal rollouts in these 2 steps: the case is not exercised"


def test_an_advantage_above_its_bound_stops_the_run_with_one_line(fast_overrides, tmp_path):
    from pathlib import Path

    from typer.testing import CliRunner

    from mixrl.cli.main import app

    res = CliRunner().invoke(app, ["train", *GRPO_SPLIT, *fast_overrides, "trainer.save_steps=0", "trainer.max_abs_advantage=0.5"])
    assert res.exit_code == 3, res.output[-2000:]
    assert "Traceback" not in res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, res.stderr
    line = lines[0]
    assert "training diverged at step 1: the advantage of" in line and "row" in line and "group" in line
    assert "above trainer.max_abs_advantage=0.5" in line and "raise trainer.max_abs_advantage" in line
    assert "no checkpoint was saved" in line  # tripped in step 1: nothing finished to save
    run_dir = Path([o for o in fast_overrides if o.startswith("run_dir=")][0].split("=", 1)[1])
    assert "diverged" in (run_dir / "FAILED").read_text()


@pytest.mark.slow
def test_mt_grpo_gets_each_turns_reward_and_turn_ids(monkeypatch, tiny_bpe_model_path, tmp_path):
    """env=arith_retry with algo.advantage.name=mt_grpo, 2 steps: the estimator receives the
    episodes' turn rewards and the tokens' turns, its per-token advantages differ between the turns
    of a multi-turn row (observation tokens 0), and the logged turn/advantage_first_minus_last is
    the mean of first minus last turn over the multi-turn rows of the step (by hand)."""
    from mixrl.core.turn_advantages import per_turn_advantages
    from mixrl.envs import arith_retry

    # the barely trained model answers nothing right: call an answer correct by its text's length, so
    # that the turns' rewards differ within a group (the environment's own rewards, +1 / -0.5)
    monkeypatch.setattr(arith_retry, "verify", lambda action, answer: len(action.strip()) % 3 == 0)
    calls = _record(monkeypatch, "mt_grpo")
    _train(["env=arith_retry", "algo=grpo", "algo.advantage.name=mt_grpo", f"model.path={tiny_bpe_model_path}",
            "trainer.max_steps=2", "trainer.prompts_per_step=4", "algo.num_generations=4", "trainer.eval_size=0",
            "trainer.max_completion_length=40", "data.train_size=32", "hardware.torch_threads=1", "seed=0",
            "logger.progress=false", f"run_dir={tmp_path / 'run'}"])
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "turn/multi_turn_rows" in r]
    assert len(calls) == 2 and len(rows) == 2
    differ = 0
    for call, row in zip(calls, rows):
        tr, ids, adv = call["turn_rewards"], call["turn_ids"], call["out"]
        assert tr.shape[0] == call["rewards"].shape[0] == adv.shape[0] and adv.shape == ids.shape
        has = ~torch.isnan(tr)
        assert torch.allclose(torch.nan_to_num(tr).sum(1), call["rewards"])  # the reward is the return
        assert (adv[ids < 0] == 0).all()  # observation tokens (and padding past the rows) get nothing
        firsts, lasts = [], []
        for i in range(tr.shape[0]):
            k = int(has[i].sum())
            if k < 2:
                continue
            first, last = adv[i][ids[i] == 0], adv[i][ids[i] == k - 1]
            assert first.numel() and last.numel() and (first == first[0]).all()
            firsts.append(float(first[0]))
            lasts.append(float(last[0]))
            differ += int(abs(firsts[-1] - lasts[-1]) > 1e-6)
        assert row["turn/multi_turn_rows"] == pytest.approx(len(firsts) / tr.shape[0])
        if firsts:
            assert row["turn/advantage_first_minus_last"] == pytest.approx(sum(f - l for f, l in zip(firsts, lasts)) / len(firsts), abs=1e-5)
        per_turn = per_turn_advantages(call["rewards"], call["group_ids"], tr)  # the formula's values, per turn
        for i, k in has.nonzero().tolist():
            tokens = adv[i][ids[i] == k]
            assert torch.allclose(tokens, per_turn[i, k].expand_as(tokens), atol=1e-6)
    assert differ > 0  # some row's turns got different advantages
