"""Padding-free rows (``trainer.padding_free``, :mod:`mixrl.trainer.parts.packing`).

* ``pack`` / ``unpack`` on rows written out by hand: which tokens go in, their position ids,
  the pre-shifted labels, where each scored token's value comes back to.
* One model forward, padded (TRL's layout: prompts left-padded, completions right-padded, the
  fused LM head) against packed: per-token log-probs, entropies and their gradients within 1e-5
  (float32), with rows that are entirely prompt, empty completions and a row much longer than
  the others; the critic's values likewise.
* Refusals: ``true`` with a model that cannot take packed rows is one line naming the fix;
  ``auto`` keeps the padded forward and says why once.
* Every algorithm family through the trainer pins harness (``tests/pins/harness.py``): one
  optimizer step (two where the pin has two) with ``trainer.padding_free=false`` and ``=true``
  side by side, in the same test: every micro-batch loss, every logged metric and the gradient
  (norm, 4 random projections) within 1e-5 (relative to max(1, |value|); projections relative
  to max(1, gradient norm)), and the packed forward must have run.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from fused_rows import fused_pin_model, trl_rows

from mixrl.errors import ConfigError
from mixrl.trainer.parts import packing
from mixrl.trainer.parts.packing import Packing, pack, unpack

HERE = Path(__file__).resolve().parent
PIN_MODEL = HERE / "fixtures" / "pin-model"
#: packed vs padded forwards of the same weights. Their difference moves between CPU kernel sets by up to
#: 3e-6 (log-probs) and 9e-6 (critic values; `make tolerances`, avx2 vs default), where 1e-5 left margins of
#: 3x and none: 1e-4 leaves over 30x on the log-probs (the values: relative as well, below).
TOL = 1e-4


# --------------------------------------------------------------------------- pack / unpack by hand
def test_pack_by_hand():
    # 3 rows, prompt width 3, completion width 2 (logits_to_keep=2), pad 0:
    #   row 0: prompt [5, 6] (left-padded), completion [7, 8]
    #   row 1: prompt [4, 5, 6], completion [] (entirely prompt: left out)
    #   row 2: prompt [9], completion [3]
    ids = torch.tensor([[0, 5, 6, 7, 8], [4, 5, 6, 0, 0], [0, 0, 9, 3, 0]])
    att = (ids != 0).long()
    p = pack(ids, att, 2)
    assert p.input_ids.tolist() == [[5, 6, 7, 8, 9, 3]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 0, 1]]
    # token k+1 scored at k when it is a completion token of the same row; never across rows
    assert p.shift_labels.tolist() == [[-100, 7, 8, -100, 3, -100]]
    assert p.rows.tolist() == [0, 0, 2] and p.cols.tolist() == [0, 1, 0] and p.at.tolist() == [1, 2, 4]
    values = torch.tensor([[10.0, 11.0, 12.0, 13.0, 14.0, 15.0]])
    assert unpack(values, p, (3, 2)).tolist() == [[11.0, 12.0], [0.0, 0.0], [14.0, 0.0]]


def test_pack_with_a_capacity_by_hand():
    # rows of 4, 2, 3 and 1 tokens, at most 5 tokens per sequence: first fit by decreasing length
    # puts row 0 (4) then row 3 (1) in sequence 0, row 2 (3) then row 1 (2) in sequence 1
    ids = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 0, 5, 6], [0, 0, 7, 8, 9], [0, 0, 0, 0, 10]])
    att = (ids != 0).long()
    att[0, 0] = 0  # token 0 would not be a pad here: keep row 0 at 4 tokens
    p = pack(ids, att, 1, capacity=5)
    assert p.input_ids.tolist() == [[1, 2, 3, 4, 10], [7, 8, 9, 5, 6]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 0], [0, 1, 2, 0, 1]]
    assert p.shift_labels.tolist() == [[-100, -100, 4, -100, -100], [-100, 9, -100, 6, -100]]
    assert p.rows.tolist() == [0, 1, 2] and p.cols.tolist() == [0, 0, 0] and p.at.tolist() == [2, 8, 6]
    # a sequence with room to spare ends in filler: positions restart, nothing scored
    p = pack(ids, att, 1, capacity=7)  # rows 0 and 2 fill sequence 0; rows 1 and 3 leave 4 tokens of filler
    assert p.input_ids.shape == (2, 7) and p.position_ids[1].tolist() == [0, 1, 0, 0, 1, 2, 3]
    assert p.shift_labels[1].tolist() == [6, -100, -100, -100, -100, -100, -100]


def test_pack_keeps_the_padded_forward_for_a_hole_or_nothing_to_score():
    ids = torch.tensor([[5, 6, 7, 8]])
    assert pack(ids, torch.tensor([[1, 0, 1, 1]]), 2) is None  # a hole: the padded forward runs token 6 as a query
    assert pack(ids, torch.tensor([[1, 1, 0, 0]]), 2) is None  # no scored token anywhere


def test_resolve_mode_reads_yaml_booleans():
    assert [packing.resolve_mode(v) for v in (True, False, "auto", "True", "false")] == ["true", "false", "auto",
                                                                                         "true", "false"]
    with pytest.raises(ValueError, match="auto, true or false"):
        Packing("sometimes")


# --------------------------------------------------------------------------- one forward
@pytest.fixture(scope="module")
def model():
    return fused_pin_model()


_rows = trl_rows  # TRL's layout (tests/fused_rows.py)


def _padded(m, C):
    """TRL 1.16's ``_get_per_token_logps_and_entropies`` body for one chunk (trl/trainer/grpo_trainer.py)."""
    def run(ids, att):
        labels = ids.masked_fill(att == 0, -100)
        labels[:, :-C] = -100
        out = m(input_ids=ids, attention_mask=att, labels=labels, fused_lm_head=True)
        return out.log_probs[:, -C:], out.entropy[:, -C:], None
    return run


