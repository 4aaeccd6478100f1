"""The combined objective (mixrl.core.objective) against hand computation.

CHORD:  L = (1 - mu) * mean_{on-policy tokens} PPOclip + mu * mean_{expert tokens} -sg(phi(p)) log p
LUFFY:  L = mean_{all tokens} [ PPOclip on rollout tokens ; -A * p/(p+gamma) on expert tokens ]
Each case checks the value and d L / d logp per token, written out with plain floats.

The methods are written here as terms (the way conf/algo/*.yaml writes them) by
:func:`ObjectiveSpec`, a test-local shorthand; rows are tagged per row and expanded to
per-token provenance by :func:`compute_objective`.
"""

from __future__ import annotations

import math

import pytest
import torch

from mixrl.core import objective as core_objective
from mixrl.core.objective import Objective, TermSpec
from mixrl.core.provenance import EXPERT, ON_POLICY

POLICY = {"name": "ppo_clip"}
BOTH = ("on_policy", "expert")


def ObjectiveSpec(mix_mode="none", mu=0.0, token_weight="one", shaping_gamma=0.1, kl_coef=0.0, kl_estimator="k3",
                  entropy_coef=0.0, aggregation="token-mean"):
    """CHORD (aux_loss), LUFFY (group_inject), SFT and plain RL as terms."""
    agg = aggregation
    nll = {"token_weight": {"name": token_weight}}
    terms = {
        "none": [TermSpec("policy", "policy", ("on_policy",), None, 1.0, agg, {}, {"loss": POLICY})],
        "aux_loss": [TermSpec("policy", "policy", ("on_policy",), None, "1-mu", agg, {}, {"loss": POLICY}),
                     TermSpec("sft", "nll", ("expert",), None, "mu", agg, {}, nll)],
        "group_inject": [TermSpec("policy", "policy", ("on_policy",), BOTH, 1.0, agg, {}, {"loss": POLICY}),
                         TermSpec("offpolicy", "shaped", ("expert",), BOTH, 1.0, agg, {}, {"gamma": shaping_gamma})],
        "sft": [TermSpec("sft", "nll", ("expert",), None, 1.0, agg, {}, nll)],
    }[mix_mode]
    coefs = {"mu": mu}
    if kl_coef:
        terms.append(TermSpec("kl", "kl", ("on_policy",), None, kl_coef, agg, {}, {"estimator": kl_estimator}))
    if entropy_coef:
        coefs["entropy_coef"] = entropy_coef
        terms.append(TermSpec("entropy_bonus", "entropy", ("on_policy",), None, "-entropy_coef", "token-mean", {}, {}))
    return Objective(terms, coefs)


def compute_objective(spec, *, mask, row_source, normalisers=None, **kw):
    """Per-row sources expanded to per-token provenance; normalisers keyed by population."""
    token_source = row_source.unsqueeze(1).expand(mask.shape)
    if normalisers is not None:
        normalisers = {"on_policy": normalisers["on_policy"], "expert": normalisers["expert"],
                       "on_policy+expert": normalisers["all"]}
    return core_objective.compute_objective(spec, mask=mask, token_source=token_source, normalisers=normalisers, **kw)

