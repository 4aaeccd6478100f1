"""Advantage shaping (mixrl.core.advantage_shaping): each shaping's values by hand from the
paper's formula (and the authors' code where it exists), the gradient a shaped advantage gives the
policy loss, the part that gathers the statistics on a hand-built mixed batch (rollouts and expert
rows, offpolicy false / true), and the config's one-line refusals."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from mixrl.core import provenance as prov
from mixrl.core.advantage_shaping import SHAPINGS, low_probability_confidence, sequence_log_ratio
from mixrl.core.advantages import ADVANTAGES
from mixrl.core.objective import Objective, TermSpec, compute_objective
from mixrl.trainer.parts.advantage_shaping import AdvantageShaping

L = math.log
softplus = lambda x: math.log1p(math.exp(x))  # noqa: E731


# ----------------------------------------------------------------------------- sign_weight
def test_sign_weight_scales_each_sign_by_its_own_coefficient():
    a = torch.tensor([1.5, -0.5, 0.0, -2.0])
    out = SHAPINGS.get("sign_weight")(a, positive=0.5, negative=2.0)
    assert out.tolist() == pytest.approx([0.75, -1.0, 0.0, -4.0])
    # negative: 0 is the non-positive-advantage row filter: only rows with A > 0 keep a signal
    assert SHAPINGS.get("sign_weight")(a, negative=0.0).tolist() == pytest.approx([1.5, 0.0, 0.0, 0.0])


def test_sign_weight_on_dr_grpo_is_r3ls_positive_amplified():
    """dr_grpo + sign_weight(3, 1, success 1 -> 1) equals the positive_amplified estimator (which it generalises)."""
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.5, 0.0, 0.2, 0.2])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    base = ADVANTAGES.get("dr_grpo")(r, g)
    shaped = SHAPINGS.get("sign_weight")(base, rewards=r, positive=3.0, negative=1.0, success=1.0, success_advantage=1.0)
    expected = ADVANTAGES.get("positive_amplified")(r, g, success=1.0, success_advantage=1.0, amplify=3.0, std=False)
    assert shaped.tolist() == pytest.approx(expected.tolist())
    # by hand, group 1: mean 0.225 -> a = 0.275, -0.225, -0.025, -0.025; the non-negative one x3
    assert shaped[4:].tolist() == pytest.approx([0.825, -0.225, -0.025, -0.025])


# ----------------------------------------------------------------------------- psr_nsr
@pytest.mark.parametrize("mode, expected", [
    ("positive", [1.0, 0.0, 0.0, 0.5]),   # A = R (PSR)
    ("negative", [0.0, -1.0, -1.0, -0.5]),  # A = R - 1 (NSR)
    ("weighted", [0.1, -1.0, -1.0, 0.5]),  # lambda for correct, -1 for incorrect, others R (the authors' code)
])
def test_psr_nsr_matches_the_authors_advantage(mode, expected):
    r = torch.tensor([1.0, 0.0, 0.0, 0.5])
    out = SHAPINGS.get("psr_nsr")(torch.full((4,), 9.0), rewards=r, group_ids=torch.zeros(4, dtype=torch.long),
                                  mode=mode, positive_weight=0.1)
    assert out.tolist() == pytest.approx(expected)


# ----------------------------------------------------------------------------- ace
def _ace_case():
    """Two rows of 2 tokens; c_0 = (L .5 - L .25) + (L .8 - L .4) = 2 ln 2; c_1 = (L .1 - L .2) + 0 = -ln 2."""
    logp = torch.tensor([[L(0.5), L(0.8)], [L(0.1), L(0.3)]])
    ref = torch.tensor([[L(0.25), L(0.4)], [L(0.2), L(0.3)]])
    mask = torch.ones(2, 2)
    return logp, ref, mask


def test_ace_scales_only_negative_advantages_by_the_softplus_of_the_confidence_shift():
    logp, ref, mask = _ace_case()
    assert sequence_log_ratio(logp, ref, mask).tolist() == pytest.approx([2 * L(2), -L(2)])
    a = torch.tensor([-1.0, -1.0])
    out = SHAPINGS.get("ace")(a, token_logp=logp, ref_logp=ref, mask=mask, alpha=0.5)
    assert out.tolist() == pytest.approx([-(1 + 0.5 * softplus(2 * L(2))), -(1 + 0.5 * softplus(-L(2)))])
    pos = SHAPINGS.get("ace")(torch.tensor([0.7, 0.7]), token_logp=logp, ref_logp=ref, mask=mask, alpha=0.5)
    assert pos.tolist() == pytest.approx([0.7, 0.7])  # positive advantages unchanged
    relu = SHAPINGS.get("ace")(a, token_logp=logp, ref_logp=ref, mask=mask, alpha=0.5, gate="relu")
    assert relu.tolist() == pytest.approx([-(1 + 0.5 * 2 * L(2)), -1.0])  # an exploratory error (c < 0) unchanged


# ----------------------------------------------------------------------------- arm
def test_arm_shifts_advantages_by_the_prompt_answer_confidence_gap_in_rewarded_groups():
    # answer log-probs (5 tokens, row 1 has 3); low_fraction 0.4: ceil(2) and ceil(1.2) = 2 least likely tokens
    tok = torch.tensor([[-0.1, -2.0, -0.5, -3.0, -0.2], [-1.0, -0.1, -0.4, 0.0, 0.0], [-0.3, -0.3, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.float)
    c_o = low_probability_confidence(tok, mask, 0.4)
    assert c_o.tolist() == pytest.approx([(-3.0 - 2.0) / 2, (-1.0 - 0.4) / 2, (-0.3 - 0.3) / 2])
    plp = torch.tensor([[-1.0, -2.0], [0.0, -4.0], [-1.0, -1.0]])
    pm = torch.tensor([[1.0, 1.0], [0.0, 1.0], [1.0, 1.0]])  # row 1: one prompt token counted
    a = torch.tensor([0.5, -0.5, 0.0])
    r = torch.tensor([1.0, 0.0, 0.0])
    g = torch.tensor([0, 0, 1])  # group 1 has no reward: its advantage is kept
    out = SHAPINGS.get("arm")(a, rewards=r, group_ids=g, token_logp=tok, mask=mask, prompt_logp=plp, prompt_mask=pm,
                              alpha=0.2, low_fraction=0.4)
    assert out.tolist() == pytest.approx([0.5 + 0.2 * (-1.5 - (-2.5)), -0.5 + 0.2 * (-4.0 - (-0.7)), 0.0])


# ----------------------------------------------------------------------------- dgpo
def test_dgpo_matches_mathforges_mad_normalised_and_difficulty_weighted_advantage():
    """Two informative groups of 4 and one flat group, as the authors' enable_dgpo + enable_dgpo_dqw
    (T = 2): A = G (r - mean) / (sum |r - mean| + 1e-4) x K softmax(-acc / T) x L_all / L_informative."""
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    g = torch.arange(12) // 4
    lengths = torch.tensor([4.0, 2, 2, 2, 3, 3, 3, 3, 5, 5, 5, 5])
    base = ADVANTAGES.get("dr_grpo")(r, g)
    out = SHAPINGS.get("dgpo")(base, rewards=r, group_ids=g, primary_rewards=r, lengths=lengths, temperature=2.0)
    # group 0: mean 0.25, |A| sum 1.5; group 1: mean 0.75, |A| sum 1.5; accuracies 0.25 and 0.75
    w0, w1 = (2 * math.exp(-0.125) / (math.exp(-0.125) + math.exp(-0.375)), 2 * math.exp(-0.375) / (math.exp(-0.125) + math.exp(-0.375)))
    balance = lengths.sum().item() / lengths[:8].sum().item()
    exp0 = [4 * x / (1.5 + 1e-4) * w0 * balance for x in (0.75, -0.25, -0.25, -0.25)]
    exp1 = [4 * x / (1.5 + 1e-4) * w1 * balance for x in (0.25, 0.25, 0.25, -0.75)]
    assert out.tolist() == pytest.approx(exp0 + exp1 + [0.0] * 4, rel=1e-6)
    # on grpo's std-normalised advantage the same up to eps (MAD normalisation ignores a per-group scale)
    out_std = SHAPINGS.get("dgpo")(ADVANTAGES.get("grpo")(r, g), rewards=r, group_ids=g, primary_rewards=r, lengths=lengths)
    assert out_std.tolist() == pytest.approx(out.tolist(), rel=1e-3)


# ----------------------------------------------------------------------------- row_weight (GUI-G1)
def test_row_weight_multiplies_each_rows_advantage_by_its_data_weight():
    a = torch.tensor([0.5, -0.5, 0.25])
    out = SHAPINGS.get("row_weight")(a, row_values=torch.tensor([2.0, 0.5, 0.0]), column="rate")
    assert out.tolist() == pytest.approx([1.0, -0.25, 0.0])
    with pytest.raises(ValueError, match="negative"):
        SHAPINGS.get("row_weight")(a, row_values=torch.tensor([1.0, -1.0, 1.0]))


def test_the_part_reads_the_data_column_of_each_row():
    out, _, _ = _mixed_batch()
    part = AdvantageShaping("row_weight", {"column": "level"}, offpolicy=True, forwards=_Forwards(None), gather=lambda t: t)
    rows = [{"level": 1}, {"level": 2}, {"level": 3}, {"level": 4}]
    shaped, _ = part.shape(None, out, advantages=torch.ones(4), rewards=torch.zeros(4), group_ids=torch.zeros(4, dtype=torch.long),
                           sources=out["row_source"], include=None, rewards_per_func=None, rows=rows)
    assert shaped.tolist() == pytest.approx([1.0, 2.0, 3.0, 4.0])
    from mixrl.errors import ConfigError

    with pytest.raises(ConfigError, match="column 'level', which the training data does not have"):
        part.shape(None, out, advantages=torch.ones(4), rewards=torch.zeros(4), group_ids=torch.zeros(4, dtype=torch.long),
                   sources=out["row_source"], include=None, rewards_per_func=None, rows=[{"rate": 1}] * 4)


# ----------------------------------------------------------------------------- gradients
def test_a_shaped_advantage_is_the_weight_of_the_policy_gradient():
    """PPO-clip at ratio 1, token-mean: dL/dlogp_t = -A'_i / N_tokens (ACE's shaped advantages)."""
    logp0, ref, mask = _ace_case()
    shaped = SHAPINGS.get("ace")(torch.tensor([-1.0, 0.5]), token_logp=logp0, ref_logp=ref, mask=mask, alpha=1.0)
    logp = logp0.clone().requires_grad_(True)
    obj = Objective([TermSpec("policy", "policy", ("on_policy",), params={"loss": {"name": "ppo_clip"}})])
    loss, _ = compute_objective(obj, logp=logp, mask=mask.bool(), advantages=shaped, old_logp=logp0)
    loss.backward()
    a0 = -(1 + softplus(2 * L(2)))
    assert loss.item() == pytest.approx(-(2 * a0 + 2 * 0.5) / 4)
    assert logp.grad.flatten().tolist() == pytest.approx([-a0 / 4, -a0 / 4, -0.5 / 4, -0.5 / 4])


# ----------------------------------------------------------------------------- the part, on a mixed batch
class _Forwards:
    """The part's Forwards: prompt log-probs from a table (the forward), rollout log-probs from the batch."""

    batch_size = 4

    def __init__(self, prompt_logps):
        self.prompt_logps = prompt_logps

    def logps(self, model, ids, att, logits_to_keep, batch_size=None, compute_entropy=False):
        assert logits_to_keep == ids.shape[1] - 1
        return self.prompt_logps, None, None

    def behaviour_logps(self, model, out):
        return out["old_per_token_logps"]

    def no_checkpointing(self, model):
        import contextlib

        return contextlib.nullcontext()