def _grads(m, value):
    params = [p for p in m.parameters() if p.requires_grad]
    return torch.cat([g.flatten() for g in torch.autograd.grad(value, params)])


@pytest.mark.parametrize("prompt_lens,completion_lens", [
    ([7, 3, 1, 5, 2], [9, 0, 4, 1, 6]),  # an empty completion: a row entirely prompt
    ([2, 3, 2, 4], [3, 2, 40, 1]),  # one row (an expert demonstration) far longer than the rollouts
    ([4, 4, 4], [5, 5, 5]),  # no padding at all
])
def test_packed_forward_equals_padded(model, prompt_lens, completion_lens):
    ids, att, C = _rows(prompt_lens, completion_lens)
    padded = _padded(model, C)
    lp0, ent0, _ = padded(ids, att)
    lp1, ent1, _ = Packing("true").logps(model, ids, att, C, compute_entropy=True, padded=padded)
    assert lp1.shape == lp0.shape == ent1.shape
    assert torch.allclose(lp1, lp0, atol=TOL, rtol=0) and torch.allclose(ent1, ent0, atol=TOL, rtol=0)
    assert lp0.abs().sum() > 0 and (lp1[att[:, -C:] == 0] == 0).all()  # padding scores 0, as the padded head does
    # a loss of both (weights fixed, so the gradient is that of the log-probs and entropies)
    w = torch.linspace(-1, 1, lp0.numel()).view_as(lp0)
    g0 = _grads(model, (w * lp0).sum() + (w * ent0).sum())
    lp1, ent1, _ = Packing("true").logps(model, ids, att, C, compute_entropy=True, padded=padded)
    g1 = _grads(model, (w * lp1).sum() + (w * ent1).sum())
    assert (g1 - g0).abs().max() <= TOL * max(1.0, float(g0.abs().max()))


def test_chunks_of_batch_size_equal_one_chunk(model):
    ids, att, C = _rows([7, 3, 1, 5, 2], [9, 0, 4, 1, 6])
    padded = _padded(model, C)
    lp0, _, _ = padded(ids, att)
    lp1, _, _ = Packing("auto").logps(model, ids, att, C, batch_size=2, padded=padded)
    assert torch.allclose(lp1, lp0, atol=TOL, rtol=0)


def test_a_hole_goes_to_the_padded_forward(model):
    ids, att, C = _rows([3, 3], [4, 4])
    att[0, 1] = 0  # a hidden prompt token: not one run of ones
    padded = _padded(model, C)
    lp0, _, _ = padded(ids, att)
    lp1, _, _ = Packing("true").logps(model, ids, att, C, padded=padded)
    assert torch.equal(lp1, lp0)


def test_critic_values_packed_equal_padded(model):
    from mixrl.trainer.parts.critic import ValueModel

    torch.manual_seed(0)
    vm = ValueModel(model.base_model, int(model.config.hidden_size))
    torch.nn.init.normal_(vm.head.weight)  # a non-zero head (it starts at 0)
    ids, att, C = _rows([7, 3, 1, 5], [9, 0, 4, 6])
    v0 = vm(ids, att, C)
    v1 = Packing("true").values(vm.backbone, vm.head, ids, att, C)
    mask = att[:, -C:].bool()
    # the values of a random-normal head are about 10 (12 at most here): relative, not absolute, float error
    assert torch.allclose(v1[mask], v0[mask], atol=TOL, rtol=TOL) and (v1[~mask] == 0).all()
    g0 = _grads(vm, (v0[mask] ** 2).sum())
    v1 = Packing("true").values(vm.backbone, vm.head, ids, att, C)
    g1 = _grads(vm, (v1[mask] ** 2).sum())
    assert (g1 - g0).abs().max() <= TOL * max(1.0, float(g0.abs().max()))


