"""Episode injections (issue 52): turns written into an environment's episode, their provenance,
which tokens each term trains with which advantage and ratio, UI-S1's patch module and advantage
(X-PLUG/MobileAgent @ 11cea575561fb7800b5fb6b6cafa56f7a91de11f, UI-S1/uis1/core_uis1.py,
UI-S1/verl/utils/dataset/universal_multiround.py:254-276), BEPA's reachable cache (arXiv 2601.05787),
the one-line refusals, and two training steps of each preset. Expected values by hand."""

from __future__ import annotations

import math

import pytest
import torch
from typer.testing import CliRunner

from mixrl.config.builders import build_objective
from mixrl.config.compose import compose_config
from mixrl.core import provenance as prov
from mixrl.core.advantages import ADVANTAGES
from mixrl.core.objective import compute_objective
from mixrl.core.uis1 import step_returns, uis1
from mixrl.envs import resolve_env
from mixrl.envs.episodes import Episode, run_episodes
from mixrl.envs.patching import PATCH_NOTE, Patcher, episode_sources
from mixrl.sources.base import Rollouts
from mixrl.sources.reachable_cache import ReachableCache, assimilate
from mixrl.trainer.env_rollout import _rollouts
from mixrl.trainer.parts.batch_fields import behaviour_is_policy, provenance_fields

EOS = 2
E, P, O, R = prov.ENVIRONMENT, prov.PATCHED, prov.ON_POLICY, prov.REACHABLE


# ----------------------------------------------------------------------------- the toy environment
def test_arith_steps_rewards_observations_patch_and_plan():
    env = resolve_env("arith_steps")()
    assert env.reset({"prompt": [{"role": "user", "content": "3+5+2="}]}) is None
    assert env.expert_action() == "#### 8" and env.plan() == " plan: 8 10"
    s = env.step("#### 8")  # 0.1 (format) + 0.9 (match) = 1.0; the next digit shown
    assert (s.observation, s.reward, s.done) == ("+2", pytest.approx(1.0), False)
    s = env.step("#### 9")  # format only: 0.1; diverged: the offline trajectory ends here
    assert (s.reward, s.done, env.diverged) == (pytest.approx(0.1), True, True)
    text, after = env.patch()  # the expert's action taken instead, reward 0: the last step, so done
    assert (text, after.reward, after.done, env.solved) == ("#### 10", 0.0, True, False)  # patched: not solved
    env.reset({"prompt": "3+5+2="})
    assert env.step("8 10").reward == 0.0  # no answer marker, no match
    env.reset({"prompt": "3+5+2="})
    env.step("#### 8")
    assert env.step("#### 10").done and env.solved


# ----------------------------------------------------------------------------- the patch module in the loop
def _loop(threshold):
    """Problem 3+5+2+4= (sums 8, 10, 14). The policy says #### 8 (match), #### 9 (diverges), #### 14."""
    env = resolve_env("arith_steps")()
    env.reset({"prompt": "3+5+2+4="})
    actions = iter([[11, EOS], [12, EOS], [13, EOS]])
    texts = {11: "#### 8", 12: "#### 9", 13: "#### 14"}
    generate = lambda hist: ([next(actions)], [[-0.5, -0.1]])  # noqa: E731
    decode = lambda ids: texts.get(ids[0], "")  # noqa: E731
    suffix = lambda text: [90, 91] if text == PATCH_NOTE else [80]  # noqa: E731
    patcher = Patcher(lambda text: [50, 51], suffix, EOS, threshold)
    [ep] = run_episodes([env], [[1]], generate, decode, suffix, eos_ids=[EOS], max_len=64, max_turns=3, patch=patcher)
    return ep, patcher


