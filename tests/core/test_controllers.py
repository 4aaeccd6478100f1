"""Controllers: a few updates by hand, and state_dict round trips."""

import pytest
import torch

from mixrl.core import CONTROLLERS, POLICY_LOSSES


def contributions(ratios, advs, lo, hi):
    pos = sum(a * min(r, hi) for r, a in zip(ratios, advs) if a > 0)
    neg = sum(-a * max(r, lo) for r, a in zip(ratios, advs) if a < 0)
    return pos, neg


#: mixrl's earlier search (once per step, both bounds per round, steps 0.02 / 0.05): the override
#: algo.controller.search=joint algo.controller.every=step algo.controller.step_low=0.02
JOINT = {"search": "joint", "every": "step", "step_low": 0.02, "step_high": 0.05}


def test_bapo_widens_bounds_until_positive_share_reaches_rho0():
    ratios = [3.0, 1.0, 0.7, 1.0]
    advs = [1.0, -1.0, -1.0, 0.0]
    ctrl = CONTROLLERS.get("bapo")(**JOINT)  # rho0 0.5, [0.6, 0.9] step 0.02, [1.2, 3.0] step 0.05
    # by hand: start (0.6, 1.2): pos 1.2, neg 1.0 + 0.7 = 1.7, share 0.41 < 0.5.
    # step i raises both: lo = 0.6 + 0.02 i, hi = 1.2 + 0.05 i; the 0.7 token is lifted to lo
    # once lo > 0.7. i = 13: pos 1.85, neg 1.86 (< 0.5); i = 14: pos 1.9, neg 1.88 -> share 0.503.
    pos, neg = contributions(ratios, advs, 0.6 + 0.02 * 13, 1.2 + 0.05 * 13)
    assert pos / (pos + neg) < 0.5
    pos, neg = contributions(ratios, advs, 0.6 + 0.02 * 14, 1.2 + 0.05 * 14)
    assert pos / (pos + neg) >= 0.5
    clip_low, clip_high = ctrl.update(
        torch.tensor([ratios]), torch.tensor([advs]), torch.ones(1, 4, dtype=torch.bool)
    )
    assert (clip_low, clip_high) == pytest.approx((1 - 0.88, 1.9 - 1))
    assert ctrl.ratio_low == pytest.approx(0.88) and ctrl.ratio_high == pytest.approx(1.9)
    assert ctrl.rho == pytest.approx(1.9 / (1.9 + 1.88))
    # the epsilons plug straight into ppo_clip
    out = POLICY_LOSSES.get("ppo_clip")(torch.zeros(1, 4), torch.zeros(1, 4), torch.ones(1),
                                        torch.ones(1, 4), clip_low=clip_low, clip_high=clip_high)
    assert out.per_token_loss.shape == (1, 4)


def test_bapo_no_change_when_balanced_and_saturates_when_not():
    ctrl = CONTROLLERS.get("bapo")(**JOINT)
    mask = torch.ones(1, 2)
    # positive-dominated: bounds stay at (low_min, high_min)
    assert ctrl.update(torch.tensor([[1.0, 1.0]]), torch.tensor([[2.0, -1.0]]), mask) == pytest.approx((0.4, 0.2))
    # hopelessly negative-dominated: both bounds end at their maxima
    out = ctrl.update(torch.tensor([[1.0, 1.0]]), torch.tensor([[0.1, -5.0]]), mask)
    assert out == pytest.approx((1 - 0.9, 3.0 - 1))
    pos, neg = contributions([1.0, 1.0], [0.1, -5.0], 0.9, 3.0)
    assert ctrl.rho == pytest.approx(pos / (pos + neg))
    # masked tokens do not count; no signed tokens at all -> share 1
    assert ctrl.update(torch.tensor([[1.0, 1.0]]), torch.tensor([[0.1, -5.0]]),
                       torch.tensor([[1, 0]])) == pytest.approx((0.4, 0.2))


def test_bapo_reduce_hook_and_per_row_advantages():
    ctrl = CONTROLLERS.get("bapo")(rho0=0.6, **JOINT)
    calls = []

    def reduce(stats):
        calls.append(stats.clone())
        return stats * 2  # e.g. an all-reduce over two identical ranks: same share

    out = ctrl.update(torch.tensor([[1.0, 1.0], [1.0, 1.0]]), torch.tensor([1.0, -1.0]),
                      torch.ones(2, 2), reduce=reduce)
    assert calls and calls[0].tolist() == pytest.approx([2.0, 2.0])
    assert out[1] > 0.2  # share 0.5 < 0.6 at the start: the bounds moved


def test_bapo_state_dict_round_trip():
    a = CONTROLLERS.get("bapo")()
    a.update(torch.tensor([[3.0, 1.0, 0.7]]), torch.tensor([[1.0, -1.0, -1.0]]), torch.ones(1, 3))
    b = CONTROLLERS.get("bapo")()
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict()
    assert (b.clip_low, b.clip_high) == (a.clip_low, a.clip_high)
    assert set(a.metrics()) == {"bapo/ratio_low", "bapo/ratio_high", "bapo/positive_share"}


