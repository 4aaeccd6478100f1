"""mixrl's loss options against the peers' own computations (issue 33): each ``_peer_*``
function below transcribes, in plain torch, the lines of the peer's code it names (file and
commit), and each test compares mixrl's value and gradient with it on the same tensors,
including a fully masked row (no trainable token, e.g. a truncated completion under
``mask_truncated_completions``) and a mask with a hole. ``docs/peers.yaml`` names these tests
for the rows they check (``tests/test_peers_table.py`` walks the names).

Peers read: verl b178a3cd ``verl/trainer/ppo/core_algos.py``; TRL 1.16.0 (installed)
``trl/trainer/grpo_trainer.py`` (``GRPOTrainer._compute_loss``) and
``trl/trainer/dpo_trainer.py`` (``loss_type == "sft"``); Trinity-RFT 9051d637
``trinity/algorithm/policy_loss_fn/ppo_policy_loss.py`` and ``cispo_policy_loss.py``; LUFFY
01f4ae06 ``luffy/verl/verl/mix_src/mix_actor.py`` (``use_sft_multitask_loss``) and
``mix_core_alg.py`` (``compute_sft_pure_loss``).
"""

from __future__ import annotations

import math

import pytest
import torch

from mixrl.config.builders import build_objective
from mixrl.config.compose import compose_config
from mixrl.core import AGGREGATIONS, POLICY_LOSSES
from mixrl.core import provenance as prov
from mixrl.core.objective import compute_objective
from mixrl.core.terms import TERMS, TermInputs