def test_a_diverging_action_is_kept_then_the_experts_turn_is_patched_in():
    ep, patcher = _loop(threshold=2)
    #                  a1        o("+2")  a2        note      e2 (patched)  o("+4")  a3
    assert ep.completion_ids == [11, EOS, 80, 12, EOS, 90, 91, 50, 51, EOS, 80, 13, EOS]
    assert ep.env_mask == [1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1]
    assert ep.injected == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0]
    assert ep.rewards == pytest.approx([1.0, 0.1, 1.0]) and ep.matched == [True, False, True]
    assert patcher.used == {0: 1}
    # the behaviour log-probs: the policy's on its tokens, 0 on the rest (never read there)
    assert ep.logprobs == [-0.5, -0.1, 0.0, -0.5, -0.1, 0, 0, 0, 0, 0, 0, -0.5, -0.1]
    assert episode_sources(ep.env_mask, ep.injected) == [O, O, E, O, O, E, E, P, P, P, E, O, O]


def test_past_the_threshold_a_divergence_ends_the_episode():
    ep, patcher = _loop(threshold=0)  # their patch_threshold 0: no patch, the trajectory finishes
    assert ep.completion_ids == [11, EOS, 80, 12, EOS] and ep.rewards == pytest.approx([1.0, 0.1])
    assert ep.matched == [True, True] and not any(ep.injected) and patcher.used == {}


def test_turn_ids_number_the_policys_turns_without_the_patched_one():
    ep, _ = _loop(threshold=2)
    ids = torch.tensor([ep.completion_ids])
    out = {"completion_ids": ids, "completion_mask": torch.ones_like(ids)}
    rollouts = Rollouts([ep.completion_ids], None, [O], token_source=[episode_sources(ep.env_mask, ep.injected)])
    f = provenance_fields(out, rollouts)
    assert f["token_source"][0].tolist() == [O, O, E, O, O, E, E, P, P, P, E, O, O]
    # turn k is the policy's k-th action (its reward is turn_rewards[k]); the patched turn is no turn
    assert f["turn_id"][0].tolist() == [0, 0, -1, 1, 1, -1, -1, -1, -1, -1, -1, 2, 2]


# ----------------------------------------------------------------------------- UI-S1's advantage
def test_step_returns_are_discounted_and_cut_at_a_patched_step():
    r = torch.tensor([[1.0, 0.1, 1.0], [1.0, 1.0, 1.0]])
    m = torch.tensor([[True, False, True], [True, True, True]])
    # row 0: R2 = 1; R1 = 0.1 (diverged: the running return resets to 0); R0 = 1 + 0.5 * 0 = 1
    # row 1: R2 = 1; R1 = 1 + 0.5 = 1.5; R0 = 1 + 0.5 * 1.5 = 1.75
    assert step_returns(r, m, 0.5).flatten().tolist() == pytest.approx([1.0, 0.1, 1.0, 1.75, 1.5, 1.0])