# two rows x three tokens; row 0 on-policy (3 tokens), row 1 expert (2 tokens + pad)
LOGP = [[-0.1, -0.7, -1.2], [-0.5, -2.0, -9.0]]
OLD = [[-0.3, -0.7, -0.9], [-0.5, -2.0, -9.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
ADV = [1.5, -0.5]


def _tensors(source=(ON_POLICY, EXPERT)):
    logp = torch.tensor(LOGP, requires_grad=True)
    return logp, torch.tensor(OLD), torch.tensor(MASK), torch.tensor(ADV), torch.tensor(source)


def _ppo_token(lp, old, a, eps=0.2):
    r = math.exp(lp - old)
    unclipped, clipped = r * a, min(max(r, 1 - eps), 1 + eps) * a
    loss = -min(unclipped, clipped)
    grad = -a * r if unclipped <= clipped else 0.0  # d(-r*A)/dlogp = -A*r when the unclipped term is active
    return loss, grad


def test_pure_on_policy_token_mean_value_and_gradient():
    logp, old, mask, adv, _ = _tensors()
    src = torch.tensor([ON_POLICY, ON_POLICY])
    loss, metrics = compute_objective(ObjectiveSpec(), logp=logp, old_logp=old, mask=mask, advantages=adv, row_source=src)
    per, grads = [], {}
    for b in range(2):
        for t in range(3):
            if MASK[b][t]:
                l, g = _ppo_token(LOGP[b][t], OLD[b][t], ADV[b])
                per.append(l)
                grads[(b, t)] = g
    n = len(per)  # 5 tokens
    assert loss.item() == pytest.approx(sum(per) / n, rel=1e-6)
    loss.backward()
    for (b, t), g in grads.items():
        assert logp.grad[b, t].item() == pytest.approx(g / n, rel=1e-5, abs=1e-7)
    assert logp.grad[1, 2].item() == 0.0
    # token 0: r = e^0.2 = 1.2214 > 1.2 with A > 0 -> clipped
    assert metrics["clip_frac"] == pytest.approx(1 / 5)


def test_chord_aux_loss_value_and_gradient():
    logp, old, mask, adv, src = _tensors()
    mu = 0.3
    spec = ObjectiveSpec(mix_mode="aux_loss", mu=mu, token_weight="chord_phi")
    loss, metrics = compute_objective(spec, logp=logp, old_logp=old, mask=mask, advantages=adv, row_source=src)
    rl_terms = [_ppo_token(LOGP[0][t], OLD[0][t], ADV[0]) for t in range(3)]
    rl = sum(l for l, _ in rl_terms) / 3
    p = [math.exp(x) for x in LOGP[1][:2]]
    phi = [q * (1 - q) for q in p]
    sft = sum(-w * lp for w, lp in zip(phi, LOGP[1][:2])) / 2
    assert loss.item() == pytest.approx((1 - mu) * rl + mu * sft, rel=1e-6)
    assert metrics["loss/sft"] == pytest.approx(sft, rel=1e-6)
    assert metrics["mu"] == pytest.approx(mu)
    loss.backward()
    for t in range(3):
        assert logp.grad[0, t].item() == pytest.approx((1 - mu) * rl_terms[t][1] / 3, rel=1e-5, abs=1e-7)
    for t in range(2):  # phi is detached: d/dlogp of -mu * phi * logp / 2 = -mu * phi / 2
        assert logp.grad[1, t].item() == pytest.approx(-mu * phi[t] / 2, rel=1e-5)
    assert metrics["expert/token_prob"] == pytest.approx(sum(p) / 2, rel=1e-6)


def test_chord_mu_follows_its_schedule():
    logp, old, mask, adv, src = _tensors()
    spec = ObjectiveSpec(mix_mode="aux_loss", mu={"name": "cosine", "warmup": 4, "peak": 0.8, "decay": 10, "valley": 0.0}, token_weight="one")
    _, m2 = compute_objective(spec, logp=logp, old_logp=old, mask=mask, advantages=adv, row_source=src, step=2)
    _, m9 = compute_objective(spec, logp=logp, old_logp=old, mask=mask, advantages=adv, row_source=src, step=9)
    assert m2["mu"] == pytest.approx(0.8 * 2 / 4)  # linear warm-up
    # cosine from 0.8 to 0.0 over 10 steps, 5 steps in: 0.8 * (1 + cos(pi/2)) / 2
    assert m9["mu"] == pytest.approx(0.8 * (1 + math.cos(math.pi * 5 / 10)) / 2)


def test_luffy_group_inject_value_and_gradient():
    logp, old, mask, adv, src = _tensors()
    gamma = 0.1
    spec = ObjectiveSpec(mix_mode="group_inject", shaping_gamma=gamma)
    loss, _ = compute_objective(spec, logp=logp, old_logp=old, mask=mask, advantages=adv, row_source=src)
    rl_terms = [_ppo_token(LOGP[0][t], OLD[0][t], ADV[0]) for t in range(3)]
    p = [math.exp(x) for x in LOGP[1][:2]]
    exp_terms = [-ADV[1] * q / (q + gamma) for q in p]
    n = 5  # all tokens of both rows share one token-mean
    assert loss.item() == pytest.approx((sum(l for l, _ in rl_terms) + sum(exp_terms)) / n, rel=1e-6)
    loss.backward()
    for t in range(2):  # d/dlogp [-A p/(p+g)] = -A * g p / (p+g)^2 ; no clipping on expert tokens
        assert logp.grad[1, t].item() == pytest.approx(-ADV[1] * gamma * p[t] / (p[t] + gamma) ** 2 / n, rel=1e-5)


def test_sft_mode_is_plain_nll_on_expert_rows():
    logp, old, mask, adv, _ = _tensors()
    src = torch.tensor([EXPERT, EXPERT])
    loss, _ = compute_objective(ObjectiveSpec(mix_mode="sft"), logp=logp, old_logp=old, mask=mask, advantages=adv, row_source=src)
    toks = [LOGP[b][t] for b in range(2) for t in range(3) if MASK[b][t]]
    assert loss.item() == pytest.approx(-sum(toks) / len(toks), rel=1e-6)


def test_kl_and_entropy_terms_apply_to_on_policy_rows_only():
    logp, old, mask, adv, src = _tensors()
    ref = torch.tensor([[-0.2, -0.5, -1.0], [-3.0, -3.0, -3.0]])
    ent = torch.tensor([[1.0, 2.0, 3.0], [10.0, 10.0, 10.0]])
    base, _ = compute_objective(ObjectiveSpec(mix_mode="aux_loss", mu=0.0), logp=logp, old_logp=old, mask=mask, advantages=adv, row_source=src)
    spec = ObjectiveSpec(mix_mode="aux_loss", mu=0.0, kl_coef=0.5, kl_estimator="k3", entropy_coef=0.01)
    loss, metrics = compute_objective(spec, logp=logp, old_logp=old, mask=mask, advantages=adv, row_source=src, ref_logp=ref, entropies=ent)
    k3 = [math.exp(r - l) - (r - l) - 1 for r, l in zip(ref[0].tolist(), LOGP[0])]
    kl = sum(k3) / 3
    assert metrics["loss/kl"] == pytest.approx(kl, rel=1e-5)
    assert metrics["entropy"] == pytest.approx(2.0)  # expert rows' entropy 10 is excluded
    assert loss.item() == pytest.approx(base.item() + 0.5 * kl - 0.01 * 2.0, rel=1e-5)


def _random_batch(seed, rows=8, width=5):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(rows, width, generator=g) * 3
    old = logp + 0.3 * torch.randn(rows, width, generator=g)
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    adv = torch.randn(rows, generator=g)
    src = torch.tensor([ON_POLICY, EXPERT] * (rows // 2))
    return logp, old, mask, adv, src


def _counts(mask, src):
    exp = (src == EXPERT).float()[:, None]
    out = {}
    for k, m in (("on_policy", mask * (1 - exp)), ("expert", mask * exp), ("all", mask.float())):
        out[k] = (float(m.sum()), float((m.sum(-1) > 0).sum()))
    return out


@pytest.mark.parametrize("mode", ["aux_loss", "group_inject", "none"])
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_gradient_is_invariant_to_accumulation_and_processes(mode, aggregation):
    """One full batch == two accumulated micro-batches == two 'processes' whose gradients
    DDP averages, when each micro-batch divides by the global counts (scaled by 1/W)."""
    logp, old, mask, adv, src = _random_batch(0)
    spec = ObjectiveSpec(mix_mode=mode, mu=0.4, token_weight="chord_phi", aggregation=aggregation)

    def grad(parts, world=1):
        total = torch.zeros_like(logp)
        for idx in parts:
            x = logp[idx].clone().requires_grad_(True)
            counts = {k: (t / world, r / world) for k, (t, r) in _counts(mask, src).items()}
            loss, _ = compute_objective(spec, logp=x, old_logp=old[idx], mask=mask[idx], advantages=adv[idx], row_source=src[idx], normalisers=counts)
            loss.backward()
            total[idx] += x.grad
        return total

    full = grad([torch.arange(8)])
    accumulated = grad([torch.tensor([0, 3, 4, 7]), torch.tensor([1, 2, 5, 6])])
    # two processes: each holds half the rows; DDP averages the two gradients (sum / W)
    ddp = grad([torch.arange(4), torch.arange(4, 8)], world=2) / 2
    torch.testing.assert_close(accumulated, full, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ddp, full, rtol=1e-5, atol=1e-7)


def test_chord_balance_does_not_depend_on_how_expert_rows_are_split():
    """mu alone sets the RL:SFT balance: a micro-batch split that puts all expert rows in
    one micro-batch gives the same total loss as the full batch."""
    logp, old, mask, adv, src = _random_batch(1)
    spec = ObjectiveSpec(mix_mode="aux_loss", mu=0.25, token_weight="one")
    counts = _counts(mask, src)
    full, _ = compute_objective(spec, logp=logp, old_logp=old, mask=mask, advantages=adv, row_source=src, normalisers=counts)
    experts = (src == EXPERT).nonzero().flatten()
    others = (src != EXPERT).nonzero().flatten()
    parts = sum(
        compute_objective(spec, logp=logp[i], old_logp=old[i], mask=mask[i], advantages=adv[i], row_source=src[i], normalisers=counts)[0]
        for i in (experts, others)
    )
    assert parts.item() == pytest.approx(full.item(), rel=1e-6)


def test_empty_expert_or_on_policy_rows_give_finite_loss():
    logp, old, mask, adv, _ = _tensors()
    for src in ([ON_POLICY, ON_POLICY], [EXPERT, EXPERT]):
        for mode in ("aux_loss", "group_inject"):
            loss, _ = compute_objective(ObjectiveSpec(mix_mode=mode, mu=0.5), logp=logp, old_logp=old, mask=mask, advantages=adv, row_source=torch.tensor(src))
            assert torch.isfinite(loss)
