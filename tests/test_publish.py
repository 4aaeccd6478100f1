"""Trackers get held-out accuracy, pass@k, mu and per-source metrics; saved models carry a
model card and load in plain transformers; LoRA runs save a merged model on request."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from mixrl.trainer.publish import heldout_logs, log_heldout

TB = importlib.util.find_spec("tensorboard") is not None


def _train(overrides, console=None):
    from rich.console import Console

    from mixrl.config.compose import compose_config
    from mixrl.trainer.run import train

    return train(compose_config(overrides), console or Console(quiet=True))


def test_heldout_logs_are_the_numbers_of_a_result():
    assert heldout_logs({"accuracy": 0.5, "n": 8.0, "pass@4": 0.75, "samples": 4.0, "note": "x"}) == {
        "eval/accuracy": 0.5, "eval/pass@4": 0.75}


def test_log_heldout_reaches_every_tracker_callback():
    """Without a tracker package: a stand-in for transformers' integration callbacks."""
    from transformers import TrainerCallback, TrainerControl, TrainerState

    seen = []

    class FakeTracker(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            seen.append((state.global_step, logs))

    FakeTracker.__module__ = "transformers.integrations.integration_utils"

    class Trainer:
        args, state, control = None, TrainerState(global_step=7), TrainerControl()
        callback_handler = type("H", (), {"callbacks": [FakeTracker(), TrainerCallback()]})()

    assert log_heldout(Trainer(), {"accuracy": 0.25, "n": 4.0}) == {"eval/accuracy": 0.25}
    assert seen == [(7, {"eval/accuracy": 0.25})]


@pytest.mark.slow
@pytest.mark.skipif(not TB, reason="tensorboard is not installed (pip install 'mixrl[tensorboard]')")
def test_tensorboard_gets_heldout_passk_mu_and_per_source_metrics(fast_overrides, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), width=400)
    result = _train([*fast_overrides, "recipe=chord/arith-tiny", "logger=tensorboard", "trainer.eval_every=1",
                     "trainer.eval_samples=2", "trainer.eval_pass_at=[1,2]", "logger.progress=false"], console)
    assert f"TensorBoard events: {result.run_dir / 'tensorboard'}" in console.file.getvalue()  # printed at the start
    ea = EventAccumulator(str(result.run_dir / "tensorboard"))
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    steps = lambda tag: [e.step for e in ea.Scalars(tag)]  # noqa: E731
    # held-out accuracy: before (step 0), every step (eval_every=1), after (last step)
    assert steps("eval/accuracy") == [0, 1, 2, 2]
    assert steps("eval/pass@2") == [0, 1, 2, 2]
    values = [e.value for e in ea.Scalars("eval/accuracy")]
    assert values[0] == pytest.approx(result.summary["eval_before"]["accuracy"])
    assert values[-1] == pytest.approx(result.summary["eval_after"]["accuracy"])
    assert not any(t.startswith("train/eval") for t in tags)  # one name for the held-out series (issue 27)
    # mixrl's step metrics: mu, per-source rows, each loss term
    assert {"train/mu", "train/expert/rows", "train/expert/token_prob", "train/loss/sft", "train/reward_on_policy"} <= tags


def test_model_card_and_plain_transformers_load(fast_overrides):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result = _train([*fast_overrides, "recipe=grpo/arith-tiny"])
    model_dir = result.run_dir / "model"
    card = (model_dir / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers")
    assert "recipe: grpo/arith-tiny" in card and "## Held-out results" in card
    acc_b, acc_a = result.summary["eval_before"]["accuracy"], result.summary["eval_after"]["accuracy"]
    assert f"| accuracy | {acc_b:.4f} | {acc_a:.4f} |" in card
    assert "```yaml" in card and "name: grpo" in card and "AutoModelForCausalLM.from_pretrained" in card
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))  # plain transformers, no mixrl
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    ids = tok("3+4=", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > ids.shape[1]


@pytest.mark.slow
def test_lora_run_saves_a_merged_model_on_request(fast_overrides):
    from transformers import AutoModelForCausalLM

    from mixrl.config.compose import compose_config
    from mixrl.evaluation.saved import load_saved_model

    overrides = [*fast_overrides, "model.lora.enabled=true", "model.lora.r=4", "model.lora.save_merged=true", "trainer.learning_rate=1e-2"]
    result = _train(overrides)
    merged_dir = result.run_dir / "model-merged"
    assert result.summary["merged_model_dir"] == str(merged_dir)
    assert (result.run_dir / "model" / "adapter_config.json").is_file() and not (merged_dir / "adapter_config.json").exists()
    assert "library_name: peft" in (result.run_dir / "model" / "README.md").read_text()
    assert "library_name: transformers" in (merged_dir / "README.md").read_text()
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir))  # plain transformers
    reference = load_saved_model(result.run_dir / "model", compose_config(overrides))  # base + adapter, merged in memory
    ref_params = dict(reference.named_parameters())
    for name, p in merged.named_parameters():
        assert torch.allclose(p, ref_params[name]), name
    # merging by hand: a non-zero adapter (B = 0 at init and a 2-step run may not move it)
    from safetensors.torch import load_file, save_file

    from mixrl.trainer.publish import save_merged

    adapter = result.run_dir / "model" / "adapter_model.safetensors"
    tensors = load_file(str(adapter))
    gen = torch.Generator().manual_seed(0)
    tensors = {k: torch.randn(v.shape, generator=gen) * 0.1 for k, v in tensors.items()}
    save_file(tensors, str(adapter))
    out = save_merged(result.run_dir / "model", compose_config(overrides), result.run_dir / "merged-by-hand")
    merged = dict(AutoModelForCausalLM.from_pretrained(str(out)).named_parameters())
    base = dict(AutoModelForCausalLM.from_pretrained(fast_overrides[-2].split("=", 1)[1]).named_parameters())
    key_a = next(k for k in tensors if "q_proj.lora_A" in k)
    A, B = tensors[key_a], tensors[key_a.replace("lora_A", "lora_B")]
    name = key_a.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")  # model.layers.0.self_attn.q_proj.weight
    alpha, r = 32, 4  # model.lora.alpha default, r above: W' = W + alpha / r * B A
    assert torch.allclose(merged[name], base[name] + alpha / r * B @ A, atol=1e-5)