def test_bapo_rejects_bad_ranges():
    with pytest.raises(ValueError):
        CONTROLLERS.get("bapo")(low_min=0.9, low_max=0.6)


def test_entropic_pi_updates_by_hand():
    ctrl = CONTROLLERS.get("entropic")(target=0.5, kp=1.0, ki=0.5, coef_min=-1.0, coef_max=1.0)
    # e = 0.2, I = 0.2 -> 0.2 + 0.1; e = 0.1, I = 0.3 -> 0.1 + 0.15; e = -0.5, I = -0.2 -> -0.6
    assert ctrl.update(0.3) == pytest.approx(0.3)
    assert ctrl.update(0.4) == pytest.approx(0.25)
    assert ctrl.update(1.0) == pytest.approx(-0.6)
    # e = -2.5, I = -2.7 -> -3.85 clamped to -1
    assert ctrl.update(3.0) == pytest.approx(-1.0)
    assert ctrl.integral == pytest.approx(-2.7)


def test_entropic_anti_windup_and_state_round_trip():
    ctrl = CONTROLLERS.get("entropic")(target=1.0, kp=0.0, ki=1.0, integral_limit=0.5)
    assert ctrl.update(0.0) == pytest.approx(0.5)  # I = 1 clamped to 0.5
    clone = CONTROLLERS.get("entropic")(target=1.0, kp=0.0, ki=1.0, integral_limit=0.5)
    clone.load_state_dict(ctrl.state_dict())
    assert clone.state_dict() == ctrl.state_dict()
    assert clone.update(1.5) == ctrl.update(1.5) == pytest.approx(0.0)  # I = 0.5 - 0.5


# ----------------------------------------------------------------------------- BAPO, the authors' search
# The authors' loop (WooooDyy/BAPO @ 7287044, recipe/bapo/policy_loss.py:117-152), by hand:
# lo, hi = start; while pos/neg < target and lo < lo_max: lo = min(lo + step, lo_max);
# then while still unmet and hi < hi_max: hi = min(hi + step, hi_max); pos = sum_{A>=0} A min(r, hi),
# neg = sum_{A<0} -A max(r, lo); target 1.0 (a share rho0 = 0.5).

def _batch(ratios, advs):
    return torch.tensor([ratios], dtype=torch.float64), torch.tensor([advs], dtype=torch.float64), torch.ones(1, len(ratios))


def test_bapo_sequential_raises_lower_bound_to_its_max_first_then_upper():
    ctrl = CONTROLLERS.get("bapo")()  # the authors': sequential, [0.6, 0.9] / [1.2, 3.0], steps 0.05 / 0.05
    assert (ctrl.search, ctrl.every, ctrl.step_low, ctrl.step_high) == ("sequential", "micro_batch", 0.05, 0.05)
    ratios, advs = [1.5, 1.0], [1.0, -1.28]
    # start (0.6, 1.2): pos 1.2, neg 1.28 -> 0.94 < 1. Lower loop: lo 0.65 .. 0.9, neg stays 1.28
    # (r = 1.0 > lo), unmet at every step -> lo ends at 0.9. Upper loop: hi 1.25 -> pos 1.25 < 1.28;
    # hi 1.30 -> pos 1.30 >= 1.28, stop. Bounds (0.9, 1.3).
    for lo in (0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9):
        assert contributions(ratios, advs, lo, 1.2) == pytest.approx((1.2, 1.28))
    assert contributions(ratios, advs, 0.9, 1.25)[0] < 1.28 <= contributions(ratios, advs, 0.9, 1.3)[0]
    out = ctrl.update(*_batch(ratios, advs))
    assert (ctrl.ratio_low, ctrl.ratio_high) == pytest.approx((0.9, 1.3))
    assert out == pytest.approx((1 - 0.9, 1.3 - 1))
    assert ctrl.rho == pytest.approx(1.3 / (1.3 + 1.28))
    # mixrl's earlier joint search stops the lower bound at 0.7 on the same batch (round 2: (0.7, 1.3))
    joint = CONTROLLERS.get("bapo")(search="joint", step_low=0.05, step_high=0.05)
    joint.update(*_batch(ratios, advs))
    assert (joint.ratio_low, joint.ratio_high) == pytest.approx((0.7, 1.3))