def test_uis1_advantage_by_hand():
    r = torch.tensor([[1.0, 0.1, 1.0], [1.0, 1.0, 1.0]])
    m = torch.tensor([[True, False, True], [True, True, True]])
    groups = torch.tensor([0, 0])
    per_turn = uis1(torch.zeros(2), groups, turn_rewards=r, turn_matched=m)
    # episode level: the 6 step rewards of the group, mean 5.1 / 6 = 0.85, unbiased std sqrt(0.675 / 5) = 0.3674235
    # -> 0.15 / 0.3674235 = 0.4082483 for a reward 1, -0.75 / 0.3674235 = -2.0412415 for 0.1
    # step level: k=0 returns (1, 1.75): -+0.375 / 0.5303301 = -+0.7071068; k=1 (0.1, 1.5): -+0.7 / 0.9899495; k=2 (1, 1): 0
    expected = [[0.4082483 - 0.7071068, -2.0412415 - 0.7071068, 0.4082483],
                [0.4082483 + 0.7071068, 0.4082483 + 0.7071068, 0.4082483]]
    assert per_turn.tolist() == [pytest.approx(row, rel=1e-5) for row in expected]
    # mean_norm (their config's default): means subtracted only; row 0, turn 1: (0.1 - 0.85) + (0.1 - 0.8) = -1.45
    assert float(uis1(torch.zeros(2), groups, turn_rewards=r, turn_matched=m, mode="mean_norm")[0, 1]) == pytest.approx(-1.45)
    # a group of one episode of one step: episode level mean 0, std 1 (A = r); step level its own mean (0)
    one = uis1(torch.zeros(1), torch.tensor([0]), turn_rewards=torch.tensor([[0.1]]), turn_matched=torch.tensor([[True]]))
    assert float(one[0, 0]) == pytest.approx(0.1)
    # per token: each turn's advantage on its tokens, 0 on the observation and patched tokens
    turn_ids = torch.tensor([[0, 0, -1, 1, 1, -1, -1, -1, -1, -1, -1, 2, 2]])
    tok = uis1(torch.zeros(1), torch.tensor([0]), turn_rewards=r[:1], turn_matched=m[:1], turn_ids=turn_ids)
    alone = uis1(torch.zeros(1), torch.tensor([0]), turn_rewards=r[:1], turn_matched=m[:1])[0].tolist()
    assert tok[0].tolist() == pytest.approx([alone[0]] * 2 + [0] + [alone[1]] * 2 + [0] * 6 + [alone[2]] * 2)
    assert "uis1" in ADVANTAGES.names() and uis1.needs == ("turn_rewards", "turn_ids", "turn_matched")


# ----------------------------------------------------------------------------- which tokens each term trains
def _one_episode_batch():
    src = torch.tensor([[O, O, E, O, O, E, E, P, P, P, E, O, O]])
    turn_ids = torch.tensor([[0, 0, -1, 1, 1, -1, -1, -1, -1, -1, -1, 2, 2]])
    adv = uis1(torch.zeros(1), torch.tensor([0]), turn_rewards=torch.tensor([[1.0, 0.1, 1.0]]),
               turn_matched=torch.tensor([[True, False, True]]), turn_ids=turn_ids)
    return src, adv


def test_uis1_trains_the_policys_turns_with_their_advantage_and_ratio_and_not_the_patched_turn():
    obj = build_objective(compose_config(["algo=uis1", "env=arith_steps"]))
    src, adv = _one_episode_batch()
    logp = torch.full((1, 13), -1.0, requires_grad=True)
    own = src == O
    old = torch.where(own, torch.tensor(-1.1), torch.tensor(-1.0))  # ratio exp(0.1) = 1.1052 on the policy's tokens (inside the clip)
    loss, _ = compute_objective(obj, logp=logp, mask=torch.ones(1, 13, dtype=torch.bool), advantages=adv,
                                token_source=src, old_logp=old, ref_logp=logp.detach())
    loss.backward()
    # token-mean over the 6 policy tokens: d loss / d logp_t = -A_t r_t / 6 (the KL term's gradient is 0 at ref = logp)
    expected = torch.where(own, -adv * math.exp(0.1) / 6, torch.zeros_like(adv))
    assert logp.grad.tolist() == [pytest.approx(row, rel=1e-5, abs=1e-9) for row in expected.tolist()]
    assert float(logp.grad[src == P].abs().sum()) == 0.0 and float(logp.grad[src == E].abs().sum()) == 0.0


def test_a_term_may_name_the_patched_turns_but_not_take_a_ratio_on_them():
    from mixrl.errors import ConfigError

    # an nll term on the patched (expert) turns: trained as SFT, 1/3 each (3 tokens), the policy's tokens untouched by it
    obj = build_objective(compose_config(["algo=uis1", "env=arith_steps", "algo.kl.coef=0",
                                          "algo.terms.policy.tokens=[on_policy]", "+algo.terms.sft={name: nll, tokens: [patched]}"]))
    src, _ = _one_episode_batch()
    logp = torch.full((1, 13), -1.0, requires_grad=True)
    loss, _ = compute_objective(obj, logp=logp, mask=torch.ones(1, 13, dtype=torch.bool), advantages=torch.zeros(1, 13),
                                token_source=src, old_logp=logp.detach())
    loss.backward()
    assert logp.grad[src == P].tolist() == pytest.approx([-1 / 3] * 3) and float(logp.grad[src == E].abs().sum()) == 0.0
    from mixrl.config.objective import check_objective

    with pytest.raises(ConfigError, match="'patched' tokens have no behaviour probability"):
        check_objective(compose_config(["algo=uis1", "env=arith_steps", "algo.terms.policy.tokens=[on_policy,patched]"]))


