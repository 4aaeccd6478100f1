"""`mixrl plan`: geometry, per-GPU memory estimate and launch command, no model loaded."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.config.compose import compose_config, list_recipe_names
from mixrl.plan import GB, KNOWN_MODELS, PUBLISHED_PARAMS_B, _shape, estimate, model_shape

GPU_RECIPES = [r for r in list_recipe_names() if compose_config([f"recipe={r}"]).hardware.device == "cuda"]


def test_there_are_gpu_recipes():
    assert len(GPU_RECIPES) >= 4


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_plan_prints_for_every_gpu_recipe(recipe):
    result = CliRunner().invoke(app, ["plan", recipe])
    assert result.exit_code == 0, result.output
    out = result.output
    cfg = compose_config([f"recipe={recipe}"])
    assert f"plan: {recipe}" in out and "rollouts/step" in out
    for part in ("weights", "gradients", "optimizer state", "activations", "peak"):
        assert part in out, part
    assert "memory estimate per GPU" in out and "GPU (" in out  # fits / does not fit an N GB GPU (x%)
    assert f"mixrl train recipe={recipe}" in out
    if cfg.hardware.num_processes > 1:
        assert "-m accelerate.commands.launch --config_file RUN_DIR/launch/accelerate.yaml" in out
    if cfg.hardware.use_vllm and cfg.hardware.vllm_mode == "colocate":
        assert "vLLM colocated" in out and "KV cache" in out


@pytest.mark.parametrize("hub_id", sorted(PUBLISHED_PARAMS_B))
def test_parameter_count_formula_matches_the_published_sizes(hub_id):
    n = _shape(KNOWN_MODELS[hub_id], "t").params()
    assert n / 1e9 == pytest.approx(PUBLISHED_PARAMS_B[hub_id], rel=0.01)


def test_local_config_json_is_read_without_weights(tmp_path):
    conf = dict(KNOWN_MODELS["Qwen/Qwen2.5-Math-1.5B"], num_hidden_layers=2)
    (tmp_path / "config.json").write_text(json.dumps(conf))
    cfg = compose_config([f"model.path={tmp_path}"])
    shape = model_shape(cfg)
    assert shape.source == str(tmp_path / "config.json") and shape.layers == 2
    unknown = compose_config(["model.path=someone/unknown-model"])
    assert model_shape(unknown) is None
    result = CliRunner().invoke(app, ["plan", "model.path=someone/unknown-model"])
    assert result.exit_code == 0 and "unknown model shape" in result.output


def test_estimate_by_hand_for_each_strategy():
    """1.5B model (bf16, p = 2), 8 processes: the per-GPU terms of the docstring by hand."""
    base = ["recipe=grpo/qwen2.5-math-1.5b-gsm8k", "hardware=gpu-8x80g", "trainer.micro_batch_size=4", "hardware.use_vllm=false"]
    shape = model_shape(compose_config(base))
    N, W, p = shape.params(), 8, 2
    ddp = estimate(compose_config(base), shape, prompt_tokens=256)
    assert (ddp["weights"], ddp["gradients"], ddp["optimizer"]) == (N * p, N * p, 2 * N * p)
    z2 = estimate(compose_config([*base, "hardware.strategy=zero2"]), shape, prompt_tokens=256)
    assert (z2["weights"], z2["gradients"], z2["optimizer"]) == (N * p, N * p / W, 12 * N / W)
    z3 = estimate(compose_config([*base, "hardware.strategy=zero3"]), shape, prompt_tokens=256)
    assert (z3["weights"], z3["gradients"], z3["optimizer"]) == (N * p / W, N * p / W, 12 * N / W)
    z3o = estimate(compose_config([*base, "hardware.strategy=zero3", "hardware.offload=true"]), shape, prompt_tokens=256)
    assert (z3o["weights"], z3o["optimizer"]) == (0.0, 0.0)
    fsdp = estimate(compose_config([*base, "hardware.strategy=fsdp"]), shape, prompt_tokens=256)
    assert (fsdp["weights"], fsdp["gradients"], fsdp["optimizer"]) == (N * p / W, N * p / W, 2 * N * p / W)
    s, b, h, L = 256 + 1024, 4, 1536, 28
    assert ddp["activations"] == L * s * b * h * p + 34 * s * b * h  # gradient checkpointing on
    assert ddp["logits"] == s * b * 151936 * (p + 4)
    rows = 32 * 8 // W
    assert ddp["generation"] == 2 * L * (2 * 128) * p * s * rows  # KV heads 2 x head dim 128
    assert ddp["peak"] == ddp["weights"] + ddp["optimizer"] + max(ddp["gradients"] + ddp["activations"] + ddp["logits"], ddp["generation"])


def test_vllm_colocate_share_and_lora():
    cfg = compose_config(["recipe=chord/qwen2.5-7b-openr1"])
    shape = model_shape(cfg)
    e = estimate(cfg, shape)
    assert e["vllm_share"] == pytest.approx(0.3 * 80 * GB) and e["vllm_weights"] == shape.params() * 2
    assert e["vllm_kv_tokens"] == int((0.3 * 80 * GB - shape.params() * 2) // (2 * 28 * 512 * 2))
    lora = estimate(compose_config(["recipe=chord/qwen2.5-7b-openr1", "model.lora.enabled=true", "model.lora.r=8"]), shape)
    assert lora["trainable_params"] == shape.lora_params(8) < shape.params() / 100
    assert lora["optimizer"] == 2 * shape.lora_params(8) * 2