def _mixed_batch():
    """4 rows of one group: 3 rollouts and 1 expert row (LUFFY / CHORD's demonstration)."""
    logp = torch.tensor([[L(0.5), L(0.5)], [L(0.9), L(0.9)], [L(0.2), L(0.1)], [L(0.25), L(0.5)]])
    ref = torch.tensor([[L(0.5), L(0.5)], [L(0.3), L(0.3)], [L(0.2), L(0.2)], [L(0.5), L(0.5)]])
    out = {
        "completion_mask": torch.ones(4, 2, dtype=torch.long),
        "old_per_token_logps": logp,
        "ref_per_token_logps": ref,
        "prompt_ids": torch.ones(4, 3, dtype=torch.long),
        "prompt_mask": torch.ones(4, 3, dtype=torch.long),
        "row_source": torch.tensor([prov.ON_POLICY] * 3 + [prov.EXPERT]),
    }
    return out, logp, ref


@pytest.mark.parametrize("offpolicy", [False, True])
def test_the_part_shapes_rollouts_and_off_policy_rows_when_asked(offpolicy):
    out, logp, ref = _mixed_batch()
    part = AdvantageShaping("ace", {"alpha": 1.0}, offpolicy=offpolicy, forwards=_Forwards(None), gather=lambda t: t)
    r = torch.tensor([0.0, 0.0, 1.0, 1.0])
    adv = ADVANTAGES.get("grpo")(r, torch.zeros(4, dtype=torch.long))  # [-0.866, -0.866, 0.866, 0.866]
    shaped, metrics = part.shape(None, out, advantages=adv, rewards=r, group_ids=torch.zeros(4, dtype=torch.long),
                                 sources=out["row_source"], include=None, rewards_per_func=r[:, None])
    c = [0.0, 2 * L(3), L(0.5)]  # the rollouts' confidence shifts
    assert shaped[:2].tolist() == pytest.approx([adv[0].item() * (1 + softplus(c[0])), adv[1].item() * (1 + softplus(c[1]))])
    assert shaped[2].item() == pytest.approx(adv[2].item())  # positive: unchanged
    assert shaped[3].item() == pytest.approx(adv[3].item())  # the expert row's A > 0: unchanged either way
    assert metrics["shaping/rows"] == pytest.approx(1.0 if offpolicy else 0.75)
    # a negative expert advantage is shaped only with offpolicy: true (c = ln(.25/.5) + 0 = -ln 2 -> softplus = ln 1.5)
    adv2 = torch.tensor([0.5, 0.5, 0.5, -1.0])
    shaped2, _ = part.shape(None, out, advantages=adv2, rewards=r, group_ids=torch.zeros(4, dtype=torch.long),
                            sources=out["row_source"], include=None, rewards_per_func=r[:, None])
    assert shaped2[3].item() == pytest.approx(-(1 + L(1.5)) if offpolicy else -1.0)