# ----------------------------------------------------------------------------- BEPA's cache
def _ep(tag, reward):
    return Episode(completion_ids=[tag, EOS], env_mask=[1, 1], logprobs=[-0.3, -0.2], rewards=[reward],
                   injected=[0, 0], matched=[True])


def test_bepa_refreshes_the_cache_from_solved_groups_and_fills_totally_failed_ones():
    cache = ReachableCache()
    cache.put("B", _ep(70, 1.0))  # an earlier success of task B
    keys = ["A", "A", "B", "B", "C", "C"]
    eps = [_ep(10, 0.1), _ep(11, 1.0), _ep(20, 0.1), _ep(21, 0.0), _ep(30, 0.0), _ep(31, 0.1)]
    asked = []

    def self_roll(rows):  # LEVEL-1: the plan-conditioned episode of task C succeeds
        asked.append(list(rows))
        return [(_ep(99, 1.0), True) for _ in rows]

    injected = assimilate(keys, eps, [False, True, False, False, False, False], 2, cache, self_roll)
    assert asked == [[5]]  # only the failed task with nothing cached is self-rolled, once
    assert injected == [False, False, False, True, False, True]  # each failed group's last row
    assert eps[3].completion_ids == [70, EOS] and eps[5].completion_ids == [99, EOS]
    assert cache.get("A").completion_ids == [11, EOS]  # LEVEL-2: the policy's own success
    assert (cache.refreshed, cache.self_rolled, cache.injected) == (1, 1, 2)
    # a later batch: task A fails everywhere and gets the success cached above; a failed self-roll caches nothing
    later = [_ep(12, 0.1), _ep(13, 0.0), _ep(40, 0.0), _ep(41, 0.0)]
    injected = assimilate(["A", "A", "D", "D"], later, [False] * 4, 2, cache, lambda rows: [(_ep(98, 0.1), False)] * len(rows))
    assert injected == [False, True, False, False] and later[1].completion_ids == [11, EOS] and cache.get("D") is None


def test_an_injected_reachable_row_is_a_trained_member_of_its_group():
    eps = [_ep(10, 0.1), _ep(11, 1.0)]
    eps[1].completion_ids, eps[1].env_mask, eps[1].injected = [11, EOS, 80, 12, EOS], [1, 1, 0, 1, 1], [0] * 5
    r = _rollouts([e.completion_ids for e in eps], eps, [False, True])
    assert r.row_source == [O, R] and r.guided == [0, 2]  # held out of the unguided accuracy
    assert r.token_source[1] == [R, R, E, R, R]
    assert behaviour_is_policy(torch.tensor([O, R, prov.EXPERT])).tolist() == [True, True, False]  # in the group's statistics
    # GRPO over the group (0.1, 1.0): -+0.7071; the policy term trains both rows alike: d/d logp = -A r / 4 tokens
    adv = ADVANTAGES.get("grpo")(torch.tensor([0.1, 1.0]), torch.tensor([0, 0]))
    assert adv.tolist() == pytest.approx([-0.7071068, 0.7071068], rel=1e-5)
    obj = build_objective(compose_config(["algo=bepa", "env=arith_steps"]))
    src = torch.tensor([[O, O, E, E, E], [R, R, E, R, R]])
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    logp = torch.full((2, 5), -1.0, requires_grad=True)
    loss, _ = compute_objective(obj, logp=logp, mask=mask, advantages=adv, token_source=src, old_logp=logp.detach())
    loss.backward()
    g = (-adv / 6).tolist()  # token-mean over the 6 trained tokens, ratio 1
    assert logp.grad.tolist() == [pytest.approx([g[0]] * 2 + [0] * 3, abs=1e-7),
                                  pytest.approx([g[1]] * 2 + [0] + [g[1]] * 2, abs=1e-7)]