def test_bapo_sequential_lower_bound_lifts_negative_side_and_saturation():
    ctrl = CONTROLLERS.get("bapo")()
    ratios, advs = [3.0, 1.0, 0.7], [1.0, -1.0, -1.1]
    # lower loop: lo 0.6 -> 0.9, neg = 1 + 1.1 max(0.7, lo) grows to 1 + 0.99 = 1.99, pos 1.2: unmet.
    # upper loop: pos = min(3, hi) >= 1.99 first at hi = 2.0 (1.95 < 1.99). Bounds (0.9, 2.0).
    assert contributions(ratios, advs, 0.9, 1.95)[0] < 1.99 <= contributions(ratios, advs, 0.9, 2.0)[0]
    ctrl.update(*_batch(ratios, advs))
    assert (ctrl.ratio_low, ctrl.ratio_high) == pytest.approx((0.9, 2.0))
    # met at the start: bounds stay (0.6, 1.2); hopeless: both end at their maxima (0.9, 3.0)
    ctrl.update(*_batch([1.0, 1.0], [2.0, -1.0]))
    assert (ctrl.ratio_low, ctrl.ratio_high) == pytest.approx((0.6, 1.2))
    ctrl.update(*_batch([1.0, 1.0], [0.1, -5.0]))
    assert (ctrl.ratio_low, ctrl.ratio_high) == pytest.approx((0.9, 3.0))
    assert ctrl.rho == pytest.approx(0.1 / (0.1 + 5.0))
    with pytest.raises(ValueError, match="search"):
        CONTROLLERS.get("bapo")(search="both")
    with pytest.raises(ValueError, match="every"):
        CONTROLLERS.get("bapo")(every="epoch")


def test_bapo_dual_clip_of_the_preset_by_hand():
    # the authors' loss (policy_loss.py:163-176): A < 0, r = 5, bounds (0.9, 2.0):
    # max(-A r, -A clamp(r, 0.9, 2.0)) = max(5, 2) = 5, dual clip min(5, -3 A) = 3
    from mixrl.config.compose import compose_config

    cfg = compose_config(["algo=bapo"])
    assert cfg.algo.loss.dual_clip_c == 3.0 and cfg.algo.controller.search == "sequential"
    assert cfg.algo.controller.every == "micro_batch"
    out = POLICY_LOSSES.get("ppo_clip")(torch.log(torch.tensor([[5.0, 5.0]])), torch.zeros(1, 2),
                                        torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2),
                                        clip_low=1 - 0.9, clip_high=2.0 - 1, dual_clip_c=cfg.algo.loss.dual_clip_c)
    # A > 0: max(-5, -2) = -2
    assert out.per_token_loss[0].tolist() == pytest.approx([3.0, -2.0])


def _steps_part(ctrl):
    from mixrl.trainer.parts.controller_steps import ControllerSteps

    return ControllerSteps(ctrl, policy_tokens=("on_policy",), reduce_sum=None, reduce_mean=lambda t: t,
                           gather=lambda t: t, device="cpu")


def test_bapo_searches_on_every_micro_batch_or_once_per_step():
    from mixrl.core import provenance as prov

    def inputs(adv_neg):
        return {"completion_mask": torch.ones(1, 2), "advantages": torch.tensor([[1.0, adv_neg]]),
                "token_source": torch.full((1, 2), prov.ON_POLICY), "old_per_token_logps": torch.zeros(1, 2)}

    logps = torch.log(torch.tensor([[1.5, 1.0]]))
    every = _steps_part(CONTROLLERS.get("bapo")())
    once = _steps_part(CONTROLLERS.get("bapo")(every="step"))
    # micro-batch 0 of 2 balanced (bounds stay), micro-batch 1 unbalanced (the by-hand batch above)
    for part in (every, once):
        part.step_start(logps, inputs(-1.0), micro_step=0, accumulation=2)
        assert (part.controller.ratio_low, part.controller.ratio_high) == pytest.approx((0.6, 1.2))
        part.step_start(logps, inputs(-1.28), micro_step=1, accumulation=2)
    assert (every.controller.ratio_low, every.controller.ratio_high) == pytest.approx((0.9, 1.3))
    assert every.controller.num_updates == 2
    assert (once.controller.ratio_low, once.controller.ratio_high) == pytest.approx((0.6, 1.2))
    assert once.controller.num_updates == 1


def test_sum_over_processes_single_process_is_identity():
    from mixrl.core.controllers import sum_over_processes

    t = torch.tensor([1.5, 2.0], dtype=torch.float64)
    assert sum_over_processes(t) is t


def _two_rank_search(rank, init_file, results):
    import torch.distributed as dist

    from mixrl.core.controllers import sum_over_processes

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        assert sum_over_processes(torch.tensor([1.0 + rank, 10.0])).tolist() == [3.0, 20.0]
        # rank 0 holds the positive token, rank 1 the negative one: alone, rank 0 would keep
        # (0.6, 1.2) (no negatives) and rank 1 would saturate; summed, both get the by-hand (0.9, 1.3)
        ratios, advs = ([1.5], [1.0]) if rank == 0 else ([1.0], [-1.28])
        ctrl = CONTROLLERS.get("bapo")()
        ctrl.update(*_batch(ratios, advs), reduce=sum_over_processes)
        results[rank] = (ctrl.ratio_low, ctrl.ratio_high)
    finally:
        dist.destroy_process_group()


def test_sum_over_processes_makes_two_ranks_pick_the_union_bounds(tmp_path):
    import torch.multiprocessing as mp

    results = mp.Manager().dict()
    mp.spawn(_two_rank_search, args=(str(tmp_path / "init"), results), nprocs=2, join=True)
    assert dict(results) == {0: pytest.approx((0.9, 1.3)), 1: pytest.approx((0.9, 1.3))}
