"""Sources and injections: the hook points, the provenance fields of a batch, and state that
travels with checkpoints."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from mixrl.config.compose import compose_config
from mixrl.core import provenance as prov
from mixrl.sources import HOOKS, INJECTIONS, InjectContext, Injection, Rollouts
from mixrl.sources.inject import GroupReplace
from mixrl.sources.rows import append_rows


class _Tok:
    eos_token_id, pad_token_id = 0, 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


def _ctx(process_index=0, num_processes=1, G=4, max_len=8):
    return InjectContext(
        tokenizer=_Tok(), process_index=process_index, num_processes=num_processes, num_generations=G,
        max_completion_length=max_len, global_step=0, micro_step=0, device=torch.device("cpu"),
        tokenize_prompts=lambda ps: [[ord(c) for c in p] for p in ps], gather=lambda t: t,
    )


class _Expert:
    provenances = ("expert",)

    def for_prompt(self, row):
        return row.get("expert") or []


def test_group_replace_fills_the_last_k_slots_by_global_index():
    """6 local rows on process 1 of 2 with groups of 4: global rows 6..11, so local rows 0-1
    end group 1 (slots 2, 3) and local rows 2-5 are group 2 (slots 0..3); k = 2."""
    inj = GroupReplace(per_group=2, source=_Expert())
    inputs = [{"prompt": f"p{i}", "expert": ["ab", "cd"]} for i in range(6)]
    rollouts = Rollouts([[1, 2]] * 6, [[-0.5, -0.5]] * 6, [prov.ON_POLICY] * 6)
    out = inj.after_generation(_ctx(process_index=1), inputs, rollouts)
    assert out.row_source == [prov.EXPERT, prov.EXPERT, prov.ON_POLICY, prov.ON_POLICY, prov.EXPERT, prov.EXPERT]
    assert out.completion_ids[0] == [ord("a"), ord("b"), 0] and out.completion_ids[1] == [ord("c"), ord("d"), 0]
    assert out.logprobs[0] == [None, None, None]  # behaviour unknown, never a number
    assert out.completion_ids[2] == [1, 2] and out.logprobs[2] == [-0.5, -0.5]


def test_append_rows_extends_every_provenance_field():
    out = {
        "prompt_ids": torch.tensor([[5, 6]]), "prompt_mask": torch.ones(1, 2, dtype=torch.long),
        "completion_ids": torch.tensor([[7, 8, 9]]), "completion_mask": torch.ones(1, 3, dtype=torch.long),
        "advantages": torch.tensor([0.7]), "row_source": torch.tensor([prov.ON_POLICY]),
        "token_source": torch.full((1, 3), prov.ON_POLICY), "behaviour_logp": torch.full((1, 3), float("nan")),
        "group_id": torch.tensor([0]), "old_per_token_logps": torch.tensor([[-0.1, -0.2, -0.3]]),
    }
    new = append_rows(out, [[1, 2, 3]], [[4, 5, 6, 7]], pad_id=0, row_source=torch.tensor([prov.EXPERT]))
    assert new["prompt_ids"].tolist() == [[0, 5, 6], [1, 2, 3]]
    assert new["completion_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert new["token_source"].tolist() == [[prov.ON_POLICY] * 3 + [-1], [prov.EXPERT] * 4]
    assert new["advantages"].tolist() == pytest.approx([0.7, 0.0]) and new["group_id"].tolist() == [0, -1]
    assert new["row_source"].tolist() == [prov.ON_POLICY, prov.EXPERT]
    assert torch.isnan(new["old_per_token_logps"][1]).all()  # nobody computed them: NaN, not 0
    assert new["old_per_token_logps"][0, :3].tolist() == pytest.approx([-0.1, -0.2, -0.3])


def test_hooks_are_named_in_trl_order():
    assert HOOKS == ("before_generation", "after_generation", "after_rewards", "after_advantages")
    assert all(hasattr(Injection, h) for h in HOOKS)


@INJECTIONS.register("test_recorder")
class _Recorder(Injection):
    """Test injection: records every hook call and counts generation batches (its state).

    Formula: (nothing changes)
    """

    calls: list = []
    needs_source = False

    def __init__(self, *, source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        self.batches = 0

    def before_generation(self, ctx, inputs):
        self.calls.append(("before_generation", len(inputs)))
        return inputs

    def after_generation(self, ctx, inputs, rollouts):
        self.calls.append(("after_generation", len(rollouts.completion_ids)))
        return rollouts

    def after_rewards(self, ctx, inputs, rewards):
        self.calls.append(("after_rewards", tuple(rewards.shape)))
        return rewards

    def after_advantages(self, ctx, inputs, out):
        self.calls.append(("after_advantages", tuple(out["token_source"].shape)))
        assert {"row_source", "token_source", "behaviour_logp", "group_id", "advantages"} <= set(out)
        self.batches += 1
        return out

    def state_dict(self):
        return {"batches": self.batches}

    def load_state_dict(self, state):
        self.batches = int(state["batches"])


@pytest.mark.slow
def test_hooks_run_in_order_and_injection_state_travels_with_checkpoints(fast_overrides):
    from mixrl.trainer.run import train

    _Recorder.calls.clear()
    cfg = compose_config([*fast_overrides, "algo.inject.name=test_recorder", "trainer.eval_size=0", "trainer.save_steps=1"])
    result = train(cfg)
    names = [c[0] for c in _Recorder.calls]
    assert names == list(HOOKS) * 2  # two steps, one generation batch each
    assert _Recorder.calls[1][1] == 16 and _Recorder.calls[2][1] == (16,)  # 4 prompts x 4 generations
    states = sorted(Path(result.run_dir).glob("trainer/checkpoint-*/mixrl_state.json"))
    assert states, "no mixrl_state.json in the checkpoints"
    saved = json.loads(states[-1].read_text())
    assert saved["injections"] == [{"batches": int(states[-1].parent.name.split("-")[1])}]
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert all(math.isfinite(r["loss"]) for r in rows)