# four rows of four tokens: row 1 has a hole (token 1 masked), row 2 is fully masked,
# row 3 ends in padding
MASK = torch.tensor([[1, 1, 1, 1], [1, 0, 1, 1], [0, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
OLD = torch.tensor([[-1.0, -2.0, -0.5, -1.3], [-0.7, -1.2, -3.0, -0.2], [-1.1, -0.9, -2.2, -0.4],
                    [-0.6, -1.7, -5.0, -5.0]], dtype=torch.float64)
# log-ratios far enough from 0 that every clip and mask acts somewhere
LR = torch.tensor([[0.5, -0.9, 0.1, 1.2], [-0.3, 0.0, 0.9, -1.5], [0.4, 0.4, 0.4, 0.4],
                   [0.25, -0.05, 0.0, 0.0]], dtype=torch.float64)
ADV = torch.tensor([1.0, -0.5, 0.7, -1.2], dtype=torch.float64)
MAX_LEN = 6  # TRL's max_completion_length (>= the width 4)


def _logp():
    return (OLD + LR).clone().requires_grad_(True)


def _mixrl(loss: str, agg: str, params: dict | None = None, agg_params: dict | None = None, adv=ADV):
    """(value, d value / d logp) of mixrl's loss and aggregation on the batch above."""
    logp = _logp()
    out = POLICY_LOSSES.get(loss)(logp, OLD, adv, MASK, **(params or {}))
    value = AGGREGATIONS.get(agg)(out.per_token_loss, MASK, **(agg_params or {}))
    value.backward()
    return value.detach(), logp.grad


def _peer(fn, *args, **kw):
    logp = _logp()
    value = fn(logp, *args, **kw)
    value.backward()
    return value.detach(), logp.grad


def _close(a, b):
    """Value and gradient equal up to the peers' epsilons (verl divides a row by its length +
    1e-8: relative 1e-8 at these lengths)."""
    torch.testing.assert_close(a[0], b[0], rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(a[1], b[1], rtol=1e-7, atol=1e-9)


# --------------------------------------------------------------------------- the peers' code
def _verl_vanilla_per_token(logp, low=0.2, high=0.2, clip_ratio_c=3.0):
    """verl b178a3cd core_algos.py ``compute_policy_loss_vanilla`` (and Trinity-RFT 9051d637
    ppo_policy_loss.py ``PPOPolicyLossFn.__call__``, the same lines, ``clip_ratio_c`` 3.0)."""
    neg_kl = torch.clamp(logp - OLD, min=-20.0, max=20.0)
    ratio = torch.exp(neg_kl)
    adv = ADV.unsqueeze(-1)
    pg_losses1 = -adv * ratio
    pg_losses2 = -adv * torch.clamp(ratio, 1 - low, 1 + high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -adv * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    return torch.where(adv < 0, clip_pg_losses2, clip_pg_losses1)


def _verl_agg_loss(loss_mat, mode):
    """verl b178a3cd core_algos.py ``agg_loss`` (dp_size 1, global_batch_size /
    batch_num_tokens None: one micro-batch)."""
    m = MASK.to(loss_mat.dtype)
    if mode == "token-mean":
        return (loss_mat * m).sum() / m.sum()
    if mode == "seq-mean-token-sum":
        seq_losses = (loss_mat * m).sum(-1)
        seq_mask = (m.sum(-1) > 0).to(loss_mat.dtype)  # "exclude fully masked sequences"
        return (seq_losses * seq_mask).sum() / seq_mask.sum()
    seq_len = m.sum(-1)
    seq_losses = (loss_mat * m).sum(-1) / (seq_len + 1e-8)
    seq_mask = (seq_len > 0).to(loss_mat.dtype)
    return (seq_losses * seq_mask).sum() / seq_mask.sum()


def _trl_aggregate(per_token_loss, loss_type):
    """TRL 1.16.0 grpo_trainer.py ``_compute_loss``, the aggregation of each ``loss_type``
    (one process, no gradient accumulation)."""
    mask = MASK.to(per_token_loss.dtype)
    if loss_type in ("grpo", "sapo"):
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "dr_grpo":
        return (per_token_loss * mask).sum() / (per_token_loss.size(0) * MAX_LEN)
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)  # bnpo; dapo with num_items_in_batch


def _trl_per_token(logp, loss_type, eps_low=0.2, eps_high=0.2, tau_pos=1.0, tau_neg=1.05):
    """TRL 1.16.0 grpo_trainer.py ``_compute_loss``, ``importance_sampling_level="token"``."""
    coef_1 = torch.exp(logp - OLD)
    adv = ADV.unsqueeze(1)
    if loss_type == "cispo":
        return -torch.clamp(coef_1, max=eps_high).detach() * adv * logp
    if loss_type == "sapo":
        # TRL passes Python floats (a float32 tensor); float64 here so the comparison is exact
        temperatures = torch.where(adv > 0, torch.tensor(tau_pos, dtype=adv.dtype), torch.tensor(tau_neg, dtype=adv.dtype))
        return -torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures * adv
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    return -torch.min(coef_1 * adv, coef_2 * adv)


def _verl_geo_mean(logp, advantages, low=0.4, high=0.4):
    """verl b178a3cd core_algos.py ``compute_policy_loss_geo_mean`` (``loss_agg_mode`` unused:
    ``torch.mean`` over the micro-batch's rows)."""
    m = MASK.to(logp.dtype)
    neg_kl = logp - OLD
    sgn = torch.sign(advantages)
    clamp = torch.clamp(neg_kl, -low, high)
    kl_min = sgn * torch.min(sgn * neg_kl, sgn * clamp)
    n = m.sum(-1)
    ratio = torch.exp((kl_min * m).sum(-1) / (n + 1e-8))
    advantage = (advantages * m).sum(-1) / (n + 1e-8)
    return torch.mean(-advantage * ratio)


def _trinity_cispo(logp, low=1.0, high=0.28, enable_mask_clip=False, mask_low=1.0, mask_high=0.28):
    """Trinity-RFT 9051d637 cispo_policy_loss.py ``CISPOPolicyLossFn.__call__`` (its
    ``masked_mean``: token-mean)."""
    ratio = torch.exp(logp - OLD)
    adv = ADV.unsqueeze(-1)
    ratio_clamped = torch.clamp(ratio, min=1.0 - low, max=1.0 + high)
    mask = torch.ones_like(ratio)
    if enable_mask_clip:
        mask = torch.where((ratio > 1.0 + mask_high) & (adv > 0), torch.zeros_like(ratio), mask)
        mask = torch.where((ratio < 1.0 - mask_low) & (adv < 0), torch.zeros_like(ratio), mask)
    loss = -adv * ratio_clamped.detach() * mask.detach() * logp
    m = MASK.to(logp.dtype)
    return (loss * m).sum() / m.sum()


# --------------------------------------------------------------------------- aggregation: fully masked rows
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_verl_agg_loss_leaves_fully_masked_rows_out(mode):
    """verl's ``loss_agg_mode``: mixrl's default (``count_empty_rows`` false) divides by the
    rows with a token, as verl's ``seq_mask``; the vanilla loss with its dual clip c = 3."""
    _close(_mixrl("ppo_clip", mode, {"dual_clip_c": 3.0}),
           _peer(lambda lp: _verl_agg_loss(_verl_vanilla_per_token(lp), mode)))


@pytest.mark.parametrize("loss_type, mode, agg_params", [
    ("grpo", "seq-mean-token-mean", {"count_empty_rows": True}),
    ("dr_grpo", "seq-mean-token-sum-norm", {"count_empty_rows": True, "max_len": MAX_LEN}),
    ("bnpo", "token-mean", {}),
    ("dapo", "token-mean", {}),
])
def test_trl_loss_type_aggregation_counts_fully_masked_rows(loss_type, mode, agg_params):
    """TRL's ``loss_type`` grpo (``.mean()`` over the rows) and dr_grpo (``/ (B *
    max_completion_length)``) count the fully masked row: ``count_empty_rows: true``; without
    it mixrl divides by 3 rows instead of 4 (a factor 4/3 here). bnpo / dapo: token means."""
    peer = _peer(lambda lp: _trl_aggregate(_trl_per_token(lp, loss_type), loss_type))
    _close(_mixrl("ppo_clip", mode, {}, agg_params), peer)
    if agg_params:
        default = _mixrl("ppo_clip", mode, {}, {k: v for k, v in agg_params.items() if k != "count_empty_rows"})
        torch.testing.assert_close(default[0], peer[0] * 4 / 3)


def test_count_empty_rows_by_hand_and_through_the_objective():
    """Hand values: row means 1.0 and 3.0, one fully masked row: (1 + 3) / 3 with it counted,
    (1 + 3) / 2 without; the objective built from ``algo.aggregation.count_empty_rows=true``
    divides by the population's rows (its third count) and equals TRL's ``loss_type=grpo``, and
    two micro-batches with the step's normalisers add up to the whole step."""
    loss = torch.tensor([[1.0, 1.0], [2.0, 4.0], [9.0, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 1], [0, 0]], dtype=torch.bool)
    f = AGGREGATIONS.get("seq-mean-token-mean")
    assert float(f(loss, mask)) == pytest.approx(2.0)
    assert float(f(loss, mask, count_empty_rows=True)) == pytest.approx(4.0 / 3.0)
    g = AGGREGATIONS.get("seq-mean-token-sum-norm")
    assert float(g(loss, mask, max_len=4, count_empty_rows=True)) == pytest.approx((2.0 + 6.0) / 4 / 3)

    cfg = compose_config(["algo=grpo", "algo.aggregation.name=seq-mean-token-mean", "algo.aggregation.count_empty_rows=true"])
    obj = build_objective(cfg)
    assert obj.terms[0].aggregation_params["count_empty_rows"] is True
    logp = _logp()
    full, _ = compute_objective(obj, logp=logp, old_logp=OLD, mask=MASK, advantages=ADV)
    peer = _peer(lambda lp: _trl_aggregate(_trl_per_token(lp, "grpo"), "grpo"))
    torch.testing.assert_close(full.detach(), peer[0])
    # two micro-batches of two rows with the step's (tokens, rows, all rows): they add up
    counts = {"on_policy": (float(MASK.sum()), 3.0, 4.0)}
    parts = [compute_objective(obj, logp=_logp()[i], old_logp=OLD[i], mask=MASK[i], advantages=ADV[i], normalisers=counts)[0]
             for i in (slice(0, 2), slice(2, 4))]
    torch.testing.assert_close(sum(p.detach() for p in parts), peer[0])
    with pytest.raises(ValueError, match="count_empty_rows"):
        compute_objective(obj, logp=_logp(), old_logp=OLD, mask=MASK, advantages=ADV, normalisers={"on_policy": (10.0, 3.0)})


# --------------------------------------------------------------------------- PPO clip and dual clip
@pytest.mark.parametrize("low, high", [(0.2, 0.2), (0.2, 0.28)])
def test_verl_vanilla_and_trinity_ppo_are_ppo_clip_with_the_dual_clip(low, high):
    """verl's vanilla loss and Trinity's ppo always apply the dual clip c = 3 (the per-token
    lines are the same in both): ``ppo_clip`` with ``dual_clip_c=3.0`` and the clip ratios;
    without the dual clip mixrl differs on a token with A < 0 and r > 3."""
    peer = _peer(lambda lp: _verl_agg_loss(_verl_vanilla_per_token(lp, low, high), "token-mean"))
    _close(_mixrl("ppo_clip", "token-mean", {"clip_low": low, "clip_high": high, "dual_clip_c": 3.0}), peer)
    # a token with A < 0 and r > 3 (log r = 1.5 on row 1, token 3): only the dual clip bounds it
    lr = LR.clone()
    lr[1, 3] = 1.5
    logp = (OLD + lr).requires_grad_(True)
    with_dual = POLICY_LOSSES.get("ppo_clip")(logp, OLD, ADV, MASK, clip_low=low, clip_high=high, dual_clip_c=3.0)
    without = POLICY_LOSSES.get("ppo_clip")(logp, OLD, ADV, MASK, clip_low=low, clip_high=high)
    assert float(with_dual.per_token_loss[1, 3].detach()) == pytest.approx(0.5 * 3.0)
    assert float(without.per_token_loss[1, 3].detach()) == pytest.approx(0.5 * math.exp(1.5))


# --------------------------------------------------------------------------- CISPO
def test_verl_cispo_is_cispo_with_the_actor_clip_ratios():
    """verl b178a3cd ``compute_policy_loss_cispo``: ``-sg(clamp(r, 1 - low, 1 + high)) A log p``,
    token-mean; no mask (``trust_mask`` false)."""
    def verl(lp):
        ratio = torch.exp(torch.clamp(lp - OLD, -20.0, 20.0))
        loss = -torch.clamp(ratio, 1 - 0.2, 1 + 0.28).detach() * ADV.unsqueeze(-1) * lp
        return _verl_agg_loss(loss, "token-mean")
    _close(_mixrl("cispo", "token-mean", {"clip_low": 0.2, "clip_high": 0.28}), _peer(verl))


def test_trl_cispo_is_cispo_with_clip_high_e_minus_one():
    """TRL ``loss_type=cispo``: ``clamp(r, max=epsilon_high)``, no lower bound: ``clip_low=1.0``,
    ``clip_high = epsilon_high - 1``."""
    _close(_mixrl("cispo", "token-mean", {"clip_low": 1.0, "clip_high": 1.5}),
           _peer(lambda lp: _trl_aggregate(_trl_per_token(lp, "cispo", eps_high=2.5), "dapo")))


@pytest.mark.parametrize("enable, mask_low, mask_high", [(False, None, None), (True, None, None), (True, 0.5, 0.1)])
def test_trinity_cispo_enable_mask_clip_with_its_own_bounds(enable, mask_low, mask_high):
    """Trinity's ``enable_mask_clip`` (off by default) masks with ``mask_clip_range_low/high``,
    not the weight's bounds: ``trust_mask`` with ``mask_low`` / ``mask_high``."""
    params = {"clip_low": 1.0, "clip_high": 0.28, "trust_mask": enable}
    peer_kw = {"enable_mask_clip": enable}
    if mask_low is not None:
        params |= {"mask_low": mask_low, "mask_high": mask_high}
        peer_kw |= {"mask_low": mask_low, "mask_high": mask_high}
    _close(_mixrl("cispo", "token-mean", params), _peer(lambda lp: _trinity_cispo(lp, **peer_kw)))
    if mask_low is not None:  # the bounds matter here: the weight's bounds give another loss
        other = _mixrl("cispo", "token-mean", {"clip_low": 1.0, "clip_high": 0.28, "trust_mask": True})
        assert not torch.allclose(other[1], _peer(lambda lp: _trinity_cispo(lp, **peer_kw))[1])


# --------------------------------------------------------------------------- SAPO
def test_trl_sapo_is_sapo_with_count_empty_rows():
    """TRL ``loss_type=sapo``: the differentiated gate, aggregated like grpo (rows counted
    even when fully masked)."""
    peer = _peer(lambda lp: _trl_aggregate(_trl_per_token(lp, "sapo"), "sapo"))
    _close(_mixrl("sapo", "seq-mean-token-mean", {}, {"count_empty_rows": True}), peer)


# --------------------------------------------------------------------------- GMPO (verl geo_mean)
def test_verl_geo_mean_is_gmpo_counting_fully_masked_rows():
    """verl's ``geo_mean`` averages the row losses over every row of the micro-batch (the fully
    masked row adds 0): ``seq-mean-token-mean`` with ``count_empty_rows``; one advantage per row."""
    peer = _peer(lambda lp: _verl_geo_mean(lp, ADV.unsqueeze(-1).expand_as(OLD)))
    _close(_mixrl("gmpo", "seq-mean-token-mean", {}, {"count_empty_rows": True}), peer)


def test_verl_geo_mean_per_token_advantages_clip_by_each_token_sign():
    """Per-token advantages of both signs in a row (and a token with A_t = 0): verl clips each
    token by the sign of its own advantage: ``clip_sign: token``; the default (``row``) clips by
    the sign of the row's mean advantage and differs here."""
    adv = torch.tensor([[1.0, -2.0, 0.5, 1.5], [-1.0, 0.3, 0.0, 0.4], [0.2, 0.2, 0.2, 0.2], [-0.4, 0.9, 0.0, 0.0]],
                       dtype=torch.float64)
    peer = _peer(lambda lp: _verl_geo_mean(lp, adv))
    _close(_mixrl("gmpo", "seq-mean-token-mean", {"clip_sign": "token"}, {"count_empty_rows": True}, adv=adv), peer)
    row = _mixrl("gmpo", "seq-mean-token-mean", {}, {"count_empty_rows": True}, adv=adv)
    assert not torch.allclose(row[1], peer[1])


# --------------------------------------------------------------------------- RPO vs TRL's sft loss
def test_rpo_nll_tokens_is_trls_sft_loss_and_pair_is_the_per_pair_mean():
    """TRL 1.16 DPO ``loss_type=["sigmoid", "sft"]`` ``loss_weights=[1, alpha]``: the sft part is
    ``-chosen_per_token_logps[chosen_mask].mean()``, a token mean over all chosen tokens:
    ``nll_mean: tokens``. ``pair`` (the default) averages each chosen completion's token mean."""
    # two pairs: chosen rows 0 (2 tokens) and 2 (3 tokens), rejected rows 1 and 3
    lp = [[-1.0, -2.0, 0.0], [-0.5, -1.5, -1.0], [-0.3, -0.6, -0.9], [-2.0, 0.0, 0.0]]
    ref = [[-1.2, -2.1, 0.0], [-0.4, -1.0, -1.2], [-0.5, -0.5, -0.5], [-1.0, 0.0, 0.0]]
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    s = [sum(v for v, k in zip(r, m) if k) for r, m in zip(lp, mask.tolist())]
    s_ref = [sum(v for v, k in zip(r, m) if k) for r, m in zip(ref, mask.tolist())]
    n = [int(m.sum()) for m in mask]
    beta, alpha = 0.5, 0.3
    dpo = sum(math.log(1 + math.exp(-beta * ((s[w] - s_ref[w]) - (s[r] - s_ref[r])))) for w, r in ((0, 1), (2, 3))) / 2
    rows = {"pair_index": torch.tensor([0, 0, 1, 1]), "pair_side": torch.tensor([1, 0, 1, 0]),
            "pair_partner_logp": torch.tensor([s[1], s[0], s[3], s[2]], dtype=torch.float64),
            "pair_partner_ref_logp": torch.tensor([s_ref[1], s_ref[0], s_ref[3], s_ref[2]], dtype=torch.float64),
            "pair_partner_len": torch.tensor([n[1], n[0], n[3], n[2]], dtype=torch.float64)}

    def value(nll_mean):
        logp = torch.tensor(lp, dtype=torch.float64, requires_grad=True)
        x = TermInputs(logp=logp, mask=mask, advantages=torch.zeros(4), behaviour_logp=logp.detach(),
                       ref_logp=torch.tensor(ref, dtype=torch.float64), rows=rows)
        out = TERMS.get("rpo")(x, beta=beta, alpha=alpha, nll_mean=nll_mean)
        v = AGGREGATIONS.get("seq-mean-token-sum")(out.per_token * mask, mask, num_items=4.0)
        v.backward()
        return float(v.detach()), logp.grad

    trl_sft = -(s[0] + s[2]) / (n[0] + n[2])  # 4.8 / 5
    pair_nll = (-s[0] / n[0] - s[2] / n[2]) / 2  # (1.5 + 0.6) / 2
    v_tok, g_tok = value("tokens")
    v_pair, g_pair = value("pair")
    assert v_tok == pytest.approx(dpo + alpha * trl_sft, abs=1e-12)
    assert v_pair == pytest.approx(dpo + alpha * pair_nll, abs=1e-12)
    # the NLL's gradient on a chosen token: -alpha / (all chosen tokens) vs -alpha / (2 |y_w|)
    assert float(g_tok[0, 0] - g_pair[0, 0]) == pytest.approx(-alpha / 5 + alpha / (2 * 2), abs=1e-12)
    assert float(g_tok[2, 0] - g_pair[2, 0]) == pytest.approx(-alpha / 5 + alpha / (2 * 3), abs=1e-12)


# --------------------------------------------------------------------------- LUFFY use_sft_multitask_loss
LUFFY_SFT = ["algo=luffy", "~algo.terms.offpolicy", "algo.terms.policy.normalise_over=[on_policy]",
             "algo.advantage_include_offpolicy=false", "algo.entropy_coef=0.0", "algo.terms.sft.name=nll",
             "algo.terms.sft.tokens=[expert]", "algo.terms.sft.weight=0.1"]


def test_luffy_sft_multitask_loss_is_policy_on_rollouts_plus_nll_on_expert_rows():
    """LUFFY ``use_sft_multitask_loss=True sft_loss_coef=c`` (mix_actor.py): the PPO loss on the
    on-policy rows alone (``compute_policy_loss``, token mean over their tokens), plus c times
    ``compute_sft_pure_loss`` on the off-policy rows (a token mean of -log p); no off-policy
    (shaped) term. One micro-batch per step: mixrl's step normalisers are the micro-batch's."""
    cfg = compose_config(LUFFY_SFT)
    obj = build_objective(cfg)
    src = torch.full(MASK.shape, prov.ON_POLICY, dtype=torch.long)
    src[3] = prov.code("expert")  # the last row is the expert's
    logp = _logp()
    loss, _ = compute_objective(obj, logp=logp, old_logp=OLD, mask=MASK, advantages=ADV, token_source=src)
    loss.backward()

    def luffy(lp):
        on, off = slice(0, 3), slice(3, 4)
        m_on, m_off = MASK[on].to(lp.dtype), MASK[off].to(lp.dtype)
        ratio = torch.exp(lp[on] - OLD[on])
        adv = ADV[on].unsqueeze(-1)
        pg = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.2))  # verl 0.x compute_policy_loss
        pg_loss = (pg * m_on).sum() / m_on.sum()
        sft_loss = (-lp[off] * m_off).sum() / m_off.sum()
        return sft_loss * 0.1 + pg_loss

    _close((loss.detach(), logp.grad), _peer(luffy))


# --------------------------------------------------------------------------- GSPO, SAPO (verl, Trinity)
def _gspo_per_token(logp, low, high, clamp_max=None):
    """verl b178a3cd ``compute_policy_loss_gspo`` (``clamp_max=10.0``) and Trinity-RFT 9051d637
    gspo_policy_loss.py ``GSPOLossFn.__call__`` (no clamp): the GSPO-token ratio."""
    m = MASK.to(logp.dtype)
    neg_kl = logp - OLD
    neg_kl_seq = (neg_kl * m).sum(-1) / m.sum(-1).clamp(min=1)
    log_s = logp - logp.detach() + neg_kl_seq.detach().unsqueeze(-1)
    if clamp_max is not None:
        log_s = torch.clamp(log_s, max=clamp_max)
    s = torch.exp(log_s)
    adv = ADV.unsqueeze(-1)
    return torch.maximum(-adv * s, -adv * torch.clamp(s, 1 - low, 1 + high))


def test_verl_gspo_is_gspo_with_seq_mean_token_mean():
    """verl's ``gspo`` always aggregates ``seq-mean-token-mean`` (fully masked rows left out, as
    ``algo=gspo``); its log-ratio clamp at 10 does not act on these ratios."""
    peer = _peer(lambda lp: _verl_agg_loss(_gspo_per_token(lp, 0.2, 0.28, clamp_max=10.0), "seq-mean-token-mean"))
    _close(_mixrl("gspo", "seq-mean-token-mean", {"clip_low": 0.2, "clip_high": 0.28}), peer)


def test_trinity_gspo_under_its_loss_agg_mode_token_mean():
    """Trinity's validator replaces the loss's own ``loss_agg_mode`` (gspo's seq-mean-token-mean)
    with ``algorithm.loss_agg_mode`` (default token-mean): ``algo=gspo
    algo.aggregation.name=token-mean``; with the gspo default aggregation mixrl differs."""
    peer = _peer(lambda lp: _verl_agg_loss(_gspo_per_token(lp, 3e-4, 4e-4), "token-mean"))
    _close(_mixrl("gspo", "token-mean", {"clip_low": 3e-4, "clip_high": 4e-4}), peer)
    assert not torch.allclose(_mixrl("gspo", "seq-mean-token-mean", {"clip_low": 3e-4, "clip_high": 4e-4})[0], peer[0])


def _trinity_masked_loss_seq_mean_token_mean(loss_mat):
    """Trinity-RFT b458e2c2 trinity/algorithm/utils.py ``masked_loss(..., "seq-mean-token-mean")``:
    ``masked_mean`` per row (``/ (mask.sum(-1) + 1e-8)``), then ``.mean()`` over every row, a
    row with no trainable token counted with loss 0."""
    m = MASK.to(loss_mat.dtype)
    return ((loss_mat * m).sum(-1) / (m.sum(-1) + 1e-8)).mean()


def test_trinity_gspo_with_loss_agg_mode_seq_mean_token_mean_counts_empty_rows():
    """Trinity's ``gspo`` under ``algorithm.loss_agg_mode=seq-mean-token-mean`` averages over every
    row (its ``masked_loss``): ``algo.aggregation.count_empty_rows=true``; without it mixrl's loss is
    (rows / rows with a token) times Trinity's."""
    peer = _peer(lambda lp: _trinity_masked_loss_seq_mean_token_mean(_gspo_per_token(lp, 3e-4, 4e-4)))
    params = {"clip_low": 3e-4, "clip_high": 4e-4}
    _close(_mixrl("gspo", "seq-mean-token-mean", params, {"count_empty_rows": True}), peer)
    left_out = _mixrl("gspo", "seq-mean-token-mean", params)[0]
    torch.testing.assert_close(left_out, peer[0] * 4 / 3, rtol=1e-7, atol=1e-9)  # 4 rows, 3 with a token


def test_verl_gspo_clamps_the_sequence_log_ratio_at_10():
    """verl b178a3cd ``compute_policy_loss_gspo``: ``torch.clamp(log_seq_importance_ratio, max=10.0)``
    on ``log_prob - sg(log_prob) + sg(mean log-ratio)``: a row whose mean log-ratio is above 10 gets
    ratio e^10 and no gradient. ``algo.loss.seq_log_ratio_max=10.0`` does the same (each token's
    log-ratio below mixrl's own clamp at 20 here); without it mixrl's loss differs on that row."""
    from mixrl.core import POLICY_LOSSES

    old = torch.zeros(2, 3, dtype=torch.float64)
    base = torch.tensor([[12.0, 11.0, 13.0], [0.1, -0.2, 0.05]], dtype=torch.float64)  # row 0: mean log-ratio 12 > 10
    adv = torch.tensor([-1.0, 0.5], dtype=torch.float64)  # A < 0 on row 0: the unclipped branch -A s is the max
    mask = torch.ones(2, 3, dtype=torch.bool)

    def verl(lp):
        neg_kl = lp - old
        seq = (neg_kl * mask).sum(-1) / mask.sum(-1)
        log_s = torch.clamp(lp - lp.detach() + seq.detach().unsqueeze(-1), max=10.0)
        s = torch.exp(log_s)
        a = adv.unsqueeze(-1)
        per_token = torch.maximum(-a * s, -a * torch.clamp(s, 1 - 0.2, 1 + 0.28))
        return ((per_token * mask).sum(-1) / mask.sum(-1)).mean()

    def run(fn):
        lp = base.clone().requires_grad_(True)
        v = fn(lp)
        v.backward()
        return v.detach(), lp.grad

    def ours(max_):
        def fn(lp):
            out = POLICY_LOSSES.get("gspo")(lp, old, adv, mask, clip_low=0.2, clip_high=0.28, seq_log_ratio_max=max_)
            return AGGREGATIONS.get("seq-mean-token-mean")(out.per_token_loss, mask)
        return fn

    peer = run(verl)
    _close(run(ours(10.0)), peer)
    assert peer[1][0].abs().sum() == 0 and peer[1][1].abs().sum() > 0  # the clamped row gets no gradient
    unclamped = run(ours(None))
    assert not torch.allclose(unclamped[0], peer[0]) and unclamped[1][0].abs().sum() > 0


def test_verl_sapo_is_sapo_with_seq_mean_token_mean():
    """verl b178a3cd ``compute_policy_loss_sapo``: gate ``sigmoid(tau (r - 1)) 4 / tau`` times -A,
    always ``seq-mean-token-mean`` (fully masked rows left out): ``algo=sapo``."""
    def verl(lp):
        ratio = torch.exp(torch.clamp(lp - OLD, -20.0, 20.0))
        adv = ADV.unsqueeze(-1)
        taus = torch.where(adv > 0, torch.as_tensor(1.0, dtype=adv.dtype), torch.as_tensor(1.05, dtype=adv.dtype))
        return _verl_agg_loss(-torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus) * adv, "seq-mean-token-mean")
    _close(_mixrl("sapo", "seq-mean-token-mean", {"tau_pos": 1.0, "tau_neg": 1.05}), _peer(verl))


def test_trinity_topr_and_sapo_under_loss_agg_mode_token_mean():
    """Trinity (topr, sapo with its stopped gate): the per-token losses are mixrl's (``taper=token``,
    ``detach_gate``, tested by hand in test_peer_options.py); the validator aggregates them with
    ``algorithm.loss_agg_mode``, token-mean by default, so the rows add
    ``algo.aggregation.name=token-mean``. Here: Trinity's topr_policy_loss.py
    ``TOPRPolicyLossFn.__call__`` (``advantage_threshold`` 0; A = 0 tokens have loss 0 either
    way) with its own ``masked_mean``."""
    def trinity_topr(lp):
        ratio = torch.exp(lp - OLD)
        ratio_clamped = torch.clamp(ratio, min=0.0, max=1.0)
        rewards = ADV.unsqueeze(-1)
        alpha = torch.where(rewards <= 0.0, ratio_clamped, torch.ones_like(ratio))
        return _verl_agg_loss(-alpha.detach() * rewards * lp, "token-mean")
    _close(_mixrl("topr", "token-mean", {"taper": "token"}), _peer(trinity_topr))


@pytest.mark.parametrize("verl_type, estimator", [("low_var_kl", "k3_clamped"), ("k3", "k3_clamped"), ("kl", "k1"),
                                                  ("k1", "k1"), ("mse", "k2"), ("k2", "k2")])
def test_verl_kl_loss_types_are_mixrl_estimators(verl_type, estimator):
    """verl b178a3cd ``kl_penalty_forward``: k1, k2 (``0.5 (log r)^2``), and ``low_var_kl`` = ``k3``
    (log-ratio clamped to ±20, value to ±10), per token; the estimators of ``algo.kl.estimator``."""
    from mixrl.core.regularizers import KL_ESTIMATORS

    ref = OLD - torch.tensor([[0.3, -25.0, 2.0, 0.0], [1.0, -1.0, 14.0, 0.5], [0.0] * 4, [-0.2, 0.1, 0.0, 0.0]],
                             dtype=torch.float64)

    def verl(lp):
        if verl_type in ("kl", "k1"):
            kl = lp - ref
        elif verl_type in ("mse", "k2"):
            kl = 0.5 * (lp - ref).square()
        else:
            d = torch.clamp(ref - lp, min=-20, max=20)
            kl = torch.clamp(torch.exp(d) - d - 1, min=-10, max=10)
        return (kl * MASK).sum()

    logp = _logp()
    (KL_ESTIMATORS.get(estimator)(logp, ref) * MASK).sum().backward()
    value = (KL_ESTIMATORS.get(estimator)(logp.detach(), ref) * MASK).sum()
    _close((value, logp.grad), _peer(verl))


def test_trl_gmpo_is_gmpo_counting_fully_masked_rows():
    """TRL 1.16.0 ``trl/experimental/gmpo/gmpo_trainer.py`` ``_compute_loss``: log-space clip by
    the sign of the row's advantage (``torch.where(A > 0, min, max)``), geometric mean over the
    row, ``per_sequence_loss.mean()`` over every row: ``count_empty_rows``. The same gradient;
    the value differs by a constant: TRL's fully masked row keeps ``-A`` (its ratio is exp(0) = 1
    and its advantage is not masked), mixrl's adds 0."""
    def trl(lp):
        m = MASK.to(lp.dtype)
        log_ratio = lp - OLD
        clamped = torch.clamp(log_ratio, min=-0.4, max=0.4)
        a = ADV.unsqueeze(1)
        clipped = torch.where(a > 0, torch.minimum(log_ratio, clamped), torch.maximum(log_ratio, clamped))
        coef = torch.exp((clipped * m).sum(-1) / m.sum(-1).clamp(min=1.0))
        return (-coef * ADV).mean()
    value, grad = _mixrl("gmpo", "seq-mean-token-mean", {}, {"count_empty_rows": True})
    peer_value, peer_grad = _peer(trl)
    _close((value, grad), (peer_value + ADV[2] / 4, peer_grad))  # row 2 is the fully masked one
