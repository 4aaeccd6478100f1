"""ExGRPO as its authors' code runs it (ElliottYan/LUFFY, ExGRPO/, commit
01f4ae066249e6965ce0d5512ccdf99a12895c74), each behaviour on a hand-built batch:

* admission (exgrpo/verl/verl/mix_src/experience/experience_trainer_ops.py:31-46): a question's
  successful rollouts join the pool only when 0 < successes <= 7 of 8 (experience_lbound=0,
  experience_rbound=7 in exp_scripts/run_exgrpo.sh:36-37); never before mixed-policy training
  starts (:11-12);
* the start (mix_trainer_experience.py:538-541, batch/solved at :402): mixed-policy
  training starts after the first step whose share of solved rows exceeds 0.35
  (experience_start_sratio, run_exgrpo.sh:34), from the next batch on;
* mixing (experience/experience_collate_fn.py:131-165 with n_prefix=1, prefix ratio 1.0): every
  revisited question's group carries one stored success; fresh questions none;
* the trajectory replayed (experience/experience_helpers.py:143-147, 153-168): the lowest-entropy
  stored success (mixrl: lowest mean -log pi_b of the stored tokens);
* mastered questions (mix_trainer_experience.py:385-388, experience_trainer_ops.py:102-108): a
  question its whole group solves leaves the pool;
* the replayed tokens' loss (mix_core_alg.py:133-143, 189): -A f(w), w = exp(logp - recorded
  logp), f(w) = w / (w + 0.1), no clip.
"""

from __future__ import annotations

import math

import pytest
import torch

from mixrl.config.compose import compose_config
from mixrl.core import provenance as prov
from mixrl.core.terms import TERMS, TermInputs
from mixrl.errors import ConfigError
from mixrl.sources import InjectContext
from mixrl.sources.replay import REPLAY, ReplaySource
from mixrl.sources.replay_buffer import Entry
from mixrl.sources.replay_inject import ReplayFill


class _Tok:
    eos_token_id, pad_token_id = 0, 0


def _ctx(step, G=8, batch=None):
    return InjectContext(
        tokenizer=_Tok(), process_index=0, num_processes=1, num_generations=G, max_completion_length=8,
        global_step=step, micro_step=0, device=torch.device("cpu"), tokenize_prompts=lambda ps: ps,
        gather=lambda t: t, batch=batch,
    )


