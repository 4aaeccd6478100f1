"""Stateful multi-turn environments (mixrl.envs): hand-written episodes (completion, mask, turn
ids, rewards, return), the built-in arith_retry's per-turn rewards, hostile and odd actions as
observations, the chat template's observation turn, the config's refusals, and one training
step through TRL's rollout_func."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from mixrl.core import provenance as prov
from mixrl.envs import ENVIRONMENTS, MAX_OBSERVATION_CHARS, Step, register, resolve_env, safe_step
from mixrl.envs.arith_retry import NO_ANSWER, WRONG, WRONG_REWARD
from mixrl.envs.episodes import observation_suffix, run_episodes
from mixrl.sources.base import Rollouts
from mixrl.trainer.parts.batch_fields import provenance_fields

EOS = 99
OBS = [50, 51]  # the observation turn's ids (any observation), in the hand-written episodes


def _scripted(turns: list[list[list[int]]]):
    """generate(): the k-th call returns turns[k] (one list of ids per running episode), log-probs -0.1 each."""
    calls = iter(turns)

    def generate(histories):
        out = next(calls)
        assert len(out) == len(histories)
        return out, [[-0.1] * len(ids) for ids in out]

    return generate


class Answers:
    """Correct iff the action is the text 'ok'; the observation names the turn."""

    def __init__(self):
        self.turn = 0

    def reset(self, problem):
        return None

    def step(self, action):
        self.turn += 1
        return Step(f"turn {self.turn}", 1.0 if action == "ok" else -0.5, action == "ok")


def _decode(ids):
    return "ok" if ids and ids[0] == 1 else "no"


def test_hand_written_episodes_masks_turn_ids_and_returns():
    # episode 0: wrong, wrong, right (3 turns); episode 1: right at once; episode 2: wrong x3 (max_turns)
    gen = _scripted([[[2, 3, EOS], [1, EOS], [2, EOS]], [[2, 4, EOS], [2, 2, EOS]], [[1, EOS], [2, EOS]]])
    eps = run_episodes([Answers() for _ in range(3)], [[7], [7, 8], [7]], gen, _decode, lambda text: OBS,
                       eos_ids=[EOS], max_len=64, max_turns=3)
    a = eps[0]
    assert a.completion_ids == [2, 3, EOS] + OBS + [2, 4, EOS] + OBS + [1, EOS]
    assert a.env_mask == [1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    assert a.logprobs == [-0.1] * 3 + [0.0] * 2 + [-0.1] * 3 + [0.0] * 2 + [-0.1] * 2
    assert a.rewards == [-0.5, -0.5, 1.0] and a.episode_return == 0.0 and a.done
    assert a.observations == ["turn 1", "turn 2"]
    assert eps[1].completion_ids == [1, EOS] and eps[1].env_mask == [1, 1] and eps[1].rewards == [1.0]
    c = eps[2]
    assert c.rewards == [-0.5, -0.5, -0.5] and c.episode_return == -1.5 and not c.done
    assert c.completion_ids == [2, EOS] + OBS + [2, 2, EOS] + OBS + [2, EOS]  # no observation after the last action
    # into a batch: observation tokens provenance environment, turn ids 0, 1, 2 (-1 on observations)
    width = len(a.completion_ids)
    ids = torch.tensor([e.completion_ids + [0] * (width - len(e.completion_ids)) for e in eps])
    mask = torch.tensor([e.env_mask + [1] * (width - len(e.env_mask)) for e in eps])
    lens = torch.tensor([len(e.completion_ids) for e in eps])
    out = {"completion_ids": ids, "completion_mask": (torch.arange(width) < lens[:, None]).long(), "tool_mask": mask}
    f = provenance_fields(out, Rollouts([[]] * 3, None, [prov.ON_POLICY] * 3))
    assert (f["token_source"][0] == prov.ENVIRONMENT).tolist() == [m == 0 for m in a.env_mask]
    assert f["turn_id"][0].tolist() == [0, 0, 0, -1, -1, 1, 1, 1, -1, -1, 2, 2]
    assert f["turn_id"][1, :2].tolist() == [0, 0]


def test_budget_ends_an_episode_and_cuts_a_turn():
    # the second action is cut at max_len (no end-of-turn): the episode ends after it
    gen = _scripted([[[2, EOS]], [[2, 2, 2, 2, 2, EOS]]])
    (e,) = run_episodes([Answers()], [[7]], gen, _decode, lambda text: OBS, eos_ids=[EOS], max_len=7, max_turns=5)
    assert e.completion_ids == [2, EOS] + OBS + [2, 2, 2] and e.env_mask == [1, 1, 0, 0, 1, 1, 1] and len(e.rewards) == 2
    # an observation that does not fit with one more token: no observation, the episode ends
    (e,) = run_episodes([Answers()], [[7]], _scripted([[[2, EOS]]]), _decode, lambda text: OBS, eos_ids=[EOS],
                        max_len=4, max_turns=5)
    assert e.completion_ids == [2, EOS] and e.rewards == [-0.5]


def test_arith_retry_per_turn_rewards():
    env = resolve_env("arith_retry")()
    assert env.reset({"prompt": "3+5=", "answer": "8"}) is None
    assert env.step("#### 7") == Step(WRONG, WRONG_REWARD, False)
    assert env.step("eight") == Step(NO_ANSWER, WRONG_REWARD, False)
    assert env.step("3 #### 8") == Step("", 1.0, True) and env.solved


class Broken:
    def reset(self, problem):
        return None

    def step(self, action):
        if action == "boom":
            raise RuntimeError("kaput")
        return Step(None, float("nan") if action == "nan" else "x", 1)


@pytest.mark.parametrize("action", ["", "9" * 100_000, None, b"\xff\xfe", 12, "\x00<|im_end|>\ufffd"])
def test_hostile_actions_are_observations_never_a_crash(action):
    env = ENVIRONMENTS["arith_retry"]()
    env.reset({"answer": "8"})
    step = safe_step(env, action)
    assert step.reward == WRONG_REWARD and not step.done and step.observation in (WRONG, NO_ANSWER)


def test_a_taken_environment_name_is_refused_not_overwritten():
    original = ENVIRONMENTS["arith_retry"]
    with pytest.raises(ValueError, match="'arith_retry' is already registered"):
        register("arith_retry")(Broken)
    assert ENVIRONMENTS["arith_retry"] is original
    assert register("arith_retry")(original) is original  # the same class again (a module re-imported): no change
    assert ENVIRONMENTS["arith_retry"] is original


def test_a_failing_environment_ends_the_episode_with_its_error():
    assert safe_step(Broken(), "boom") == Step("error: RuntimeError: kaput", 0.0, True)
    assert safe_step(Broken(), "nan") == Step("", 0.0, True)  # non-finite reward: 0; None observation: ""
    assert safe_step(Broken(), "x").reward == 0.0  # a non-numeric reward: 0

    class Chatty(Broken):
        def step(self, action):
            return Step("z" * 10_000, 0.0, False)

    assert len(safe_step(Chatty(), "x").observation) == MAX_OBSERVATION_CHARS


def test_observation_suffix_is_the_templates_user_turn():
    from mixrl.models import tiny_bpe

    tok = tiny_bpe.build_tokenizer(tiny_bpe.training_texts(n=150), vocab_size=300)
    suffix = observation_suffix(tok, WRONG)
    assert tok.decode(suffix) == f"\n<|im_start|>user\n{WRONG}<|im_end|>\n<|im_start|>assistant\n"
    msgs = tiny_bpe.chat_messages("3+5=")
    first = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    rendered = tok.apply_chat_template(msgs + [{"role": "assistant", "content": "#### 7"}, {"role": "user", "content": WRONG}],
                                       add_generation_prompt=True, tokenize=False)
    assert rendered == first + "#### 7<|im_end|>" + tok.decode(suffix)


@pytest.mark.parametrize("args,says", [
    (["env.name=nope"], "the environments are single, tools and arith_retry, arith_steps"),
    (["env=arith_retry", "env.max_turns=0"], "env.max_turns >= 1"),
    (["env=arith_retry", "algo=luffy"], "not supported yet"),
    (["algo.advantage.name=mt_grpo"], "algo.advantage.name=mt_grpo with env=single: it needs each turn's reward"),
    (["env=tools", "algo.advantage.name=mt_grpo"], "with env=tools: it needs each turn's reward"),
    (["env=arith_retry", "algo.advantage.name=mt_grpo", "algo.advantage.outcome=final"],
     "algo.advantage.outcome='final' is not one of last, return"),
])
def test_bad_env_config_is_one_line_exit_2_and_nothing_created(tmp_path, args, says):
    from mixrl.cli.main import app

    run_dir = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", *args, f"run_dir={run_dir}"])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0], lines
    assert not run_dir.exists()


@pytest.mark.slow
def test_one_step_through_trls_rollout_func(tmp_path_factory):
    from mixrl.config.compose import compose_config
    from mixrl.models import tiny_bpe
    from mixrl.trainer.build import trainer_from_config

    model = tiny_bpe.warm_start(tmp_path_factory.mktemp("m"), steps=3, progress=False)
    cfg = compose_config(["env=arith_retry", "algo=grpo", f"model.path={model}", "trainer.max_steps=1",
                          "trainer.prompts_per_step=2", "algo.num_generations=2", "trainer.eval_size=0",
                          "hardware.torch_threads=1", "logger.progress=false", "data.train_size=8",
                          "trainer.max_completion_length=24", f"run_dir={tmp_path_factory.mktemp('run')}"])
    trainer = trainer_from_config(cfg)
    trainer.train()
    assert trainer.rollout_func is not None and trainer.reward_func_names == ["env_return"]
    assert torch.isfinite(torch.tensor(trainer.state.log_history[-1]["train_loss"]))


def test_plan_counts_the_turns_tokens():
    from omegaconf import OmegaConf

    from mixrl.envs.budget import TOOL_TURN_TOKENS, turn_counts

    def env(**kw):
        return OmegaConf.create({"name": "arith_retry", "tools": [], "max_tool_calls": None, "max_turns": None, **kw})

    keys = ("policy_turns", "env_turns", "env_tokens", "policy_tokens_min", "episode_tokens")
    # by hand: T = 3 turns, K = 2 observations of o = 14 tokens: E = 28 of C = 64; trained >= 64 - 28 = 36; rollout 48 + 64 = 112
    assert tuple(turn_counts(env(max_turns=3), 64, 48)[k] for k in keys) == (3, 2, 28, 36, 112)
    # tools, 2 calls: T = 3, K = 2, o = 21 (TOOL_TURN_TOKENS): E = 42, trained >= 22; rollout 15 + 64 = 79
    assert TOOL_TURN_TOKENS == 21
    assert tuple(turn_counts(env(name="tools", max_tool_calls=2), 64, 15)[k] for k in keys) == (3, 2, 42, 22, 79)
    # 5 calls: K o = 105 > C = 64, so E = C; no limit: K unknown, E = C
    assert turn_counts(env(name="tools", max_tool_calls=5), 64, 15)["env_tokens"] == 64
    assert tuple(turn_counts(env(name="tools"), 64, 15)[k] for k in keys[:3]) == (None, None, 64)
    assert turn_counts(env(name="single"), 64, 15) is None


def test_plan_and_explain_show_the_episodes():
    from mixrl.cli.main import app

    plan = CliRunner().invoke(app, ["plan", "env=arith_retry", "algo=grpo"])
    assert plan.exit_code == 0, plan.output
    assert "up to 3 policy turns and 2 observation turns" in plan.output and "up to 28 are observation tokens: not trained" in plan.output
    explain = CliRunner().invoke(app, ["explain", "env=arith_retry", "algo=grpo", "algo.loss.name=turn_ppo"])
    assert explain.exit_code == 0, explain.output
    text = " ".join(explain.output.split())
    assert "episodes in the environment arith_retry" in text and "masked from every loss" in text
    assert "episode's return" in text and "one ratio per turn (turn_id)" in text
