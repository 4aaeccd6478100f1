"""ExGRPO's success-rate buckets (ElliottYan/LUFFY ExGRPO/ at commit
01f4ae066249e6965ce0d5512ccdf99a12895c74, exgrpo/verl/verl/mix_src/experience/):

* a question's bucket is its latest admitted group's successes k (experience_trainer_ops.py:39-44,
  experience_bucket_manager.py:30-63), only while mixed-policy training is on (:11-12);
* exp_bucket_manager=normal (exp_scripts/run_exgrpo.sh:32): w(k) = exp(-(k - 8/2)^2 / 2) / sqrt(2 pi)
  (weighted_bucket_sampler.py:26-31), p_k = w(k) / sum over non-empty buckets (:56-67);
* Multinomial(n, p) counts, a bucket's excess redrawn one at a time over the buckets with room
  (:103-147), uniform without replacement within a bucket (:149-168); no bucket at all: uniform
  (experience_helpers.py:33-35).

Expected values are computed by hand from those formulas.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from mixrl.config.compose import compose_config
from mixrl.errors import ConfigError
from mixrl.sources.replay import ReplaySource
from mixrl.sources.replay_buckets import bucket_draw, bucket_probabilities, bucket_weight
from mixrl.sources.replay_inject import ReplayFill

from tests.test_exgrpo import _batch, _ctx, _entry

S2PI = math.sqrt(2 * math.pi)


def test_bucket_weights_by_hand():
    # normal, G = 8: centred on 4, sigma 1
    assert bucket_weight(4, 8, "normal") == pytest.approx(1 / S2PI)          # 0.398942
    assert bucket_weight(3, 8, "normal") == pytest.approx(0.241971, abs=1e-6)  # e^-0.5 / sqrt(2 pi)
    assert bucket_weight(1, 8, "normal") == pytest.approx(0.004432, abs=1e-6)  # e^-4.5 / sqrt(2 pi)
    assert bucket_weight(3, 8, "linear") == 0.375
    assert bucket_weight(2, 8, "sqrt") == pytest.approx(0.5)
    assert bucket_weight(6, 8, "linear_clip") == 0.5 and bucket_weight(3, 8, "linear_clip") == 0.375
    # buckets 3 and 4 non-empty, 5 empty: p3 = e^-0.5 / (1 + e^-0.5) = 0.377541
    p = bucket_probabilities({3: 2, 4: 5, 5: 0}, 8, "normal")
    assert set(p) == {3, 4} and p[3] == pytest.approx(0.377541, abs=1e-6)


def test_a_full_bucket_passes_its_excess_to_the_others():
    """Buckets 4 = {a} and 2 = {b, c, d}, n = 2: p4 = 1 / (1 + e^-2) = 0.880797, p2 = 0.119203.
    Counts (2, 0) (p4^2 = 0.775803): bucket 4 holds one, the excess draw goes to bucket 2 -> a + one
    of b, c, d; (1, 1) (2 p4 p2 = 0.209988) -> a + one; (0, 2) (p2^2 = 0.014209) -> two of b, c, d.
    So P(a drawn) = 1 - p2^2 = 0.985791; every draw gives 2 distinct questions."""
    rng = random.Random(7)
    trials, with_a = 20000, 0
    for _ in range(trials):
        got = bucket_draw({4: ["a"], 2: ["b", "c", "d"]}, 2, 8, "normal", rng)
        assert len(got) == 2 and len(set(got)) == 2
        with_a += "a" in got
    assert with_a / trials == pytest.approx(0.985791, abs=0.004)
    # n at least the pool: every question once
    assert sorted(bucket_draw({4: ["a"], 2: ["b", "c", "d"]}, 9, 8, "normal", rng)) == ["a", "b", "c", "d"]
    assert bucket_draw({}, 3, 8, "normal", rng) == [] and bucket_draw({4: ["a"]}, 0, 8, "normal", rng) == []


def test_one_draw_lands_in_a_bucket_with_its_probability():
    rng = random.Random(3)
    hits = sum(bucket_draw({3: list(range(50)), 4: list(range(50, 100))}, 1, 8, "normal", rng)[0] < 50
               for _ in range(20000))
    assert hits / 20000 == pytest.approx(0.377541, abs=0.01)


def test_admitted_groups_write_their_bucket_only_while_replay_is_on():
    """Groups of 8 solved 3, 8, 0 and 7 times: the admitted ones (0 < k <= 7) get buckets 3 and 7; the
    8/8 question is mastered (no bucket), 0/8 gets none. Before the start step nothing is written."""
    rewards = torch.tensor([1.0] * 3 + [0.0] * 5 + [1.0] * 8 + [0.0] * 8 + [0.0] + [1.0] * 7)
    prompts = [(1, 1), (2, 2), (3, 3), (4, 4)]
    for start, expected in ((None, {(1, 1): 3, (4, 4): 7}), (0.99, {})):
        src = ReplaySource(store="successes", admit=[1, 7], drop_mastered=True, buckets="normal")
        inj = ReplayFill(fill="revisited", revisit=0.5, source=src, start_solve_rate=start)
        inj.after_rewards(_ctx(3, batch=_batch(prompts, 8, rewards)), [{"prompt": "x"}] * 32, rewards)
        assert src.bucket_of == expected
    # the latest admitted count wins; a later 0/8 group keeps the bucket it had
    src.bucket_of = {(1, 1): 3}
    inj = ReplayFill(fill="revisited", revisit=0.5, source=src)
    again = torch.tensor([1.0] * 5 + [0.0] * 3 + [0.0] * 8)
    inj.after_rewards(_ctx(4, batch=_batch([(1, 1), (4, 4)], 8, again)), [{"prompt": "x"}] * 16, again)
    assert src.bucket_of == {(1, 1): 5}
    restored = ReplaySource(buckets="normal")
    restored.load_state_dict(src.state_dict())
    assert restored.bucket_of == {(1, 1): 5}


def _pool(buckets):
    src = ReplaySource(store="successes", sampling="recent", buckets=buckets)
    for p in ((1, 1), (4, 4)):
        src.buffer.add(_entry(p, step=1))
    src.rows = {(1, 1): {"prompt": "p11"}, (4, 4): {"prompt": "p44"}}
    src.bucket_of = {(1, 1): 1, (4, 4): 4}
    return src


def test_revisited_questions_are_drawn_by_buckets():
    """One group of 8 revisited per step (revisit 1.0), the pool holding a question of bucket 1 and
    one of bucket 4: P(bucket 1) = e^-4.5 / (1 + e^-4.5) = 0.010987. The old reading (buckets=null,
    sampling recent) always takes the newest, (4, 4)."""
    inj = ReplayFill(fill="revisited", revisit=1.0, source=_pool("normal"))
    drawn = [inj.before_generation(_ctx(5), [{"prompt": "x"}] * 8)[0]["prompt"] for _ in range(6000)]
    assert drawn.count("p11") / 6000 == pytest.approx(0.010987, abs=0.005)
    old = ReplayFill(fill="revisited", revisit=1.0, source=_pool(None))
    assert {old.before_generation(_ctx(5), [{"prompt": "x"}] * 8)[0]["prompt"] for _ in range(20)} == {"p44"}
    # no stored question has a bucket: uniform over the pool (the authors' fallback)
    src = _pool("normal")
    src.bucket_of = {}
    fall = ReplayFill(fill="revisited", revisit=1.0, source=src)
    drawn = [fall.before_generation(_ctx(5), [{"prompt": "x"}] * 8)[0]["prompt"] for _ in range(2000)]
    assert drawn.count("p11") / 2000 == pytest.approx(0.5, abs=0.05)


def test_the_preset_draws_by_normal_buckets_and_the_old_reading_is_one_override():
    assert compose_config(["algo=exgrpo"]).offpolicy.source.buckets == "normal"
    assert compose_config(["algo=exgrpo", "offpolicy.source.buckets=null"]).offpolicy.source.buckets is None
    assert compose_config(["algo=exgrpo", "offpolicy=replay"]).offpolicy.source.buckets is None
    with pytest.raises(ConfigError, match="offpolicy.source.buckets") as e:
        ReplaySource(buckets="gaussian")
    assert "\n" not in str(e.value)