def _batch(prompts, G, rewards, width=2):
    """One row per (group, generation); group g's prompt ids are ``prompts[g]`` (two tokens)."""
    n = len(prompts) * G
    pid = torch.tensor([[0, *prompts[i // G]] for i in range(n)])
    return {
        "prompt_ids": pid, "prompt_mask": torch.tensor([[0, 1, 1]] * n),
        "completion_ids": torch.arange(n).repeat_interleave(width).view(n, width) + 10,
        "completion_mask": torch.ones(n, width, dtype=torch.long),
        "advantages": torch.zeros(n), "row_source": torch.full((n,), prov.ON_POLICY),
        "token_source": torch.full((n, width), prov.ON_POLICY), "behaviour_logp": torch.full((n, width), float("nan")),
        "group_id": torch.arange(n) // G, "old_per_token_logps": torch.full((n, width), -0.5),
        "mixrl_reward": rewards.clone(), "mixrl_group_mean": rewards.view(-1, G).mean(1).repeat_interleave(G),
        "mixrl_group_std": torch.zeros(n),
    }


def _entry(prompt, reward=1.0, step=1, completion=(4, 4, 4)):
    return Entry(list(prompt), list(completion), [-0.2] * len(completion), reward, 0.0, 0.5, 0.5, step)


def test_admission_keeps_successes_of_questions_solved_1_to_7_of_8():
    """Four questions of 8 rollouts: 1/8, 8/8, 0/8 and 7/8 solved. The authors keep the successes
    of the questions with 0 < k <= 7: 1 + 7 = 8 rollouts; 8/8 (skipped at :31) and 0/8 give none."""
    rewards = torch.tensor([1.0] + [0.0] * 7 + [1.0] * 8 + [0.0] * 8 + [0.0] + [1.0] * 7)
    prompts = [(1, 1), (2, 2), (3, 3), (4, 4)]
    src = ReplaySource(store="successes", admit=[1, 7], capacity=100)
    batch = _batch(prompts, 8, rewards)
    assert src.note_group_successes(3, rewards, 8) == [1, 8, 0, 7]
    assert src.record(_ctx(3), batch, torch.full((32, 2), -0.3)) == 8
    assert sorted({tuple(e.prompt) for e in src.buffer.entries}) == [(1, 1), (4, 4)]
    # the old reading (admit null): every success, the 8/8 question's included
    old = ReplaySource(store="successes", capacity=100)
    assert old.record(_ctx(3), _batch(prompts, 8, rewards), torch.full((32, 2), -0.3)) == 16
    # counts of another step are not this step's: nothing admitted
    assert src.record(_ctx(4), batch, torch.full((32, 2), -0.3)) == 0


@pytest.mark.parametrize("admit", [[2, 1], [-1, 3], [1], "1-7", [1.5, 7]])
def test_a_bad_admit_range_is_one_line(admit):
    with pytest.raises(ConfigError, match="offpolicy.source.admit") as e:
        ReplaySource(admit=admit)
    assert "\n" not in str(e.value)


def test_replay_starts_the_step_after_the_solve_rate_exceeds_0_35():
    """32 rows per step (4 questions x 8). Step 1: 8 solved (0.25); step 2: 11 (0.34375); step 3:
    12 (0.375 > 0.35): the authors switch after step 3, so step 4 is the first mixed step. Nothing
    is stored, revisited or filled before."""
    src = ReplaySource(store="successes", sampling="recent", capacity=100)
    inj = ReplayFill(fill="revisited", revisit=0.5, start_solve_rate=0.35, source=src)
    prompts = [(1, 1), (2, 2), (3, 3), (4, 4)]
    for step, solved, on_after in ((1, 8, False), (2, 11, False), (3, 12, True)):
        rewards = torch.zeros(32)
        rewards[:solved] = 1.0
        batch = _batch(prompts, 8, rewards)
        assert not inj.active(step)
        inputs = [{"prompt": f"q{i // 8}"} for i in range(32)]
        assert inj.before_generation(_ctx(step), inputs) == inputs  # no revisit yet
        assert inj.after_rewards(_ctx(step, batch=batch), inputs, rewards).tolist() == rewards.tolist()
        inj.after_forward(_ctx(step), batch, torch.full((32, 2), -0.3))
        assert len(src.buffer) == 0  # nothing stored before the switch
        assert inj.metrics["replay/on"] == float(on_after)
    assert inj.started_at == 4 and inj.active(4)
    # from step 4 on, successes are stored (this batch: 2 questions solved 4 of 8 each)
    rewards = torch.tensor(([1.0] * 4 + [0.0] * 4) * 2 + [0.0] * 16)
    batch = _batch(prompts, 8, rewards)
    inj.after_rewards(_ctx(4, batch=batch), [], rewards)
    inj.after_forward(_ctx(4), batch, torch.full((32, 2), -0.3))
    assert len(src.buffer) == 8
    # exactly 0.35 does not switch (the authors compare with >)
    at = ReplayFill(fill="failed", start_solve_rate=0.35, source=ReplaySource())
    twenty = torch.zeros(20)
    twenty[:7] = 1.0
    at.after_rewards(_ctx(1, G=4, batch=_batch([(1, 1)] * 5, 4, twenty)), [], twenty)
    assert at.started_at is None
    # the switch survives a checkpoint
    back = ReplayFill(fill="revisited", revisit=0.5, start_solve_rate=0.35, source=ReplaySource())
    back.load_state_dict(inj.state_dict())
    assert back.started_at == 4
    # without start_solve_rate replay is on from the start (the old behaviour)
    assert ReplayFill(fill="failed", source=ReplaySource()).active(0)


def test_every_revisited_question_gets_its_trajectory_fresh_ones_none():
    """Two groups of 4 on one process, revisit 0.5: the last group is revisited (prompt 7 7, with a
    stored success). Its fresh rewards are mixed [1, 0, 1, 0]: it still gets the stored success in
    its last slot. Group 0 (fresh prompt 5 5) failed all 4 and the buffer holds a success of it:
    the authors give a fresh question no off-policy row, so it stays as it is."""
    src = ReplaySource(store="successes", sampling="recent")
    src.buffer.add(_entry((5, 5), step=1, completion=(8, 8, 8)))
    src.buffer.add(_entry((7, 7), step=2, completion=(9, 9, 9)))
    src.rows = {(7, 7): {"prompt": "p77"}, (5, 5): {"prompt": "p55"}}
    inj = ReplayFill(fill="revisited", revisit=0.5, source=src)
    inputs = [{"prompt": "p55"}] * 4 + [{"prompt": "fresh"}] * 4
    new = inj.before_generation(_ctx(5, G=4), inputs)
    assert [r["prompt"] for r in new] == ["p55"] * 4 + ["p77"] * 4 and inj.revisited == (5, {1})
    rewards = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    batch = _batch([(5, 5), (7, 7)], 4, rewards)
    out = inj.after_rewards(_ctx(5, G=4, batch=batch), new, rewards)
    assert out.tolist() == [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0]  # the stored success scored 1 in slot 7
    assert batch["row_source"].tolist() == [prov.ON_POLICY] * 7 + [REPLAY]
    assert batch["completion_ids"][7].tolist() == [9, 9, 9]
    assert batch["behaviour_logp"][7].tolist() == pytest.approx([-0.2] * 3)
    # the old fill (failed): the all-failed fresh group is filled, the revisited mixed one is not
    old = ReplayFill(fill="failed", revisit=0.5, source=src)
    batch = _batch([(5, 5), (7, 7)], 4, rewards)
    assert old.after_rewards(_ctx(5, G=4, batch=batch), new, rewards).tolist() == [0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    assert batch["row_source"].tolist() == [prov.ON_POLICY] * 3 + [REPLAY] + [prov.ON_POLICY] * 4
    # a revisited group of another step is not filled
    batch = _batch([(5, 5), (7, 7)], 4, rewards)
    assert inj.after_rewards(_ctx(6, G=4, batch=batch), new, rewards).tolist() == rewards.tolist()
    with pytest.raises(ConfigError, match="revisit is 0"):
        ReplayFill(fill="revisited", source=src)


def test_replayed_tokens_get_the_shaped_ratio_to_their_stored_logps():
    """p = 0.5, recorded p_b = 0.25: w = 2, f = 2 / 2.1; d(-A f)/d log p = -A 0.1 w / (w + 0.1)^2.
    A second token p = 0.1, p_b = 0.4: w = 0.25, f = 0.25 / 0.35."""
    logp = torch.tensor([[math.log(0.5), math.log(0.1)]], dtype=torch.float64, requires_grad=True)
    x = TermInputs(logp=logp, mask=torch.ones(1, 2, dtype=torch.bool), advantages=torch.tensor([1.5], dtype=torch.float64),
                   behaviour_logp=torch.tensor([[math.log(0.25), math.log(0.4)]], dtype=torch.float64))
    out = TERMS.get("shaped_ratio")(x, gamma=0.1)
    assert out.per_token.tolist()[0] == pytest.approx([-1.5 * 2 / 2.1, -1.5 * 0.25 / 0.35], rel=1e-12)
    out.per_token.sum().backward()
    assert logp.grad.tolist()[0] == pytest.approx([-1.5 * 0.1 * 2 / 2.1 ** 2, -1.5 * 0.1 * 0.25 / 0.35 ** 2], rel=1e-12)
    assert getattr(TERMS.get("shaped_ratio"), "needs_behaviour", False)


def test_the_preset_is_the_authors_run_and_each_old_behaviour_is_one_override():
    cfg = compose_config(["algo=exgrpo"])
    a = cfg.algo
    assert (a.advantage.name, a.loss.name, a.aggregation.name, a.entropy_coef) == ("dr_grpo", "reinforce", "seq-mean-token-sum-norm", 0.001)
    assert (a.inject.fill, a.inject.revisit, a.inject.start_solve_rate) == ("revisited", 0.5, 0.35)
    assert a.terms.experience.name == "shaped_ratio" and a.terms.experience.gamma == 0.1
    assert list(cfg.offpolicy.source.admit) == [1, 7] and cfg.offpolicy.source.store == "successes"
    assert (cfg.offpolicy.source.trajectory, cfg.offpolicy.source.drop_mastered) == ("lowest_nll", True)
    newest = compose_config(["algo=exgrpo", "offpolicy.source.trajectory=sampling", "offpolicy.source.drop_mastered=false"])
    src = ReplaySource(**{k: v for k, v in newest.offpolicy.source.items() if k != "name"})
    assert (src.trajectory, src.drop_mastered, src.buffer.sampling) == ("sampling", False, "recent")
    old = compose_config(["algo=exgrpo", "offpolicy.source.admit=null", "algo.inject.fill=failed",
                          "algo.inject.start_solve_rate=null", "algo.advantage.name=grpo", "algo.loss.name=ppo_clip",
                          "algo.aggregation.name=token-mean", "algo.entropy_coef=0",
                          "algo.terms.experience.name=policy", "~algo.terms.experience.gamma"])
    assert old.offpolicy.source.admit is None and old.algo.inject.start_solve_rate is None
    assert old.algo.terms.experience.name == "policy"


def _scored(prompt, logp, step):
    return Entry(list(prompt), [9] * len(logp), list(logp), 1.0, 0.0, 0.5, 0.5, step)


def test_a_revisited_question_replays_its_lowest_entropy_success():
    """The authors replay, of a revisited question's stored successes, the one of lowest mean token
    entropy (exp_metric=ent, exp_select_mode=argmin: experience_helpers.py:143-147, 162-163 at
    01f4ae06); mixrl estimates it by the mean of -log pi_b(y_t) over the stored tokens. Three
    successes of prompt 7 7: A (step 1) -(-0.1 - 0.5 - 0.3)/3 = 0.3, B (step 2) 0.05, C (step 3,
    the newest) 0.2: B is replayed (the old choice, trajectory=sampling with sampling=recent: C)."""
    rewards = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    replayed = {}
    for trajectory in ("lowest_nll", "sampling"):
        src = ReplaySource(store="successes", sampling="recent", trajectory=trajectory)
        for i, (lp, step) in enumerate((([-0.1, -0.5, -0.3], 1), ([-0.05, -0.05], 2), ([-0.2] * 4, 3))):
            e = _scored((7, 7), lp, step)
            e.completion = [20 + i] * len(lp)
            src.buffer.add(e)
        src.rows = {(7, 7): {"prompt": "p77"}}
        inj = ReplayFill(fill="revisited", revisit=0.5, source=src)
        new = inj.before_generation(_ctx(5, G=4), [{"prompt": "a"}] * 4 + [{"prompt": "b"}] * 4)
        batch = _batch([(5, 5), (7, 7)], 4, rewards, width=4)
        inj.after_rewards(_ctx(5, G=4, batch=batch), new, rewards)
        assert batch["row_source"][7] == REPLAY
        n = int(batch["completion_mask"][7].sum())
        replayed[trajectory] = (batch["completion_ids"][7][:n].tolist(), batch["behaviour_logp"][7][:n].tolist())
    assert replayed["lowest_nll"] == ([21, 21], pytest.approx([-0.05, -0.05]))
    assert replayed["sampling"] == ([22] * 4, pytest.approx([-0.2] * 4))
    # ties: np.argmin takes the first stored, the oldest
    src = ReplaySource(trajectory="lowest_nll")
    for step in (1, 2):
        src.buffer.add(_scored((7, 7), [-0.4, -0.2], step))
    assert [e.step for e in src.pick(1, src.buffer.entries)] == [1]
    with pytest.raises(ConfigError, match="offpolicy.source.trajectory"):
        ReplaySource(trajectory="entropy")


def test_a_question_solved_by_its_whole_group_leaves_the_pool():
    """The authors: a question whose 8 rollouts all succeed joins the skip set (every step,
    mix_trainer_experience.py:385-388, the off-policy row in its uid group), its experience is
    deleted (experience_trainer_ops.py:102-108) and it is never sampled again
    (experience_collate_fn.py:117). Groups of 4: fresh 5 5 solved [1, 1, 1, 1] -> mastered; revisited
    7 7 solved [1, 1, 1, 0] whose last slot takes its stored success -> 4 of 4 -> mastered; fresh 6 6
    [1, 0, 0, 0] stays. Each mastered prompt's stored successes go (2 entries); later rollouts of
    it are not stored; with drop_mastered=false all stay."""
    for drop in (True, False):
        src = ReplaySource(store="successes", sampling="recent", drop_mastered=drop)
        for p in ((5, 5), (7, 7), (6, 6)):
            src.buffer.add(_scored(p, [-0.3, -0.3], 1))
        src.rows = {(7, 7): {"prompt": "p77"}}
        inj = ReplayFill(fill="revisited", revisit=1 / 3, source=src)
        new = inj.before_generation(_ctx(5, G=4), [{"prompt": "x"}] * 12)
        assert [r["prompt"] for r in new[8:]] == ["p77"] * 4
        rewards = torch.tensor([1.0] * 4 + [1.0, 0.0, 0.0, 0.0] + [1.0, 1.0, 1.0, 0.0])
        batch = _batch([(5, 5), (6, 6), (7, 7)], 4, rewards)
        out = inj.after_rewards(_ctx(5, G=4, batch=batch), new, rewards)
        assert out.tolist() == [1.0] * 4 + [1.0, 0.0, 0.0, 0.0] + [1.0] * 4
        kept = sorted(tuple(e.prompt) for e in src.buffer.entries)
        if drop:
            assert kept == [(6, 6)] and src.mastered == {(5, 5), (7, 7)}
            assert inj.metrics["replay/dropped_mastered"] == 2.0
            # a later rollout of a mastered prompt is not stored; of another prompt it is
            later = _batch([(5, 5), (6, 6)], 4, torch.tensor([1.0, 0.0, 0.0, 0.0] * 2))
            src.group_successes = None
            assert src.record(_ctx(6, G=4), later, later["old_per_token_logps"]) == 1
            restored = ReplaySource(drop_mastered=True)
            restored.load_state_dict(src.state_dict())
            assert restored.mastered == {(5, 5), (7, 7)}
        else:
            assert kept == [(5, 5), (6, 6), (7, 7)] and src.mastered == set()
