"""MinPRO, ETR and R²VPO vs hand computations (plain python from each formula), and the
vcpo_ess / r2vpo_dual controllers vs hand-computed ESS, learning-rate scales and dual steps.

Each loss test builds logp = old + log r as a leaf; the expected per-token loss and d loss / d logp
are written out with ``math`` (no call into mixrl), padded positions hold NaN / -inf.
"""

import math

import pytest
import torch

from mixrl.core import CONTROLLERS, POLICY_LOSSES
from mixrl.trainer.parts.controller_steps import ControllerSteps

OLD = [[-1.0, -2.0, -0.5, -0.3], [-0.7, -1.2, -0.9, float("nan")]]
MASK = [[1, 1, 1, 1], [1, 1, 1, 0]]
LR = [[0.1, -0.4, 0.3, -0.2], [0.5, -0.3, 0.2, float("-inf")]]  # log r; padding holds -inf
ADV = [0.5, -1.5]


def run(name, lr=LR, adv=ADV, mask=MASK, old=OLD, **params):
    old_t = torch.tensor(old, dtype=torch.float64)
    logp = (old_t + torch.tensor(lr, dtype=torch.float64)).detach().requires_grad_(True)
    out = POLICY_LOSSES.get(name)(logp, old_t, torch.tensor(adv, dtype=torch.float64), torch.as_tensor(mask), **params)
    out.per_token_loss.sum().backward()
    return out, logp.grad


def check(out, grad, exp_loss, exp_grad, tol=1e-9):
    for got, exp in ((out.per_token_loss.detach().tolist(), exp_loss), (grad.tolist(), exp_grad)):
        for a, b in zip(got, exp):
            assert a == pytest.approx(b, abs=tol), (got, exp)


# ---------------------------------------------------------------- minpro
def test_minpro_weights_each_token_by_the_minimum_ratio_of_its_prefix():
    out, grad = run("minpro")
    loss, g = [], []
    for i, row in enumerate(LR):
        lrow, grow, prefix = [], [], []
        for t, x in enumerate(row):
            if not MASK[i][t]:
                lrow.append(0.0)
                grow.append(0.0)
                continue
            m = min(math.exp(v) for v in prefix) if prefix else 1.0  # m_1 = 1: empty prefix
            r = math.exp(x)
            lrow.append(-m * ADV[i] * r)
            grow.append(-m * ADV[i] * r)  # d r / d logp = r; m is stopped
            prefix.append(x)
        loss.append(lrow)
        g.append(grow)
    check(out, grad, loss, g)
    # row 0: weights 1, e^0.1, e^-0.4, e^-0.4 (the running minimum, the token itself excluded)
    assert loss[0][2] == pytest.approx(-0.5 * math.exp(-0.4) * math.exp(0.3))
    # e^-0.4 = 0.67 > 0.5: nothing marked clipped
    assert not out.clipped.any()


def test_minpro_cap_and_token_clip():
    out, grad = run("minpro", weight_max=1.0, clip_low=0.2, clip_high=0.2)
    # row 1 (A = -1.5): weights 1, min(e^0.5, 1) = 1, min(e^-0.3, 1) = e^-0.3
    # token 0: r = e^0.5 = 1.65 > 1.2, A < 0: max(-A r, -A 1.2) = 1.5 r (unclipped branch, gradient kept)
    assert out.per_token_loss[1, 0].item() == pytest.approx(1.5 * math.exp(0.5))
    # token 1: r = e^-0.3 = 0.74 < 0.8, A < 0: max(1.5 r, 1.5 * 0.8) = 1.2, constant: zero gradient
    assert out.per_token_loss[1, 1].item() == pytest.approx(1.0 * 1.5 * 0.8)
    assert grad[1, 1].item() == 0.0 and bool(out.clipped[1, 1])
    # token 2: weight e^-0.3 times 1.5 e^0.2 (inside the clip)
    assert out.per_token_loss[1, 2].item() == pytest.approx(math.exp(-0.3) * 1.5 * math.exp(0.2))
    with pytest.raises(ValueError, match="both"):
        run("minpro", clip_low=0.2)