# --------------------------------------------------------------------------- refusals
def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=18, n_positions=32))


def test_true_refuses_a_model_with_absolute_positions_in_one_line():
    with pytest.raises(ConfigError) as e:
        Packing("true").reason(_gpt2())
    text = str(e.value)
    assert "\n" not in text and "absolute position" in text and "trainer.padding_free=auto" in text


def test_true_refuses_an_attention_that_cannot_take_packed_rows(model):
    model.config._attn_implementation = "paged|sdpa"
    try:
        with pytest.raises(ConfigError, match="attention implementation 'paged|sdpa'"):
            Packing("true").reason(model)
    finally:
        model.config._attn_implementation = "sdpa"


def test_auto_keeps_the_padded_forward_and_says_why_once():
    said = []
    p = Packing("auto", say=said.append)
    m = _gpt2()
    assert not p.applies(m) and not p.applies(m)
    assert len(said) == 1 and "GPT2LMHeadModel" in said[0] and "absolute position" in said[0]
    assert Packing("false").reason(m) == "trainer.padding_free=false"


def test_config_value_is_checked():
    from mixrl.config.compose import compose_config

    with pytest.raises(ConfigError, match="trainer.padding_free=sometimes"):
        compose_config(["trainer.padding_free=sometimes"])
    assert str(compose_config(["trainer.padding_free=true"]).trainer.padding_free).lower() == "true"


# --------------------------------------------------------------------------- every family, through the pins harness
sys.path.insert(0, str(HERE / "pins"))


def _short(text: str, slot: int, batch: int = 0) -> str:
    """Rollouts of one digit: the expert demonstrations are many times longer."""
    return f"{slot}"


def _truncating(text: str, slot: int, batch: int = 0) -> str:
    """Slot 0 runs past max_completion_length (24): under mask_truncated_completions its row is entirely prompt."""
    from rollouts import tolerant_completion

    return "1" * 40 if slot == 0 else tolerant_completion(text, slot, batch)


BASE = ["trainer.max_steps=1", "trainer.prompts_per_step=4", "algo.num_generations=4", "trainer.micro_batch_size=8",
        "trainer.max_grad_norm=0", "trainer.eval_size=0", "trainer.max_completion_length=24",
        "trainer.logging_steps=1", "data.train_size=16", "logger.progress=false", "hardware.torch_threads=1"]
TEACHER = ["teacher=model", f"teacher.source.models=[{PIN_MODEL}]"]
ITER2 = ["trainer.num_iterations=2", "trainer.max_steps=2", "trainer.learning_rate=1e-3"]
#: case -> (overrides, rollouts): one per family of the pins, and the row shapes the issue names
CASES = {
    "grpo": (["algo=grpo"], None),
    "grpo|kl (reference model)": (["algo=grpo", "algo.kl.coef=0.05"], None),
    "grpo|num_iterations=2 (old policy)": (["algo=grpo", *ITER2], None),
    "grpo|truncated rows (entirely prompt)": (["algo=grpo", "trainer.mask_truncated_completions=true"], _truncating),
    "dr_grpo": (["algo=dr_grpo"], None),
    "gspo": (["algo=gspo"], None),
    "sft": (["algo=sft"], None),
    "chord": (["algo=chord", "algo.inject.rows=4"], None),
    "chord|expert rows much longer": (["algo=chord", "algo.inject.rows=4"], _short),
    "luffy": (["algo=luffy"], None),
    "ampo (teacher)": (["algo=ampo", *TEACHER], None),
    "kdrl (teacher)": (["algo=kdrl", *TEACHER, "teacher.source.privileged=expert"], None),
    "guide (hints)": (["algo=guide", "algo.inject.max_success=0.5"], "tolerant_completion"),
    "prefix_rft (prefixes)": (["algo=prefix_rft"], "tolerant_completion"),
    "exgrpo (replay)": (["algo=exgrpo", "trainer.max_steps=2", "algo.inject.start_solve_rate=null"], "collapsing_completion"),
    "simplemix (pairs)": (["algo=simplemix"], "tolerant_completion"),
    "grpo_dpo (pairs)": (["algo=grpo_dpo"], "tolerant_completion"),
    "ppo (critic)": (["algo=ppo"], "tolerant_completion"),
    "remax": (["algo=remax"], "tolerant_completion"),
    "opmd|num_iterations=2": (["algo=opmd", "trainer.num_iterations=2"], "tolerant_completion"),
}
#: cases whose two runs take over ~20 s on one thread
SLOW = {"grpo|num_iterations=2 (old policy)", "exgrpo (replay)", "opmd|num_iterations=2", "ampo (teacher)",
        "kdrl (teacher)", "ppo (critic)"}


