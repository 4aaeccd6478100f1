"""PPO with a learned critic (algo=ppo): dense rewards through the reward check and into GAE's
token rewards, the critic's loss mask with expert rows, validation, and exact resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_resume_methods import _args, _assert_same_run, _resume, _stop_after_checkpoint, _Stop
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.core import provenance as prov
from mixrl.errors import RewardError
from mixrl.rewards.registry import CheckedReward
from mixrl.trainer.parts.critic import Critic
from mixrl.trainer.state.checkpoint_state import CRITIC_FILE

runner = CliRunner()


def _dense(prompts, completions, completion_ids, **kw):
    # row 0: dense (one value per token), row 1: a plain float
    return [[0.5] + [0.0] * (len(completion_ids[0]) - 2) + [1.0], 2.0]


def test_a_dense_reward_is_checked_summed_and_kept_per_token():
    fn = CheckedReward(_dense, "dense")
    out = fn(prompts=["a", "b"], completions=["xyz", "uv"], completion_ids=[[5, 6, 7], [8, 9]])
    assert out == [1.5, 2.0]  # the outcome (group advantages) sees the sum
    assert fn.last_dense == {0: [0.5, 0.0, 1.0]}
    with pytest.raises(RewardError, match="returned 3 per-token rewards for a completion of 4 tokens"):
        CheckedReward(lambda prompts, completions, completion_ids, **k: [[1.0, 0.0, 0.0], 1.0], "bad")(
            prompts=["a", "b"], completions=["x", "y"], completion_ids=[[1, 2, 3, 4], [1]])


def test_token_rewards_put_dense_values_on_their_tokens_and_the_rest_on_the_last_token():
    """GAE (gamma = lam = 1, no whitening, values 0) gives A_t = sum of the rewards from t on."""
    fn = CheckedReward(_dense, "dense")
    rewards = fn(prompts=["a", "b"], completions=["xyz", "uv"], completion_ids=[[5, 6, 7], [8, 9]])
    critic = Critic(None, None, {}, advantage_params={"gamma": 1.0, "lam": 1.0, "whiten": False}, include_offpolicy=True,
                    reward_funcs=[fn], reward_weights=torch.tensor([2.0]), batch_size=2)
    critic.values = lambda out, bs=None: torch.zeros(2, 4)
    out = {"completion_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]), "row_source": torch.tensor([prov.ON_POLICY, prov.EXPERT]),
           "token_source": torch.tensor([[prov.ON_POLICY] * 4, [prov.EXPERT] * 4])}
    weighted = torch.tensor(rewards) * 2.0  # what the trainer hands over: sum over functions of weight x reward
    critic.advantages(out, weighted)
    # row 0: token rewards 2 x [0.5, 0, 1]; row 1 (no dense): 4.0 on its last token
    assert out["advantages"].tolist() == [[3.0, 2.0, 2.0, 0.0], [4.0, 4.0, 0.0, 0.0]]
    assert out["returns"].tolist() == out["advantages"].tolist()  # values 0
    assert out["critic_mask"].tolist() == [[True, True, True, False], [False] * 4]  # expert tokens: no value target


def _critic_starts_at(monkeypatch, value: float) -> None:
    """V = ``value`` everywhere before the first critic step (its head's weight starts at 0): the
    tiny test model earns no reward in a few steps, and a critic started at 0 would never move."""
    setup = Critic.from_policy.__func__

    def setup_with_bias(cls, cfg, **kwargs):
        critic = setup(cls, cfg, **kwargs)
        torch.nn.init.constant_(critic.model.head.bias, value)
        return critic

    monkeypatch.setattr(Critic, "from_policy", classmethod(setup_with_bias))


def test_expert_rows_get_values_but_no_value_loss(fast_overrides, monkeypatch):
    seen = []
    train = Critic.train_step

    def spy(self, inputs):
        seen.append({k: inputs[k].clone() for k in ("critic_mask", "completion_mask", "row_source", "old_values", "advantages")})
        return train(self, inputs)

    monkeypatch.setattr(Critic, "train_step", spy)
    _critic_starts_at(monkeypatch, 0.5)
    res = runner.invoke(app, ["train", *fast_overrides, "algo=ppo", "offpolicy=expert", "algo.inject.name=group_replace",
                              "+algo.inject.per_group=1", "+algo.terms.offpolicy={name: shaped, tokens: [expert]}",
                              "trainer.eval_size=0"])
    assert res.exit_code == 0, res.output[-3000:]
    expert_rows = on_rows = 0
    for b in seen:
        expert = b["row_source"] == prov.EXPERT
        mask = b["completion_mask"].bool()
        assert not b["critic_mask"][expert].any()
        assert torch.equal(b["critic_mask"][~expert], mask[~expert])
        assert b["advantages"].shape == mask.shape  # per-token GAE advantages, expert rows included
        expert_rows += int(expert.sum())
        on_rows += int((~expert).sum())
    assert expert_rows > 0 and on_rows > 0
    first = seen[0]  # the critic valued every token of the first generation batch, expert ones included
    assert torch.equal(first["old_values"][first["completion_mask"].bool()], torch.full_like(first["old_values"][first["completion_mask"].bool()], 0.5))
    # the sample log shows a per-token (GAE) advantage as the mean over the row's completion tokens
    logged = [json.loads(x) for x in (Path(fast_overrides[-1].split("=", 1)[1]) / "samples.jsonl").read_text().splitlines()]
    train_rows = [r for r in logged if r["split"] == "train"]
    assert train_rows and all(isinstance(r["advantage"], float) for r in train_rows)


@pytest.mark.parametrize("overrides,message", [
    (["algo=grpo", "algo.advantage.name=gae"], "needs a learned critic"),
    (["algo=ppo", "algo.advantage.name=grpo"], "used by the gae advantage only"),
    (["algo=ppo", "algo.critic.value_clip=-1"], "algo.critic.value_clip=-1 is out of range"),
    (["algo=ppo", "algo.advantage.lam=2"], "lam"),
    (["algo=ppo", "hardware.num_processes=2"], "one process"),
    (["algo=chord", "algo.advantage.name=gae", "+algo.critic={lr: 1e-5}"], "adds rows after the advantages"),
])
def test_bad_critic_configs_exit_2_with_one_line(overrides, message):
    res = runner.invoke(app, ["config", "show", *overrides])
    assert res.exit_code == 2, res.output
    assert message in res.output and len(res.output.strip().splitlines()) == 1, res.output


@pytest.mark.slow  # kill-and-resume, two runs (5 CPU-s): make test-slow
def test_ppo_interrupted_after_a_checkpoint_then_resumed_ends_with_identical_weights_and_critic(fast_overrides, tmp_path, monkeypatch):
    extra = ["algo=ppo", "trainer.save_steps=2", "algo.critic.lr=1e-3"]
    _critic_starts_at(monkeypatch, 0.5)
    full = runner.invoke(app, _args(fast_overrides, tmp_path / "full", extra))
    assert full.exit_code == 0, full.output[-3000:]
    with monkeypatch.context() as m, pytest.raises(_Stop):
        _stop_after_checkpoint(m, 2)
        runner.invoke(app, _args(fast_overrides, tmp_path / "cut", extra))
    assert (tmp_path / "cut" / "trainer" / "checkpoint-2" / CRITIC_FILE).is_file()
    _resume(tmp_path / "cut")
    _assert_same_run(tmp_path / "full", tmp_path / "cut")
    rows = lambda d: [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    losses = [[r["critic/value_loss"] for r in rows(tmp_path / d)] for d in ("full", "cut")]
    assert losses[0] == losses[1] and len(set(losses[0])) > 1
    ca, cb = (torch.load(Path(tmp_path / d / "trainer" / "checkpoint-4" / CRITIC_FILE), weights_only=True) for d in ("full", "cut"))
    assert all(torch.equal(ca["model"][k], cb["model"][k]) for k in ca["model"])
    assert not torch.equal(ca["model"]["head.weight"], torch.zeros_like(ca["model"]["head.weight"]))  # it trained


def test_replay_fill_trains_with_the_critic_and_replay_append_is_refused(fast_overrides, monkeypatch):
    """replay_fill puts past rollouts in place before scoring (they get values like any row; the
    buffer stores a per-token advantage as its mean); replay_append adds rows after the advantages."""
    seen = []
    train = Critic.train_step

    def spy(self, inputs):
        seen.append({k: inputs[k].clone() for k in ("critic_mask", "completion_mask", "token_source")})
        return train(self, inputs)

    monkeypatch.setattr(Critic, "train_step", spy)
    common = ["algo=ppo", "offpolicy=replay", "+algo.terms.experience={name: policy, tokens: [replay]}"]
    res = runner.invoke(app, ["train", *fast_overrides, *common, "algo.inject.name=replay_append", "trainer.eval_size=0"])
    assert res.exit_code == 2 and "adds rows after the advantages" in res.output
    res = runner.invoke(app, ["train", *fast_overrides, *common, "algo.inject.name=replay_fill", "trainer.max_steps=3",
                              "trainer.eval_size=0"])
    assert res.exit_code == 0, res.output[-3000:]
    assert seen
    for b in seen:  # the critic trains on on-policy tokens only, whatever the replay put in the batch
        assert torch.equal(b["critic_mask"], b["completion_mask"].bool() & (b["token_source"] == prov.ON_POLICY))