# ---------------------------------------------------------------- etr
def test_etr_bounds_widen_with_the_advantage_magnitude():
    alpha, eps = 0.5, 0.2
    lr = [[0.25, -0.3, 0.05, 0.0], [0.25, -0.3, 0.5, float("-inf")]]
    out, grad = run("etr", lr=lr, clip_low=eps, clip_high=eps, alpha=alpha)
    loss, g = [], []
    for i, row in enumerate(lr):
        a = ADV[i]
        e = eps * (1 + alpha * abs(a))  # row 0: 0.25, row 1: 0.35
        lrow, grow = [], []
        for t, x in enumerate(row):
            if not MASK[i][t]:
                lrow.append(0.0)
                grow.append(0.0)
                continue
            r = math.exp(x)
            l1, l2 = -a * r, -a * min(max(r, 1 - e), 1 + e)
            lrow.append(max(l1, l2))
            grow.append(-a * r if l1 >= l2 else 0.0)
        loss.append(lrow)
        g.append(grow)
    check(out, grad, loss, g)
    # r = e^0.25 = 1.284: clipped for row 0 (A = 0.5, bound 1.25), not for row 1's wider... A < 0 side
    assert bool(out.clipped[0, 0]) and not bool(out.clipped[1, 0])
    # r = e^-0.3 = 0.741 with A = -1.5: bound 1 - 0.35 = 0.65, inside: gradient kept (GRPO's 0.8 would cut it)
    assert grad[1, 1].item() == pytest.approx(1.5 * math.exp(-0.3))
    assert out.metrics["clip_high_mean"].item() == pytest.approx((4 * 0.25 + 3 * 0.35) / 7)


def test_etr_alpha_zero_is_ppo_clip():
    a, ga = run("etr", alpha=0.0)
    b, gb = run("ppo_clip")
    assert torch.allclose(a.per_token_loss, b.per_token_loss) and torch.allclose(ga, gb)


# ---------------------------------------------------------------- r2vpo
def test_r2vpo_adds_the_ratio_variance_with_its_gradient():
    lam = 2.0
    out, grad = run("r2vpo", var_coef=lam)
    rs = [math.exp(x) for i, row in enumerate(LR) for t, x in enumerate(row) if MASK[i][t]]
    rbar = sum(rs) / len(rs)
    loss, g = [], []
    for i, row in enumerate(LR):
        lrow, grow = [], []
        for t, x in enumerate(row):
            if not MASK[i][t]:
                lrow.append(0.0)
                grow.append(0.0)
                continue
            r = math.exp(x)
            lrow.append(-ADV[i] * r + lam * (r - rbar) ** 2)
            grow.append(-ADV[i] * r + 2 * lam * (r - rbar) * r)  # rbar stopped
        loss.append(lrow)
        g.append(grow)
    check(out, grad, loss, g)
    var = sum((r - rbar) ** 2 for r in rs) / len(rs)
    assert out.metrics["ratio_var"].item() == pytest.approx(var)
    # the token mean of the penalty is lam * Var(r); with the mean's gradient included the total
    # gradient is the same (it sums to zero): check against autograd through an unstopped mean
    x = torch.tensor([v for v in rs], dtype=torch.float64).log().requires_grad_(True)
    r = x.exp()
    (lam * ((r - r.mean()) ** 2).mean() * len(rs)).backward()
    pen = [2 * lam * (rv - rbar) * rv for rv in rs]
    assert x.grad.tolist() == pytest.approx(pen)


def test_padding_gets_zero_loss_and_gradient():
    for name in ("minpro", "etr", "r2vpo"):
        out, grad = run(name)
        assert out.per_token_loss[1, 3].item() == 0.0 and grad[1, 3].item() == 0.0, name
        assert torch.isfinite(out.per_token_loss).all() and torch.isfinite(grad).all(), name


# ---------------------------------------------------------------- controllers
def _ratio_mask():
    ratio = torch.tensor(LR, dtype=torch.float64).nan_to_num(neginf=0.0).exp()
    return ratio, torch.tensor(MASK, dtype=torch.float64)