# ----------------------------------------------------------------------------- one-line refusals
@pytest.mark.parametrize("args,says", [
    (["algo=uis1", "env=single"], "algo.advantage.name=uis1 with env=single: it needs each turn's reward"),
    (["algo=bepa", "env=single"], "algo.episode.name=reachable with env=single: an episode injection needs a stateful environment"),
    (["algo=uis1", "env=arith_retry"], "algo.episode.name=patch with env=arith_retry: that environment cannot take it"),
    (["algo=bepa", "env=arith_retry"], "algo.episode.name=reachable with env=arith_retry: that environment cannot take it"),
    (["algo=uis1", "env=arith_steps", "algo.episode.name=splice"], "algo.episode.name='splice': the episode injections are"),
    (["algo=uis1", "env=arith_steps", "algo.episode.threshold=-2"], "algo.episode.threshold=-2"),
    (["algo=uis1", "env=arith_steps", "algo.advantage.mode=std"], "algo.advantage.mode='std' is not one of"),
])
def test_an_episode_injection_the_environment_cannot_take_is_one_line_exit_2(tmp_path, args, says):
    from mixrl.cli.main import app

    run_dir = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", *args, f"run_dir={run_dir}"])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0], lines
    assert not run_dir.exists()


# ----------------------------------------------------------------------------- two steps of each preset
@pytest.mark.slow  # a 2-step training (make test-slow); the mechanism is tested by hand above
@pytest.mark.parametrize("algo,metric", [("uis1", "episode/patches"), ("bepa", "episode/cached_tasks")])
def test_two_steps_of_each_preset_on_the_toy_environment(tmp_path, algo, metric):
    from mixrl.trainer.build import trainer_from_config

    cfg = compose_config([f"algo={algo}", "env=arith_steps", "trainer.max_steps=2", "trainer.prompts_per_step=2",
                          "algo.num_generations=4", "trainer.eval_size=0", "hardware.torch_threads=1", "logger.progress=false",
                          "data.train_size=8", f"run_dir={tmp_path}"])
    trainer = trainer_from_config(cfg)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 2 and all(math.isfinite(h["loss"]) for h in logged)
    assert any(metric in h for h in logged)


# ----------------------------------------------------------------------------- the rollout function, end to end
class _FakeTrainer:
    """What :func:`mixrl.trainer.env_rollout.episode_rollouts` reads of the trainer (it writes nothing
    there: the rows' provenance and the metrics come back in its EpisodeBatch); generation is scripted."""

    def __init__(self, tok, prompts, num_generations):
        class _M:
            training = True

        self.processing_class, self.model, self.num_generations = tok, _M(), num_generations
        self.chat_template_kwargs, self.eos_token_ids, self.max_completion_length = {}, [tok.eos_token_id], 96


