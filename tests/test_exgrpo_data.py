"""ExGRPO removes mastered questions from the training data (ElliottYan/LUFFY ExGRPO/ at commit
01f4ae066249e6965ce0d5512ccdf99a12895c74, exgrpo/verl/verl/mix_src/):

* every step, a question whose whole group is correct joins the skip set (mix_trainer_experience.py:381-388);
* at each epoch start, when the training set holds more than train_batch_size + 20 questions, it becomes
  every question not in the skip set (:245-250, experience/rl_dataset_with_experience.py:40-45), shuffled,
  batches of train_batch_size with the last partial one dropped (:252-262).

mixrl: sampler=exgrpo (the picker ``epochs``, mixrl/sampler/epochs.py). Expected orders by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mixrl.config.compose import compose_config
from mixrl.sampler.epochs import EpochOrder
from mixrl.sampler.runtime import Sampler


def _perm(seed, epoch, items):
    return [items[int(i)] for i in np.random.default_rng([seed, epoch]).permutation(len(items))]


def test_mastered_questions_leave_the_data_at_the_next_epoch():
    """30 questions, batches of 4, tolerance 20: epoch 0 is a shuffle of all 30 in 7 batches (28
    prompts, 2 dropped). Questions 3 and 5 are mastered during it: epoch 1 shuffles the other 28 (30 > 24).
    Ten more mastered in epoch 1: epoch 2 holds 18. Epoch 2 holds 18 <= 24, so epoch 3 keeps those 18
    even after question 0 is mastered (the authors' BATCH_TOLERANCE)."""
    e = EpochOrder()
    first = [e.next(30, 4, 9, drop_mastered=True, tolerance=20) for _ in range(7)]
    assert sum(first, []) == _perm(9, 0, list(range(30)))[:28]
    e.note(3, [True] * 8)
    e.note(5, [True] * 8)
    e.note(6, [True] * 7 + [False])  # 7 of 8: stays
    second = e.next(30, 4, 9, drop_mastered=True, tolerance=20)
    rest = [i for i in range(30) if i not in (3, 5)]
    assert e.epoch == 1 and second == _perm(9, 1, rest)[:4] and sorted(e.valid) == rest
    for i in range(10, 20):
        e.note(i, [True] * 8)
    e.pos = len(e.order)  # the epoch runs out
    e.next(30, 4, 9, drop_mastered=True, tolerance=20)
    left = [i for i in rest if not 10 <= i < 20]
    assert e.epoch == 2 and len(left) == 18 and sorted(e.valid) == left
    e.note(0, [True] * 8)
    e.pos = len(e.order)
    e.next(30, 4, 9, drop_mastered=True, tolerance=20)
    assert e.epoch == 3 and sorted(e.valid) == left  # 18 <= 4 + 20: not filtered again
    # drop_mastered=false: every epoch is the whole set (TRL's data order, as before, reshuffled)
    keep = EpochOrder()
    keep.note(3, [True] * 8)
    for _ in range(8):
        keep.next(30, 4, 9, drop_mastered=False, tolerance=20)
    assert keep.epoch == 1 and sorted(keep.valid) == list(range(30))


def test_the_sampler_marks_a_group_solved_by_every_rollout_and_resumes_its_epoch():
    s = Sampler(pick={"name": "epochs", "drop_mastered": True, "tolerance": 0}, seed=4)
    batch = s.pick(6, 2)
    assert batch == _perm(4, 0, list(range(6)))[:2]
    correct = torch.tensor([[True] * 4, [True, True, True, False]])
    s.observe(batch, torch.ones(2, 4), correct, step=1)
    assert s.epochs.mastered == {batch[0]}
    saved = s.state_dict()
    again = Sampler(pick={"name": "epochs", "drop_mastered": True, "tolerance": 0}, seed=4)
    again.load_state_dict(saved)
    assert [again.pick(6, 2) for _ in range(3)] == [s.pick(6, 2) for _ in range(3)]
    assert batch[0] not in s.epochs.valid and len(s.epochs.valid) == 5  # epoch 1 (6 > 2 + 0): 5 left


def test_the_preset_drops_mastered_questions_and_sampler_none_keeps_them():
    cfg = compose_config(["algo=exgrpo"])
    assert cfg.sampler.pick.name == "epochs" and cfg.sampler.pick.drop_mastered is True
    assert cfg.sampler.pick.tolerance == 20
    assert compose_config(["algo=exgrpo", "sampler=none"]).sampler.pick.name == "data"
    assert compose_config(["algo=exgrpo", "sampler.pick.drop_mastered=false"]).sampler.pick.drop_mastered is False
    # the 8-process recipe cannot run a sampler: it keeps them (its ledger says so)
    assert compose_config(["recipe=exgrpo/qwen2.5-math-7b-openr1"]).sampler.pick.name == "data"


def test_a_revisited_group_counts_for_the_question_it_revisits():
    """The revisit injection puts a stored question in the last group after the picker chose: the
    group's history (and its mastery) belongs to that question, not to the one it replaced; a prompt
    outside the training set (a hint added) keeps the picked index."""
    from mixrl.trainer.parts.sampler_rounds import SamplerRounds

    rounds = SamplerRounds(Sampler(pick={"name": "epochs"}), dataset=[{"prompt": p} for p in "abc"],
                           num_generations=2, pad_token_id=0, weigh=lambda t: t[:, 0])
    inputs = [{"prompt": "a"}] * 2 + [{"prompt": "c"}] * 2  # picked [0, 1]; group 1 revisits "c"
    assert rounds.as_generated(inputs, [0, 1]) == [0, 2]
    assert rounds.as_generated([{"prompt": "a"}] * 2 + [{"prompt": "b + hint"}] * 2, [0, 1]) == [0, 1]