def test_a_shaped_expert_row_weights_luffys_off_policy_gradient():
    """LUFFY's objective on the mixed batch: policy(on_policy) + shaped(expert), one token-mean over both.
    The expert token's gradient is -A'_e gamma p / (p + gamma)^2 / N, A'_e the shaped advantage."""
    out, logp0, ref = _mixed_batch()
    part = AdvantageShaping("sign_weight", {"positive": 0.5, "negative": 2.0}, offpolicy=True, forwards=_Forwards(None),
                            gather=lambda t: t)
    adv = torch.tensor([-0.5, -0.5, 0.5, 1.0])
    shaped, _ = part.shape(None, out, advantages=adv, rewards=torch.zeros(4), group_ids=torch.zeros(4, dtype=torch.long),
                           sources=out["row_source"], include=None, rewards_per_func=None)
    assert shaped.tolist() == pytest.approx([-1.0, -1.0, 0.25, 0.5])
    pop = ("on_policy", "expert")
    obj = Objective([TermSpec("policy", "policy", ("on_policy",), pop, params={"loss": {"name": "ppo_clip"}}),
                     TermSpec("shaped", "shaped", ("expert",), pop, params={"gamma": 0.1})])
    token_source = out["row_source"][:, None].expand(4, 2).clone()
    logp = logp0.clone().requires_grad_(True)
    loss, _ = compute_objective(obj, logp=logp, mask=torch.ones(4, 2, dtype=torch.bool), advantages=shaped,
                                token_source=token_source, old_logp=logp0)
    loss.backward()
    for t, p in enumerate((0.25, 0.5)):
        assert logp.grad[3, t].item() == pytest.approx(-0.5 * 0.1 * p / (p + 0.1) ** 2 / 8)
    assert logp.grad[0].tolist() == pytest.approx([1.0 / 8, 1.0 / 8])