def _scripted(tok, answer):
    """A generator that answers each history with ``answer(text)`` and the end-of-turn token."""

    def generate(self, histories, *args):
        out = [tok(answer(tok.decode(h)), add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for h in histories]
        return out, [[-0.5] * len(x) for x in out]

    return generate


@pytest.fixture(scope="module")
def tok():
    from mixrl.models import tiny_bpe

    return tiny_bpe.build_tokenizer(tiny_bpe.training_texts(n=150), vocab_size=300)


def test_the_rollout_function_patches_and_marks_the_patched_turns(tok, monkeypatch):
    from trl import GRPOTrainer

    from mixrl.models import tiny_bpe
    from mixrl.trainer.env_rollout import episode_rollouts

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", _scripted(tok, lambda text: "#### 0"))  # always diverges
    cfg = compose_config(["algo=uis1"])
    prompts = [tiny_bpe.chat_messages("3+5+2=")]
    trainer = _FakeTrainer(tok, prompts, 1)
    out, rollouts, metrics = episode_rollouts(cfg)(prompts, trainer, rows=[{"prompt": p} for p in prompts])
    # two diverging actions, each patched (threshold 2): #### 0, expert: #### 8, +2, #### 0, expert: #### 10 (the last step: done)
    text = tok.decode(out["completion_ids"][0])
    assert text == ("#### 0<|im_end|>\n<|im_start|>user\nexpert:<|im_end|>\n<|im_start|>assistant\n#### 8<|im_end|>"
                    "\n<|im_start|>user\n+2<|im_end|>\n<|im_start|>assistant\n#### 0<|im_end|>"
                    "\n<|im_start|>user\nexpert:<|im_end|>\n<|im_start|>assistant\n#### 10<|im_end|>")
    assert out["turn_rewards"] == [pytest.approx([0.1, 0.1])] and out["turn_matched"] == [[False, False]]
    src = rollouts.token_source[0]
    patched = tok.decode([t for t, s in zip(out["completion_ids"][0], src) if s == P])
    own = tok.decode([t for t, s in zip(out["completion_ids"][0], src) if s == O])
    assert patched == "#### 8<|im_end|>#### 10<|im_end|>" and own == "#### 0<|im_end|>#### 0<|im_end|>"
    assert [m for m, s in zip(out["env_mask"][0], src) if s != O] == [0] * (len(src) - sum(out["env_mask"][0]))
    assert metrics == {"episode/patches": 2.0}


def test_the_rollout_function_self_rolls_caches_and_injects_a_reachable_episode(tok, monkeypatch):
    from trl import GRPOTrainer

    from mixrl.envs.arith_steps import running_sums
    from mixrl.models import tiny_bpe
    from mixrl.trainer.env_rollout import episode_rollouts

    def answer(text):  # right only with the plan in the prompt: the k-th running sum at the k-th turn
        if " plan:" not in text:
            return "#### 0"
        sums = running_sums(text.split(" plan:")[0])[1]
        return f"#### {sums[text.count('<|im_start|>assistant') - 1]}"

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", _scripted(tok, answer))
    rollout = episode_rollouts(compose_config(["algo=bepa"]))
    prompts = [tiny_bpe.chat_messages("3+5+2=")] * 2
    trainer = _FakeTrainer(tok, prompts, 2)
    out, r, metrics = rollout(prompts, trainer, rows=[{"prompt": p} for p in prompts])
    # both own episodes fail; the plan-conditioned one solves (#### 8, +2, #### 10) and replaces the group's last row
    assert out["env_return"] == pytest.approx([0.1, 2.0])
    assert tok.decode(out["completion_ids"][1]) == "#### 8<|im_end|>\n<|im_start|>user\n+2<|im_end|>\n<|im_start|>assistant\n#### 10<|im_end|>"
    assert "plan" not in tok.decode(out["prompt_ids"][1])  # trained under the plain prompt
    assert metrics == {"episode/cached_tasks": 1.0, "episode/injected_rows": 1.0}
    assert r.row_source == [O, R] and r.guided == [0, 2] and set(r.token_source[1]) == {R, E}
    # the next batch: the cache feeds the failed group without a new self-roll (the plan never reaches the generator)
    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", _scripted(tok, lambda text: "#### 0" if " plan:" not in text else 1 / 0))
    out, r, _ = rollout(prompts, trainer)  # rows left out: the prompts alone
    assert out["env_return"] == pytest.approx([0.1, 2.0]) and r.row_source == [O, R]


def test_bepa_judges_only_whole_groups():
    cache = ReachableCache()
    cache.put("A", _ep(70, 1.0))
    eps = [_ep(10, 0.0), _ep(11, 0.0), _ep(12, 0.0)]  # a process holding 3 rows of groups of 2
    assert assimilate(["A"] * 3, eps, [False] * 3, 2, cache) == [False] * 3 and cache.injected == 0