def test_vcpo_ess_learning_rate_scale_by_hand():
    ratio, mask = _ratio_mask()
    w = [math.exp(sum(x for x, m in zip(row, mrow) if m)) for row, mrow in zip(LR, MASK)]  # e^-0.2, e^0.4
    ess = sum(w) ** 2 / (sum(v * v for v in w) + 1e-8)
    c = CONTROLLERS.get("vcpo_ess")()
    c.step({"ratio": ratio, "mask": mask})
    assert c.ess_ratio == pytest.approx(ess / 2)
    assert c.knobs()["optimizer.lr_scale"] == pytest.approx(math.sqrt(ess / 2))
    lin = CONTROLLERS.get("vcpo_ess")(scaling_rule="linear", base_ess_ratio=0.5)
    lin.step({"ratio": ratio, "mask": mask})
    assert lin.lr_scale == pytest.approx(min(1.0, (ess / 2) / 0.5))  # 0.96 / 0.5 > 1: unscaled
    # fresh rows (r = 1): ESS = N, scale 1
    fresh = CONTROLLERS.get("vcpo_ess")()
    fresh.step({"ratio": torch.ones(3, 4), "mask": torch.ones(3, 4)})
    assert fresh.lr_scale == pytest.approx(1.0, abs=1e-6)
    # one row dominating: w = (e^5, 1, 1): ESS / N = (e^5 + 2)^2 / (3 (e^10 + 2))
    r = torch.ones(3, 2)
    r[0, 0] = math.exp(5.0)
    fresh.step({"ratio": r, "mask": torch.ones(3, 2)})
    e = (math.exp(5) + 2) ** 2 / (3 * (math.exp(10) + 2))
    assert fresh.lr_scale == pytest.approx(math.sqrt(e), rel=1e-6)
    # a reduce sums the statistics over processes: two identical processes give the same ratio
    twice = CONTROLLERS.get("vcpo_ess")()
    twice.step({"ratio": ratio, "mask": mask}, reduce=lambda t: 2 * t)
    assert twice.ess_ratio == pytest.approx(ess / 2)
    with pytest.raises(ValueError, match="scaling_rule"):
        CONTROLLERS.get("vcpo_ess")(scaling_rule="cube")


def test_r2vpo_dual_ascent_by_hand():
    ratio, mask = _ratio_mask()
    rs = [math.exp(x) for i, row in enumerate(LR) for t, x in enumerate(row) if MASK[i][t]]
    var = sum(r * r for r in rs) / len(rs) - (sum(rs) / len(rs)) ** 2
    c = CONTROLLERS.get("r2vpo_dual")(delta=0.01, dual_lr=2.0, coef_init=0.5, coef_max=10.0)
    c.step({"ratio": ratio, "mask": mask})
    assert c.variance == pytest.approx(var)
    assert c.knobs()["loss.var_coef"] == pytest.approx(0.5 + 2.0 * (var - 0.01))
    # on-policy (Var = 0): the multiplier falls by dual_lr * delta per step, never below 0
    on = CONTROLLERS.get("r2vpo_dual")(delta=0.3, dual_lr=1.0, coef_init=0.5)
    on.step({"ratio": torch.ones(2, 3), "mask": torch.ones(2, 3)})
    assert on.coef == pytest.approx(0.2)
    on.step({"ratio": torch.ones(2, 3), "mask": torch.ones(2, 3)})
    assert on.coef == 0.0
    state = c.state_dict()
    d = CONTROLLERS.get("r2vpo_dual")()
    d.load_state_dict(state)
    assert d.coef == c.coef and d.num_updates == 1


def test_controller_steps_scales_the_learning_rate_for_one_step():
    """vcpo_ess through ControllerSteps: the optimizer's lr is the scheduler's times the scale,
    without compounding when the scheduler has not reset it in between."""
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    part = ControllerSteps(CONTROLLERS.get("vcpo_ess")(scaling_rule="linear"), policy_tokens=("on_policy",),
                           reduce_sum=None, reduce_mean=lambda t: t, gather=lambda t: t, device="cpu",
                           param_groups=lambda: opt.param_groups)
    part.controller.update(torch.tensor([2.0, 4.0, 2.0], dtype=torch.float64))  # ESS 1 of 2: scale 0.5
    part.scale_lr(part.controller.lr_scale)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    part.scale_lr(0.5)  # no scheduler step in between: still 0.1 * 0.5
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    opt.step()
    sched.step()  # the scheduler writes its own value back
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)
    part.scale_lr(0.25)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.025)


