"""ASPO (mixrl.core.aspo): Eq. (2) of "Understanding Tool-Integrated Reasoning" (arXiv 2508.19201)
by hand, the gradient it gives the policy loss, the stage reading the first tool-result position
from the tokens' provenance, the config's one-line refusals, the explain row, and two steps of
training through TRL's tool loop."""

from __future__ import annotations

import math

import pytest
import torch

from mixrl.core import provenance as prov
from mixrl.core.advantage_shaping import SHAPINGS
from mixrl.core.aspo import first_tool_position
from mixrl.core.objective import Objective, TermSpec, compute_objective
from mixrl.trainer.parts.advantage_shaping import AdvantageShaping

ASPO = SHAPINGS.get("aspo")


def _group():
    # one group of 4: rows 0, 1 correct and call the tool (first call at 2 and 6, lengths 10, 14);
    # row 2 correct without a call; row 3 wrong (calls at 4, length 12: not counted)
    a = torch.tensor([0.5, 0.5, 0.5, -1.5])
    r = torch.tensor([1.0, 1.0, 1.0, 0.0])
    p = torch.tensor([2.0, 6.0, -1.0, 4.0])
    length = torch.tensor([10.0, 14.0, 8.0, 12.0])
    return a, r, p, length, torch.zeros(4, dtype=torch.long)


def test_eq2_by_hand_on_the_correct_tool_calling_rows():
    a, r, p, length, g = _group()
    out = ASPO(a, rewards=r, group_ids=g, primary_rewards=r, lengths=length, tool_position=p, delta=-2.0, k=0.7)
    # mean p = (2 + 6) / 2 = 4, mean L = (10 + 14) / 2 = 12; bias = -2 (p - 4) / 12 = +1/3, -1/3;
    # bound 0.7 * 0.5 = 0.35 does not bite. Rows 2 and 3 keep A.
    assert out.tolist() == pytest.approx([0.5 + 1 / 3, 0.5 - 1 / 3, 0.5, -1.5])


def test_the_bias_is_clipped_to_k_abs_a_so_a_correct_row_stays_positive():
    a, r, p, length, g = _group()
    out = ASPO(a, rewards=r, group_ids=g, primary_rewards=r, lengths=length, tool_position=p, delta=-2.5, k=0.5)
    # raw bias -2.5 (+-2) / 12 = +-0.4167, clipped to +-0.25
    assert out.tolist() == pytest.approx([0.75, 0.25, 0.5, -1.5])
    assert bool((out[:3] > 0).all())


def test_groups_are_separate_and_a_lone_caller_or_zero_advantage_gets_no_bias():
    a = torch.tensor([0.5, 0.5, 0.0, 0.0, 1.0, -1.0])
    r = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    p = torch.tensor([2.0, 6.0, 1.0, 9.0, 3.0, 1.0])
    length = torch.tensor([10.0, 14.0, 12.0, 12.0, 20.0, 20.0])
    g = torch.tensor([0, 0, 1, 1, 2, 2])
    out = ASPO(a, rewards=r, group_ids=g, primary_rewards=r, lengths=length, tool_position=p)
    # group 0 as above; group 1 all correct: A = 0 -> bound 0; group 2: the only correct caller is the mean
    assert out.tolist() == pytest.approx([0.5 + 1 / 3, 0.5 - 1 / 3, 0.0, 0.0, 1.0, -1.0])


def test_rows_outside_include_are_shaped_against_the_included_rows_means():
    a = torch.tensor([0.5, 0.5, 0.5, 0.5])
    r = torch.ones(4)
    p = torch.tensor([2.0, 6.0, -1.0, 0.0])  # row 3 correct and calling, not counted (an off-policy row)
    length = torch.tensor([10.0, 14.0, 8.0, 40.0])
    include = torch.tensor([True, True, True, False])
    out = ASPO(a, rewards=r, group_ids=torch.zeros(4, dtype=torch.long), include=include, primary_rewards=r, lengths=length,
               tool_position=p)
    # means from rows 0, 1 only (4, 12); row 3: -2 (0 - 4) / 12 = 0.667, clipped to 0.35
    assert out.tolist() == pytest.approx([0.5 + 1 / 3, 0.5 - 1 / 3, 0.5, 0.85])
    alone = ASPO(a[3:], rewards=r[3:], group_ids=torch.zeros(1, dtype=torch.long), include=include[3:], primary_rewards=r[3:],
                 lengths=length[3:], tool_position=p[3:])
    assert alone.tolist() == [0.5]  # no counted row in its group: no means, no bias