def test_the_part_reads_the_prompts_log_probs_without_the_first_token():
    out, _, _ = _mixed_batch()
    out["prompt_mask"] = torch.tensor([[0, 1, 1]] * 4)  # one pad on the left: its successor is not counted
    plp = torch.tensor([[-9.0, -1.0]] * 4)  # position 1 predicted from the pad: left out
    part = AdvantageShaping("arm", {"alpha": 1.0, "low_fraction": 0.5}, offpolicy=False, forwards=_Forwards(plp), gather=lambda t: t)
    runtime = part.inputs(None, out, None)
    assert runtime["prompt_mask"].tolist() == [[0.0, 1.0]] * 4
    assert runtime["prompt_logp"].tolist() == [[0.0, -1.0]] * 4


# ----------------------------------------------------------------------------- config
def _cfg(overrides):
    from mixrl.config.compose import compose_config

    return compose_config(overrides)


@pytest.mark.parametrize("override, words", [
    ("algo.shaping.positive_weight=-0.5", "positive_weight"),
    ("algo.shaping.mode=both", "mode"),
    ("algo.shaping.offpolicy=maybe", "offpolicy"),
])
def test_out_of_range_settings_are_refused_in_one_line(override, words):
    from mixrl.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        _cfg((["algo=nsr", override]))
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("override, words", [
    ("algo.shaping.alpha=-1", "alpha"),
    ("algo.shaping.gate=tanh", "gate"),
])
def test_ace_refuses_a_coefficient_that_inverts_the_penalty(override, words):
    from mixrl.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        _cfg((["algo=ace", override]))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_dgpo_refuses_a_non_positive_temperature_and_shaping_of_per_token_advantages():
    from mixrl.errors import ConfigError

    with pytest.raises(ConfigError, match="temperature"):
        _cfg((["algo=dgpo", "algo.shaping.temperature=0"]))
    with pytest.raises(ConfigError, match="one per token"):
        _cfg((["algo=dgpo", "algo.advantage.name=gae"]))