# ---------------------------------------------------------------- SFPO's reposition
def test_reposition_interpolates_back_before_the_slow_step():
    from mixrl.trainer.reposition import Reposition

    model = torch.nn.Linear(2, 1, bias=False)
    frozen = torch.nn.Parameter(torch.ones(1), requires_grad=False)
    model.register_parameter("frozen", frozen)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
    rep = Reposition(alpha=0.25, cycle=4)  # 3 fast steps, reposition before step 3, slow step 3
    assert not rep.step_begin(model, 0)  # snapshot theta_0 = (1, 2)
    for step, new in ((1, [3.0, 2.0]), (2, [5.0, 6.0])):
        with torch.no_grad():
            model.weight.copy_(torch.tensor([new]))  # what the fast optimizer steps did
        assert not rep.step_begin(model, step)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[9.0, 10.0]]))  # theta_3 after the third fast step
    assert rep.step_begin(model, 3)
    # theta_0 + 0.25 (theta_3 - theta_0) = (1 + 0.25 * 8, 2 + 0.25 * 8) = (3, 4)
    assert model.weight.tolist() == [[3.0, 4.0]]
    assert rep.last_shift == pytest.approx(math.sqrt(64 + 64))
    assert model.frozen.item() == 1.0
    # the next batch: a fresh snapshot at step 4; no snapshot (resumed mid-batch) -> no move
    late = Reposition(alpha=0.5, cycle=4)
    assert not late.step_begin(model, 7) and model.weight.tolist() == [[3.0, 4.0]]
    assert not Reposition(alpha=0.5, cycle=1).step_begin(model, 0)
    with pytest.raises(ValueError, match="alpha"):
        Reposition(alpha=1.5, cycle=4)


# ---------------------------------------------------------------- ALP's layer perturbation
class FooLayer(torch.nn.Module):
    def forward(self, hidden_states, scale=1.0):
        return hidden_states * scale


class Foo(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([FooLayer(), FooLayer()])

    def forward(self, h, by_keyword=False):
        for layer in self.layers:
            h = layer(hidden_states=h) if by_keyword else layer(h)
        return h


def test_layer_perturbation_adds_scaled_noise_only_in_gradient_forwards():
    from mixrl.trainer.perturbation import LayerPerturbation

    model = Foo()
    h = torch.tensor([[[3.0, 4.0], [1.0, -1.0]]])  # rms per token: sqrt(12.5), 1
    sigma = 0.1
    gen = torch.Generator().manual_seed(7)
    alp = LayerPerturbation(sigma=sigma, generator=gen)
    assert alp.attach(model) == 2
    with torch.no_grad():  # behaviour / old / reference log-probs: unperturbed
        assert torch.equal(model(h), h)
    model.eval()
    assert torch.equal(model(h), h)
    model.train()
    for by_keyword in (False, True):
        gen.manual_seed(7)
        out = model(h.clone().requires_grad_(True), by_keyword=by_keyword)
        # by hand: two layers, each adds sigma * rms(its input) * eps, eps drawn in order
        ref = torch.Generator().manual_seed(7)
        x = h.clone()
        for _ in range(2):
            eps = torch.randn(x.shape, generator=ref)
            rms = x.pow(2).mean(-1, keepdim=True).sqrt()
            x = x + sigma * rms * eps
        assert torch.allclose(out, x, atol=1e-6), by_keyword
    # the gradient flows through h as the identity plus the noise's rms factor held constant
    gen.manual_seed(7)
    leaf = h.clone().requires_grad_(True)
    model(leaf).sum().backward()
    assert torch.allclose(leaf.grad, torch.ones_like(h))
    alp.detach()
    assert torch.equal(model(h), h)
    with pytest.raises(ValueError, match="sigma"):
        LayerPerturbation(sigma=0.0)