def test_first_tool_position_reads_the_environment_tokens():
    P, E = prov.ON_POLICY, prov.ENVIRONMENT
    src = torch.tensor([[P, P, E, E, P], [P, P, P, P, P], [P, E, P, P, E], [P, P, P, E, E]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    # row 3's environment tokens are padding: no call
    assert first_tool_position(src, mask).tolist() == [2.0, -1.0, 1.0, -1.0]


def test_the_shaped_advantage_is_what_the_policy_gradient_carries():
    """PPO-clip at ratio 1, token-mean over one row of 2 tokens: d loss / d logp_t = -A' / 2."""
    a, r, p, length, g = _group()
    shaped = ASPO(a, rewards=r, group_ids=g, primary_rewards=r, lengths=length, tool_position=p)[:1]
    obj = Objective([TermSpec("policy", "policy", ("on_policy",), ("on_policy",), params={"loss": {"name": "ppo_clip"}})])
    logp0 = torch.tensor([[math.log(0.5), math.log(0.25)]])
    logp = logp0.clone().requires_grad_(True)
    loss, _ = compute_objective(obj, logp=logp, mask=torch.ones(1, 2, dtype=torch.bool), advantages=shaped, old_logp=logp0)
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-(0.5 + 1 / 3) / 2] * 2)


def test_the_stage_gathers_positions_lengths_and_first_rewards():
    P, E = prov.ON_POLICY, prov.ENVIRONMENT
    # completion widths 14: row 0 calls at 2 (10 tokens), row 1 at 6 (14 tokens), row 2 no call, row 3 wrong
    src = torch.full((4, 14), P)
    src[0, 2:4] = E
    src[1, 6:8] = E
    src[3, 4:6] = E
    mask = torch.zeros(4, 14, dtype=torch.long)
    for i, n in enumerate([10, 14, 8, 12]):
        mask[i, :n] = 1
    out = {"completion_mask": mask, "token_source": src, "row_source": torch.tensor([P] * 4)}
    part = AdvantageShaping("aspo", {"delta": -2.0, "k": 0.7, "success": 1.0}, offpolicy=False, forwards=None, gather=lambda t: t)
    rpf = torch.tensor([[1.0, 0.3], [1.0, 0.0], [1.0, 0.0], [0.0, 0.9]])  # the first reward function decides correctness
    a, _, _, _, g = _group()
    shaped, _ = part.shape(None, out, advantages=a, rewards=rpf.sum(1), group_ids=g, sources=out["row_source"], include=None,
                           rewards_per_func=rpf)
    assert shaped.tolist() == pytest.approx([0.5 + 1 / 3, 0.5 - 1 / 3, 0.5, -1.5])


# ----------------------------------------------------------------------------- config
def _cfg(overrides):
    from mixrl.config.compose import compose_config

    return compose_config(overrides)


@pytest.mark.parametrize("override, words", [("algo.shaping.delta=0.5", "delta"), ("algo.shaping.k=1.0", "k"),
                                             ("algo.shaping.k=-0.1", "k")])
def test_aspo_refusals_are_one_line(override, words):
    from mixrl.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        _cfg(["recipe=aspo/arith-tools", override])
    assert words in str(e.value) and "\n" not in str(e.value)


def test_aspo_without_tools_is_noted():
    from mixrl.config.objective import _notes
    from mixrl.config.builders import build_objective

    cfg = _cfg(["algo=aspo"])
    assert any("env=single" in n and "set env=tools" in n for n in _notes(cfg, build_objective(cfg)))
    tools = _cfg(["recipe=aspo/arith-tools"])
    assert not any("aspo" in n for n in _notes(tools, build_objective(tools)))


def test_explain_names_the_tool_position():
    from mixrl.explain.render import explain_lines

    rows = dict(explain_lines(_cfg(["recipe=aspo/arith-tools"])))
    assert rows["shaping"].startswith("aspo: A'_i = A_i + clip(-2 (p_i - mean_g p) / mean_g L, -0.7|A_i|, 0.7|A_i|)")
    assert "first tool-result position" in rows["shaping"]


@pytest.mark.slow
def test_aspo_trains_two_steps_through_the_tool_loop(tmp_path):
    """The shipped tool model calls the calculator: the stage reads the calls' positions from the
    tokens' provenance (every call here comes first, at the same position: the bias is 0 on this task)."""
    from mixrl.config.compose import compose_config
    from mixrl.trainer.build import trainer_from_config

    cfg = compose_config(["recipe=aspo/arith-tools", "trainer.max_steps=2", "trainer.prompts_per_step=2", "algo.num_generations=4",
                          "trainer.eval_size=0", "hardware.torch_threads=1", "logger.progress=false", "data.train_size=8",
                          f"run_dir={tmp_path / 'run'}"])
    trainer = trainer_from_config(cfg)
    fn, seen = trainer.parts.shaping.fn, []

    def spy(a, **kw):
        seen.append(kw["tool_position"])
        return fn(a, **kw)

    trainer.parts.shaping.fn = spy
    trainer.train()
    rows = [r for r in trainer.state.log_history if "shaping/rows" in r]
    assert trainer.state.global_step == 2 and len(rows) == 2 and all(math.isfinite(r["loss"]) for r in rows)
    assert len(seen) == 2 and any(bool((p >= 0).any()) for p in seen)  # some rollouts called the tool