def _close(a: float, b: float, scale: float = 1.0) -> bool:
    return abs(a - b) <= TOL * max(1.0, abs(b), scale)


#: metrics not a function of the numbers: wall-clock, and DPO's accuracy, the share of pairs whose
#: margin is > 0: at the first step the policy is the reference, every margin is 0 up to rounding
#: (dpo/margin agrees within 1e-5), and the share flips with the rounding of either forward; and
#: the padding share of the forwards, which packing sets to 0 (checked on its own below)
UNCOMPARED = re.compile(r"seconds|per_second|dpo/accuracy|batch/padding_fraction")


def differences(padded: dict, packed: dict) -> list[str]:
    """Every difference between two ``run_one_step`` results beyond 1e-5."""
    if (padded["steps"], len(padded["losses"]), len(padded["metrics"]), len(padded["grads"])) != (
            packed["steps"], len(packed["losses"]), len(packed["metrics"]), len(packed["grads"])):
        return ["different numbers of steps, losses, logged rows or gradients"]
    bad = [f"loss {i}: {b!r} vs {a!r}" for i, (a, b) in enumerate(zip(padded["losses"], packed["losses"]))
           if not _close(b, a)]
    for i, (a, b) in enumerate(zip(padded["metrics"], packed["metrics"])):
        bad += [f"step row {i}: {k} = {b.get(k)!r} vs {v!r}" for k, v in a.items()
                if not UNCOMPARED.search(k) and (k not in b or not _close(b[k], v))]
    for i, (a, b) in enumerate(zip(padded["grads"], packed["grads"])):
        if not _close(b["norm"], a["norm"]):
            bad.append(f"step {i}: grad norm {b['norm']!r} vs {a['norm']!r}")
        bad += [f"step {i}: projection {j}: {y!r} vs {x!r}" for j, (x, y) in enumerate(zip(a["proj"], b["proj"]))
                if not _close(y, x, a["norm"])]
    return bad


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES])
def test_every_family_trains_the_same_padding_free(case, tmp_path, monkeypatch):
    from harness import run_one_step

    import rollouts

    overrides, completion = CASES[case]
    completion = getattr(rollouts, completion) if isinstance(completion, str) else completion
    calls = {"packed": 0, "values": 0}
    real_pack, real_values = packing.pack, Packing.values

    def counting_pack(*args, **kwargs):
        out = real_pack(*args, **kwargs)
        calls["packed"] += out is not None
        return out

    def counting_values(self, *args, **kwargs):
        calls["values"] += 1
        return real_values(self, *args, **kwargs)

    monkeypatch.setattr(packing, "pack", counting_pack)
    monkeypatch.setattr(Packing, "values", counting_values)
    runs = {}
    for mode in ("false", "true"):
        runs[mode] = run_one_step([overrides[0], *BASE, *overrides[1:], f"trainer.padding_free={mode}"],
                                  str(PIN_MODEL), tmp_path / mode, completion=completion)
        if mode == "false":
            assert calls == {"packed": 0, "values": 0}, "padding_free=false packed rows"
    assert calls["packed"] > 0, "the packed forward never ran"
    if "critic" in case:
        assert calls["values"] > 0, "the critic's values were not packed"
    padded_share = [m["batch/padding_fraction"] for m in runs["false"]["metrics"] if "batch/padding_fraction" in m]
    packed_share = [m["batch/padding_fraction"] for m in runs["true"]["metrics"] if "batch/padding_fraction" in m]
    assert packed_share and all(f == 0.0 for f in packed_share), f"packed rows logged padding: {packed_share}"
    assert len(padded_share) == len(packed_share)
    for share in padded_share:  # one assert per value: `make tolerances` records each
        assert share >= 0.0
    bad = differences(runs["false"], runs["true"])
    assert not bad, f"{case}: " + "; ".join(bad[:8]) + (f" (+{len(bad) - 8} more)" if len(bad) > 8 else "")


def test_mixrl_train_refuses_true_in_one_line_before_the_run_directory(tmp_path):
    """``mixrl train`` with ``trainer.padding_free=true`` and an attention that cannot take packed
    rows: exit 2, one line naming the fix, no run directory, no model loaded."""
    from typer.testing import CliRunner

    from mixrl.cli.main import app

    run_dir = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", f"model.path={PIN_MODEL}", "model.attn_implementation=paged|sdpa",
                                   "trainer.padding_free=true", f"run_dir={run_dir}", "logger.progress=false",
                                   "hardware.torch_threads=1", "data.train_size=16", "trainer.eval_size=0"])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "trainer.padding_free=true" in lines[0] and "padding_free=auto" in lines[0], lines
    assert not run_dir.exists()
