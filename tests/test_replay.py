"""The replay source: buffer policy, injections on hand-made batches, the ratio replayed tokens
get, and end to end: stored behaviour log-probs equal a direct forward of the policy that
sampled them (fresh and lagged weights), and a resumed run continues with the same buffer."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from mixrl.config.compose import compose_config
from mixrl.core import provenance as prov
from mixrl.core.objective import Objective, TermSpec, compute_objective
from mixrl.errors import ConfigError
from mixrl.sources import InjectContext
from mixrl.sources.replay import REPLAY, ReplaySource
from mixrl.sources.replay_buffer import Entry, ReplayBuffer
from mixrl.sources.replay_inject import ReplayAppend, ReplayFill


def _e(reward=0.0, step=0, prompt=(1, 2), completion=(3, 4), mean=0.5, std=0.5, adv=0.0):
    return Entry(list(prompt), list(completion), [-0.1 * (k + 1) for k in range(len(completion))], reward, adv, mean,
                 std, step)


class _Tok:
    eos_token_id, pad_token_id = 0, 0


def _ctx(step=5, G=4, process_index=0, num_processes=1, batch=None):
    return InjectContext(
        tokenizer=_Tok(), process_index=process_index, num_processes=num_processes, num_generations=G,
        max_completion_length=8, global_step=step, micro_step=0, device=torch.device("cpu"),
        tokenize_prompts=lambda ps: ps, gather=lambda t: t, batch=batch,
    )


# --------------------------------------------------------------------------- buffer policy
def test_fifo_evicts_the_oldest():
    b = ReplayBuffer(capacity=3, eviction="fifo")
    for s in range(5):
        b.add(_e(step=s))
    assert [e.step for e in b.entries] == [2, 3, 4]


def test_keep_successes_evicts_the_oldest_failure_first():
    b = ReplayBuffer(capacity=3, eviction="keep_successes")
    for s, r in enumerate([1.0, 0.0, 1.0, 0.0, 1.0]):
        b.add(_e(reward=r, step=s))
    # step 1 (failure) goes first, then step 3 (failure); successes 0, 2, 4 stay
    assert [e.step for e in b.entries] == [0, 2, 4]
    b.add(_e(reward=1.0, step=5))  # only successes left: the oldest goes
    assert [e.step for e in b.entries] == [2, 4, 5]


def test_age_eviction_and_store_successes():
    b = ReplayBuffer(capacity=10, eviction="age", max_age=2)
    for s in range(5):
        b.add(_e(step=s))
    assert b.expire(5) == 3 and [e.step for e in b.entries] == [3, 4]
    s = ReplayBuffer(store="successes")
    assert not s.add(_e(reward=0.0)) and s.add(_e(reward=1.0)) and len(s) == 1
    with pytest.raises(ConfigError, match="max_age"):
        ReplayBuffer(eviction="age")
    with pytest.raises(ConfigError, match="sampling"):
        ReplayBuffer(sampling="nope")


def test_recent_takes_the_newest_and_draws_are_distinct():
    b = ReplayBuffer(sampling="recent")
    for s in range(6):
        b.add(_e(step=s))
    assert [e.step for e in b.sample(3)] == [5, 4, 3]
    u = ReplayBuffer(sampling="uniform", seed=3)
    for s in range(6):
        u.add(_e(step=s))
    picks = u.sample(6)
    assert sorted(e.step for e in picks) == list(range(6))  # without replacement
    assert len(u.sample(10)) == 6


def test_prioritised_sampling_follows_the_weights():
    """variance: weight std + 1e-3; a std-0 entry against a std-1 entry is drawn first with
    probability 1e-3 / (1 + 2e-3); failure: weight 1 - mean + 1e-3."""
    b = ReplayBuffer(sampling="variance", seed=0)
    b.add(_e(std=0.0, step=0))
    b.add(_e(std=1.0, step=1))
    first = [b.sample(1)[0].step for _ in range(2000)]
    assert first.count(1) / 2000 > 0.99
    f = ReplayBuffer(sampling="failure", seed=0)
    f.add(_e(mean=1.0, step=0))  # solved prompt
    f.add(_e(mean=0.25, step=1))  # mostly failed prompt
    share = [f.sample(1)[0].step for _ in range(4000)].count(1) / 4000
    assert share == pytest.approx(0.751 / 0.752, abs=0.01)  # Efraimidis-Spirakis: P(first) = w / sum w


def test_state_dict_round_trip_continues_the_same_draws():
    a = ReplayBuffer(seed=7)
    for s in range(20):
        a.add(_e(step=s))
    a.sample(5)
    state = json.loads(json.dumps(a.state_dict()))  # plain data (also what torch.save stores)
    b = ReplayBuffer(seed=99)
    b.load_state_dict(state)
    assert [e.step for e in a.sample(5)] == [e.step for e in b.sample(5)]
    assert [e.step for e in a.entries] == [e.step for e in b.entries] and a.added == b.added


# --------------------------------------------------------------------------- injections
def _batch(n=8, width=3, rewards=None):
    return {
        "prompt_ids": torch.tensor([[0, 1, 2]] * n), "prompt_mask": torch.tensor([[0, 1, 1]] * n),
        "completion_ids": torch.full((n, width), 7), "completion_mask": torch.ones(n, width, dtype=torch.long),
        "advantages": torch.zeros(n), "row_source": torch.full((n,), prov.ON_POLICY),
        "token_source": torch.full((n, width), prov.ON_POLICY), "behaviour_logp": torch.full((n, width), float("nan")),
        "group_id": torch.arange(n) // 4, "old_per_token_logps": torch.full((n, width), -0.5),
        "mixrl_reward": torch.zeros(n) if rewards is None else rewards,
        "mixrl_group_mean": torch.zeros(n), "mixrl_group_std": torch.zeros(n),
    }


def test_record_stores_rollout_rows_with_their_behaviour_logps():
    src = ReplaySource(capacity=10)
    batch = _batch(n=2, width=3)
    batch["completion_mask"][1, 2] = 0  # a shorter row
    batch["mixrl_reward"] = torch.tensor([1.0, 0.0])
    batch["advantages"] = torch.tensor([0.5, -0.5])
    batch["row_source"][1] = prov.EXPERT  # not a rollout: not stored
    old = torch.tensor([[-0.1, -0.2, -0.3], [-0.4, -0.5, -0.6]])
    assert src.record(_ctx(step=3), batch, old) == 1
    e = src.buffer.entries[0]
    assert e.prompt == [1, 2] and e.completion == [7, 7, 7] and e.logp == pytest.approx([-0.1, -0.2, -0.3])
    assert (e.reward, e.advantage, e.step) == (1.0, 0.5, 3)


def test_replay_append_adds_rows_with_stored_logps_and_advantages():
    from mixrl.config.geometry import Geometry

    geom = Geometry(2, 4, 8, 1, 8, 1, 8, expert_rows_per_step=2)
    src = ReplaySource(sampling="recent")
    src.buffer.add(_e(step=1, completion=(5, 6, 7, 8), adv=0.7))
    src.buffer.add(_e(step=2, completion=(9,), adv=-0.3))
    src.buffer.add(_e(step=5, completion=(9,), adv=1.0))  # this step's: too young (min_age 1)
    inj = ReplayAppend(ratio=0.2, source=src, geometry=geom)
    out = inj.after_advantages(_ctx(step=5), [], _batch())
    assert out["completion_ids"].shape == (10, 4)
    assert out["row_source"][8:].tolist() == [REPLAY, REPLAY]
    assert out["token_source"][8].tolist() == [REPLAY, -1, -1, -1] and out["token_source"][9].tolist() == [REPLAY] * 4
    assert out["behaviour_logp"][9].tolist() == pytest.approx([-0.1, -0.2, -0.3, -0.4])
    assert out["behaviour_logp"][8, 0] == pytest.approx(-0.1) and torch.isnan(out["behaviour_logp"][8, 1:]).all()
    assert out["advantages"][8:].tolist() == pytest.approx([-0.3, 0.7])  # recent first: step 2, then step 1
    assert torch.isnan(out["old_per_token_logps"][8:]).all() and torch.isnan(out["mixrl_reward"][8:]).all()
    assert out["group_id"][8:].tolist() == [-1, -1]
    inj.until_step = 5  # reincarnated: nothing more
    assert inj.after_advantages(_ctx(step=5), [], _batch())["completion_ids"].shape[0] == 8


def test_replay_fill_refills_uniform_groups_with_differing_past_rollouts():
    """Two groups of 4: group 0 all failed (0), group 1 mixed. The buffer holds a past success
    of the prompt (longer than the batch width) and a past failure: only the success may fill."""
    src = ReplaySource(sampling="uniform")
    src.buffer.add(_e(reward=1.0, step=1, completion=(4, 4, 4, 4, 4)))
    src.buffer.add(_e(reward=0.0, step=2))
    inj = ReplayFill(per_group=2, source=src)
    batch = _batch()
    rewards = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    new = inj.after_rewards(_ctx(batch=batch), [], rewards)
    assert new.tolist() == [0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0]  # one candidate: only the last slot
    assert batch["row_source"].tolist() == [prov.ON_POLICY] * 3 + [REPLAY] + [prov.ON_POLICY] * 4
    assert batch["completion_ids"].shape == (8, 5) and batch["completion_ids"][3].tolist() == [4] * 5
    assert batch["completion_mask"][0].tolist() == [1, 1, 1, 0, 0] and batch["completion_mask"][3].tolist() == [1] * 5
    assert batch["token_source"][3].tolist() == [REPLAY] * 5 and batch["token_source"][0, 3:].tolist() == [-1, -1]
    assert batch["behaviour_logp"][3].tolist() == pytest.approx([-0.1, -0.2, -0.3, -0.4, -0.5])
    assert torch.isnan(batch["old_per_token_logps"][3]).all() and batch["old_per_token_logps"][0, 0] == -0.5
    assert inj.metrics["replay/groups_filled"] == 1.0

    only_failed = ReplayFill(per_group=1, fill="failed", source=src)
    batch = _batch()
    allwin = torch.ones(8)  # every group succeeded: fill=failed leaves them alone
    assert only_failed.after_rewards(_ctx(batch=batch), [], allwin).tolist() == [1.0] * 8
    assert (batch["row_source"] == prov.ON_POLICY).all()


def test_revisit_brings_back_prompts_the_buffer_can_fill():
    """revisit 0.5 of 2 local groups (G = 4): the last group's 4 rows get a remembered prompt
    with a stored success (fill=failed ignores prompts with failures only)."""
    src = ReplaySource(sampling="recent")
    src.buffer.add(_e(reward=1.0, step=1, prompt=(1, 2)))
    src.buffer.add(_e(reward=0.0, step=2, prompt=(5, 6)))
    src.rows = {(1, 2): {"prompt": "p12", "answer": "3"}, (5, 6): {"prompt": "p56", "answer": "11"}}
    inj = ReplayFill(fill="failed", revisit=0.5, source=src)
    inputs = [{"prompt": f"x{i // 4}", "answer": "0"} for i in range(8)]
    new = inj.before_generation(_ctx(step=5), inputs)
    assert [r["prompt"] for r in new] == ["x0"] * 4 + ["p12"] * 4 and new[4]["answer"] == "3"
    assert inputs[4]["prompt"] == "x1"  # the caller's list is not changed
    # remembered rows survive a checkpoint
    back = ReplaySource()
    back.load_state_dict(json.loads(json.dumps(src.state_dict())))
    assert back.rows == src.rows
    src.buffer.add(_e(reward=1.0, step=2, prompt=(5, 6)))
    # a group straddling two processes is never revisited: process 1 of 2 with 6 rows and G = 4
    inj2 = ReplayFill(revisit=1.0, source=src)
    rows6 = [{"prompt": "y"} for _ in range(6)]
    assert [r["prompt"] for r in inj2.before_generation(_ctx(process_index=1, num_processes=2), rows6)] == ["y"] * 2 + ["p56"] * 4  # recent first


def test_replay_injections_need_the_replay_source():
    with pytest.raises(ConfigError, match="offpolicy=replay"):
        compose_config(["algo=remix", "offpolicy=expert", "data.expert_column=answer"])
    cfg = compose_config(["algo=remix"])
    assert cfg.offpolicy.source.name == "replay"


# --------------------------------------------------------------------------- the ratio on replayed tokens
def test_policy_term_divides_replayed_tokens_by_their_stored_logps():
    """ppo_clip on replay tokens: r = exp(logp - stored), l = max(-A r, -A clip(r, 0.8, 1.2)),
    token-mean over the term's tokens. Hand values: logp = log 0.5 on both tokens, stored
    log-probs log 0.4 and log 0.25: r = 1.25 (clipped, A > 0) and 2.0 (clipped); A = 1 ->
    l = -1.2 and -1.2, gradient 0; with A = -1: l = max(1.25, 0.8*...)= 1.25 and 2.0, grads r."""
    obj = Objective([TermSpec("replay", "policy", ("replay",), params={"loss": {"name": "ppo_clip"}})])
    logp = torch.full((1, 2), math.log(0.5), requires_grad=True)
    stored = torch.tensor([[math.log(0.4), math.log(0.25)]])
    ts = torch.full((1, 2), REPLAY)
    for adv, want, grad in ((1.0, -1.2, [0.0, 0.0]), (-1.0, (1.25 + 2.0) / 2, [1.25 / 2, 2.0 / 2])):
        logp.grad = None
        loss, metrics = compute_objective(obj, logp=logp, mask=torch.ones(1, 2), advantages=torch.tensor([adv]),
                                          token_source=ts, behaviour_logp=stored,
                                          old_logp=torch.zeros(1, 2))  # old_logp is the rollouts', never replay's
        loss.backward()
        assert float(loss) == pytest.approx(want)
        assert logp.grad[0].tolist() == pytest.approx(grad)
    assert metrics["replay/ratio/max"] == pytest.approx(2.0) and metrics["replay/ratio/mean"] == pytest.approx(1.625)
    assert metrics["replay/ratio/m2"] == pytest.approx((math.log(1.25) ** 2 + math.log(2.0) ** 2) / 2)
    assert metrics["replay/ratio/ess"] == pytest.approx(3.25 ** 2 / (2 * (1.25 ** 2 + 4.0)))


def test_a_ratio_on_a_replayed_token_without_stored_logp_is_an_error():
    obj = Objective([TermSpec("replay", "policy", ("replay",), params={"loss": {"name": "ppo_clip"}})])
    stored = torch.tensor([[-0.1, float("nan")]])
    with pytest.raises(ValueError, match="no behaviour log-prob"):
        compute_objective(obj, logp=torch.zeros(1, 2), mask=torch.ones(1, 2), advantages=torch.ones(1),
                          token_source=torch.full((1, 2), REPLAY), behaviour_logp=stored)
    # padding beyond the mask is never read
    loss, _ = compute_objective(obj, logp=torch.zeros(1, 2), mask=torch.tensor([[1, 0]]), advantages=torch.ones(1),
                                token_source=torch.full((1, 2), REPLAY), behaviour_logp=stored)
    assert math.isfinite(float(loss))


# --------------------------------------------------------------------------- end to end
def _direct_logps(model_dir: str, entries: list[dict], temperature: float = 1.0) -> list[list[float]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    out = []
    with torch.no_grad():
        for e in entries:
            ids = torch.tensor([e["prompt"] + e["completion"]])
            logits = model(ids).logits[0, len(e["prompt"]) - 1: -1] / temperature
            lp = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(e["completion"]).unsqueeze(-1)).squeeze(-1)
            out.append(lp.tolist())
    return out


def _buffer(ckpt: Path) -> dict:
    state = json.loads((ckpt / "mixrl_state.json").read_text())
    assert state["injections"] == [{"state_file": "mixrl_injection0"}]
    return torch.load(ckpt / "mixrl_injection0_rank0.pt", weights_only=True)["buffer"]


PARITY_REWARD = """
def parity_reward(prompts, completions, **kwargs):
    return [float(len(c) % 2) for c in completions]