def test_sign_weight_refuses_a_negative_coefficient():
    from mixrl.errors import ConfigError

    with pytest.raises(ConfigError, match="negative"):
        _cfg((["algo=grpo", "algo.shaping={name: sign_weight, negative: -1.0}"]))


def test_ace_asks_trl_for_the_reference_log_probs():
    from mixrl.trainer.trl_args import _needs_ref_logp

    assert _needs_ref_logp(_cfg(["algo=ace"])) and not _needs_ref_logp(_cfg(["algo=dgpo"]))
    assert OmegaConf.select(_cfg(["algo=grpo"]), "algo.shaping") is None


# ----------------------------------------------------------------------------- EntroPIC
def test_entropic_sign_sets_the_positive_coefficient_by_its_pi_law():
    from mixrl.core import CONTROLLERS

    c = CONTROLLERS.get("entropic_sign")(target=0.5, kp=2.0, ki=0.5, alpha_min=-1.0, alpha_max=1.0)
    assert c.knobs() == {}  # before the first step: the config's coefficient
    c.step({"entropy": 0.3})  # e = 0.2, I = 0.2: alpha = 0.4 + 0.1 = 0.5
    assert c.knobs() == pytest.approx({"shaping.positive": 0.5})
    c.step({"entropy": 0.6})  # e = -0.1, I = 0.1: alpha = -0.2 + 0.05 = -0.15
    assert c.knobs() == pytest.approx({"shaping.positive": 1.15})
    c.step({"entropy": -5.0})  # e = 5.5: alpha clamped at 1, the positive rows' coefficient at 0 (never below)
    assert c.knobs() == pytest.approx({"shaping.positive": 0.0})


def test_the_part_applies_the_controllers_coefficient():
    out, _, _ = _mixed_batch()
    part = AdvantageShaping("sign_weight", {"positive": 1.0, "negative": 1.0}, offpolicy=False, forwards=_Forwards(None),
                            gather=lambda t: t)
    shaped, metrics = part.shape(None, out, advantages=torch.tensor([1.0, -1.0, 2.0, 1.0]), rewards=torch.zeros(4),
                                 group_ids=torch.zeros(4, dtype=torch.long), sources=out["row_source"], include=None,
                                 rewards_per_func=None, knobs={"shaping.positive": 0.25, "entropy_coef": 9.0})
    assert shaped.tolist() == pytest.approx([0.25, -1.0, 0.5, 1.0])  # the expert row (offpolicy: false) keeps its A
    assert metrics["shaping/positive"] == pytest.approx(0.25)


def test_entropic_refuses_a_gain_or_bound_that_inverts_the_gradient_and_needs_sign_weight():
    from mixrl.errors import ConfigError

    with pytest.raises(ConfigError, match="kp"):
        _cfg(["algo=entropic", "algo.controller.kp=-1"])
    with pytest.raises(ConfigError, match="alpha_max"):
        _cfg(["algo=entropic", "algo.controller.alpha_max=1.5"])
    with pytest.raises(ConfigError, match="sign_weight"):
        _cfg(["algo=entropic", "algo.shaping=null"])


def test_explain_shows_the_shaping_row_only_when_there_is_one():
    from mixrl.explain.render import explain_lines

    rows = dict(explain_lines(_cfg(["algo=ace"])))
    assert rows["shaping"].startswith("ace: A'_i = A_i (1 + 1 g(c_i))") and "reference model's log-probs" in rows["shaping"]
    assert "shaping" not in dict(explain_lines(_cfg(["algo=grpo"])))
