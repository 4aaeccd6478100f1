"""The sampler's pure components (mixrl.sampler), each against hand-computed cases."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mixrl.sampler import GROUP_FILTERS, PICKERS, ROW_FILTERS, PromptState
from mixrl.sampler.pickers import group_abs_advantage, td_update
from mixrl.sampler.runtime import Sampler


# ---------------------------------------------------------------- per-prompt state
def test_prompt_state_counts_and_beta_posterior():
    s = PromptState()  # Beta(1, 1) prior
    assert s.accuracy(7) == 0.5 and s.seen(7) == 0 and s.mean_reward(7) is None
    s.update(7, [1.0, 0.0, 1.0, 1.0], [True, False, True, True], step=3)
    # (1 + 3) / (1 + 1 + 3 + 1) = 4/6
    assert s.accuracy(7) == pytest.approx(4 / 6)
    assert s.beta(7) == (4.0, 2.0)
    assert s.seen(7) == 1 and s.mean_reward(7) == pytest.approx(0.75)
    assert s.records[7].last_step == 3


def test_prompt_state_decay_weighs_old_outcomes_less():
    s = PromptState(decay=0.5)
    s.update(0, [1, 1], [True, True], step=0)   # s=2, f=0
    s.update(0, [0, 0], [False, False], step=1)  # s=2*0.5=1, f=0*0.5+2=2
    assert s.beta(0) == (2.0, 3.0)
    assert s.accuracy(0) == pytest.approx(2 / 5)
    assert s.seen(0) == 2 and s.records[0].last_step == 1


def test_prompt_state_round_trips_through_json():
    s = PromptState(decay=0.9, a0=2.0, b0=0.5)
    s.update(3, [0.5, 1.0], [False, True], step=4)
    t = PromptState()
    t.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert t.state_dict() == s.state_dict() and t.accuracy(3) == s.accuracy(3)


def test_prompt_state_refuses_bad_prior():
    with pytest.raises(ValueError):
        PromptState(decay=1.5)
    with pytest.raises(ValueError):
        PromptState(a0=0.0)


# ---------------------------------------------------------------- group filters
def test_nonzero_variance_drops_constant_groups():
    r = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.5, 0.5, 0.5 + 1e-3]])
    keep = GROUP_FILTERS.get("nonzero_variance")(r, r >= 1, eps=1e-6)
    assert keep.tolist() == [False, False, True, True]
    assert GROUP_FILTERS.get("nonzero_variance")(r, r >= 1, eps=1e-2).tolist() == [False, False, True, False]


def test_accuracy_band_keeps_intermediate_groups():
    correct = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    keep = GROUP_FILTERS.get("accuracy_band")(correct.float(), correct, lo=0.25, hi=0.5)
    assert keep.tolist() == [False, True, True, False]  # accuracies 1, .25, .5, 0


def test_keep_all():
    assert GROUP_FILTERS.get("all")(torch.zeros(3, 2), torch.zeros(3, 2, dtype=torch.bool)).tolist() == [True] * 3


# ---------------------------------------------------------------- row filters
def test_reward_extremes_keeps_top_and_bottom_k():
    r = torch.tensor([[0.1, 0.9, 0.5, 0.3, 0.7]])
    keep = ROW_FILTERS.get("reward_extremes")(r, torch.zeros_like(r), k=1)
    assert keep.tolist() == [[True, True, False, False, False]]  # lowest 0.1, highest 0.9
    keep2 = ROW_FILTERS.get("reward_extremes")(r, torch.zeros_like(r), k=2)
    assert keep2.tolist() == [[True, True, False, True, True]]  # drops the median 0.5


def test_nonnegative_advantage_drops_negative_rows():
    a = torch.tensor([[-0.5, 0.0, 1.2], [0.3, -2.0, -0.1]])
    assert ROW_FILTERS.get("nonnegative_advantage")(a, a).tolist() == [[False, True, True], [True, False, False]]
    assert ROW_FILTERS.get("nonnegative_advantage")(a, a, threshold=0.5).tolist() == [[False, False, True], [False, False, False]]


# ---------------------------------------------------------------- pickers
def test_data_picker_leaves_the_loader_order():
    assert PICKERS.get("data")(PromptState(), 10, 4, np.random.default_rng(0)) is None


def test_accuracy_band_picker_picks_eligible_prompts_first():
    s = PromptState()
    for i in range(6):  # prompts 0-5: all correct -> acc (1+4)/(2+4) = 5/6 > 0.7
        s.update(i, [1] * 4, [True] * 4, step=0)
    s.update(6, [1, 0, 0, 0], [True, False, False, False], step=0)  # acc 2/6
    # eligible: 6 (in band) and 7, 8, 9 (unseen)
    got = PICKERS.get("accuracy_band")(s, 10, 4, np.random.default_rng(1), lo=0.2, hi=0.7)
    assert sorted(got) == [6, 7, 8, 9]
    more = PICKERS.get("accuracy_band")(s, 10, 6, np.random.default_rng(1), lo=0.2, hi=0.7)
    assert len(set(more)) == 6 and {6, 7, 8, 9} <= set(more)  # topped up from the rest


def test_thompson_prefers_uncertain_intermediate_prompts():
    s = PromptState()
    for _ in range(20):
        s.update(0, [1] * 8, [True] * 8, step=0)   # ~always solved: theta near 1
        s.update(1, [0] * 8, [False] * 8, step=0)  # never solved: theta near 0
        s.update(2, [1, 0] * 4, [True, False] * 4, step=0)  # half: theta near 0.5
    picked = PICKERS.get("thompson")(s, 3, 1, np.random.default_rng(0), target=0.5)
    assert picked == [2]
    # same generator seed, same draw: deterministic
    assert PICKERS.get("thompson")(s, 3, 2, np.random.default_rng(5)) == PICKERS.get("thompson")(s, 3, 2, np.random.default_rng(5))


def test_bandit_draws_from_the_valued_arm_and_td_update():
    s = PromptState()
    arms = ["easy", "easy", "easy", "hard", "hard", "hard"]
    values = {"hard": 10.0, "easy": 0.0}  # softmax(10/0.5, 0) puts ~all mass on 'hard'
    got = PICKERS.get("bandit")(s, 6, 3, np.random.default_rng(0), arms, values, temperature=0.5)
    assert sorted(got) == [3, 4, 5]
    # TD(0): Q <- Q + lr (mean r - Q): 0 + 0.5 (1.0 - 0) = 0.5; 10 + 0.5 (2 - 10) = 6
    assert td_update({"easy": 0.0, "hard": 10.0}, {"easy": [0.5, 1.5], "hard": [2.0]}, 0.5) == {"easy": 0.5, "hard": 6.0}


def test_group_abs_advantage():
    # rewards [1, 0]: mean .5, std (unbiased) sqrt(.5) ; mean |A| = .5 / (sqrt(.5) + 1e-4)
    assert group_abs_advantage([1.0, 0.0]) == pytest.approx(0.5 / (0.5 ** 0.5 + 1e-4))
    assert group_abs_advantage([1.0, 1.0, 1.0]) == 0.0


def test_bounds_are_declared():
    from mixrl.core.registry import ComponentParamError

    with pytest.raises(ComponentParamError, match="target"):
        PICKERS.check_ranges("thompson", {"target": 1.0}, where="sampler.pick")
    with pytest.raises(ComponentParamError, match="lo"):
        GROUP_FILTERS.check_ranges("accuracy_band", {"lo": -0.1}, where="sampler.keep")
    with pytest.raises(ComponentParamError, match="k"):
        ROW_FILTERS.check_ranges("reward_extremes", {"k": 0}, where="sampler.rows.pf")


# ---------------------------------------------------------------- the runtime sampler
def test_sampler_assembles_kept_groups_first_and_tops_up():
    s = Sampler(keep={"name": "nonzero_variance"}, max_rounds=2)
    r0 = torch.tensor([True, False, True, False])
    r1 = torch.tensor([False, True, False, False])
    assert s.wants_more([r0], 4) and not s.wants_more([r0, r1], 4)  # 2 kept < 4, but 2 rounds is the cap
    order = s.assemble([r0, r1], 4)
    # kept: (0,0), (0,2), (1,1); then the oldest dropped: (0,1)
    assert order == [(0, 0), (0, 2), (1, 1), (0, 1)]
    assert s.short == 1 and s.rounds == 2 and s.batches == 1
    assert not Sampler(max_rounds=3).wants_more([torch.tensor([True, True])], 2)


def test_sampler_draws_are_reproducible_from_its_state():
    a = Sampler(pick={"name": "thompson"}, seed=3)
    a.observe([0, 1], torch.tensor([[1.0, 0.0], [1.0, 1.0]]), torch.tensor([[True, False], [True, True]]), step=0)
    first = a.pick(50, 8)
    b = Sampler(pick={"name": "thompson"}, seed=3)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.pick(50, 8) == a.pick(50, 8)  # same state, same counter: same prompts
    assert len(set(first)) == 8


def test_sampler_row_keep_and_summary():
    s = Sampler(rows={"alol": {"name": "nonnegative_advantage"}, "pf": {"name": "reward_extremes", "k": 1}})
    r = torch.tensor([[0.0, 1.0, 0.5]])
    a = torch.tensor([[-1.0, 1.0, 0.0]])
    # extremes keep 0 and 1; A >= 0 keeps 1 and 2: both -> only row 1
    assert s.row_keep(r, a).tolist() == [[False, True, False]]
    s.generated, s.trained, s.rounds, s.batches = 48, 32, 3, 2
    assert s.summary().startswith("sampler: 48 rollouts generated for 32 trained (16 extra, 1.50 generated per trained")
    assert s.metrics()["sampler/generated_per_trained"] == 1.5


def test_hard_routing_counts_unguided_rollouts_only():
    s = Sampler(hard_below=0.3)
    assert not s.is_hard(0)  # unseen: not hard
    r = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
    correct = r >= 1
    free = torch.tensor([[True, True, False, False]])  # the two successes were guided
    s.observe([0], r, correct, step=1, free=free)
    # only the 2 free failures count: (1 + 0) / (2 + 2) = 0.25 < 0.3
    assert s.state.accuracy(0) == pytest.approx(0.25) and s.state.records[0].rollouts == 2
    assert s.is_hard(0)
    s.observe([1], r, correct, step=1, free=torch.zeros(1, 4, dtype=torch.bool))  # no free rollout: not counted
    assert s.state.seen(1) == 0 and not s.is_hard(1)
    s.observe([2], r, correct, step=1)  # all count: (1 + 2) / (2 + 4) = 0.5
    assert s.state.accuracy(2) == pytest.approx(0.5) and not s.is_hard(2)