"""


def _parity(tmp_path: Path) -> str:
    """A reward with variance even for the barely trained test model: 1 for odd-length completions."""
    path = tmp_path / "parity_reward.py"
    path.write_text(PARITY_REWARD)
    return f"reward.name={path}:parity_reward"


@pytest.mark.slow
def test_stored_logps_equal_a_forward_of_the_sampling_policy_fresh_and_lagged(fast_overrides, tiny_model_path, tmp_path):
    """remix with staleness 1, 3 steps, 2 micro-batches per step, a checkpoint every step:
    rollouts of steps 0 and 1 were sampled by the initial weights, those of step 2 by the
    weights after step 1 (checkpoint-1): each stored log-prob must equal a direct forward of
    that model (the second micro-batch of a step included: the weights move only after it)."""
    from mixrl.trainer.run import train

    cfg = compose_config([*fast_overrides, _parity(tmp_path), "algo=remix", "trainer.max_steps=3", "trainer.staleness=1",
                          "trainer.save_steps=1", "trainer.save_total_limit=5", "trainer.eval_size=0",
                          "trainer.learning_rate=2e-3"])  # weights that visibly move each step
    result = train(cfg)
    run = Path(result.run_dir) / "trainer"
    entries = _buffer(run / "checkpoint-3")["entries"]
    assert sorted({e["step"] for e in entries}) == [0, 1, 2] and len(entries) == 3 * 16
    by_model = {0: tiny_model_path, 1: tiny_model_path, 2: str(run / "checkpoint-1")}
    worst = 0.0
    for step, path in by_model.items():
        es = [e for e in entries if e["step"] == step]
        for e, direct in zip(es, _direct_logps(path, es)):
            worst = max(worst, max(abs(a - b) for a, b in zip(e["logp"], direct)))
    assert worst < 2e-5, worst
    # and the lagged weights are not those of the step itself (the check has teeth)
    es = [e for e in entries if e["step"] == 2][:4]
    now = _direct_logps(str(run / "checkpoint-2"), es)
    assert max(abs(a - b) for e, d in zip(es, now) for a, b in zip(e["logp"], d)) > 1e-3
    rows = [json.loads(line) for line in (Path(result.run_dir) / "metrics.jsonl").read_text().splitlines()]
    assert [r["staleness"] for r in rows] == [0.0, 1.0, 1.0]
    assert rows[-1]["replay/rows"] > 0 and "replay/ratio/ess" in rows[-1]


@pytest.mark.slow
def test_a_resumed_run_continues_with_the_same_buffer(fast_overrides, tmp_path):
    from typer.testing import CliRunner

    from mixrl.cli.main import app

    runner = CliRunner()
    base = [o for o in fast_overrides if not o.startswith("run_dir=")] + [
        "algo=remix", "trainer.save_steps=2", "trainer.save_total_limit=5", "trainer.eval_size=0", _parity(tmp_path)]
    full = runner.invoke(app, ["train", *base, "trainer.max_steps=4", f"run_dir={tmp_path / 'full'}"])
    assert full.exit_code == 0, full.output[-2000:]
    half = runner.invoke(app, ["train", *base, "trainer.max_steps=2", f"run_dir={tmp_path / 'half'}"])
    assert half.exit_code == 0, half.output[-2000:]
    resumed = runner.invoke(app, ["train", f"resume={tmp_path / 'half'}", "trainer.max_steps=4", "logger.progress=false",
                                  "hardware.torch_threads=1", "--trust-run-code"])  # the run names a reward file
    assert resumed.exit_code == 0, resumed.output[-2000:]
    a = _buffer(tmp_path / "full" / "trainer" / "checkpoint-4")
    b = _buffer(tmp_path / "half" / "trainer" / "checkpoint-4")
    assert a["added"] == b["added"] == 64 and a["rng"] == b["rng"]
    for x, y in zip(a["entries"], b["entries"]):
        assert (x["completion"], x["step"], x["reward"]) == (y["completion"], y["step"], y["reward"])
        assert x["logp"] == pytest.approx(y["logp"], abs=1e-5)
    rows = lambda d: [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    ra, rb = rows(tmp_path / "full"), rows(tmp_path / "half")
    assert [r["step"] for r in rb] == [1, 2, 3, 4]
    for x, y in zip(ra, rb):
        assert y["loss"] == pytest.approx(x["loss"], abs=1e-6) and y.get("loss/replay") == pytest.approx(x.get("loss/replay"), abs=1e-6)


# --------------------------------------------------------------------------- validation
def test_staleness_and_kl_convex_are_validated_when_composed(tmp_path):
    from mixrl.trainer.build import grpo_args

    with pytest.raises(ConfigError, match="use_vllm"):
        compose_config(["trainer.staleness=4", "hardware.use_vllm=true"])
    with pytest.raises(ConfigError, match="trainer.staleness must be >= 0"):
        compose_config(["trainer.staleness=-1"])
    convex = "+algo.terms.kl_convex={name: kl_convex, tokens: [on_policy, replay], weight: 0.01, lam: 0.5}"
    with pytest.raises(ConfigError, match="rollout tokens only"):
        compose_config(["algo=remix", convex])
    cfg = compose_config(["algo=remix", convex.replace("on_policy, replay", "on_policy")])
    assert float(cfg.algo.kl.coef) == 0.0 and grpo_args(cfg, tmp_path).beta == 1.0  # TRL computes reference log-probs
    assert grpo_args(compose_config(["algo=remix"]), tmp_path).beta == 0.0
    from mixrl.explain.render import explain_lines

    rows = dict(explain_lines(compose_config(["recipe=m2po_stale/arith-tiny"])))
    assert "16 optimizer steps earlier" in rows["staleness"]
    assert "staleness" not in dict(explain_lines(compose_config(["algo=m2po"])))
