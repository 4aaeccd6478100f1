"""`mixrl plan`: geometry, per-GPU memory estimate and launch command, no model loaded."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.config.compose import compose_config, list_recipe_names
from mixrl.config.rehearsal import gpu_recipes
from mixrl.plan import GB, KNOWN_MODELS, PUBLISHED_PARAMS_B, _shape, estimate, model_shape

# read from the recipe files alone: composing every recipe here, at collection, cost every pytest
# process (each xdist worker of every `make` stage) seconds; the test below checks the two agree
GPU_RECIPES = gpu_recipes()


def test_there_are_gpu_recipes():
    assert len(GPU_RECIPES) >= 4
    assert GPU_RECIPES == [r for r in list_recipe_names() if compose_config([f"recipe={r}"]).hardware.device == "cuda"]


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


@pytest.mark.parametrize("hub_id", sorted(PUBLISHED_PARAMS_B))
def test_parameter_count_formula_is_exact_against_transformers(hub_id):
    """The formula counts exactly the parameters transformers builds from the same config (on
    the meta device: no memory), Qwen3's explicit head_dim and q/k norms included."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    conf = dict(KNOWN_MODELS[hub_id])
    hf_conf = AutoConfig.for_model(conf.pop("model_type"), **conf)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_conf)
    # named_parameters de-duplicates a tied LM head, as the formula's one V h does
    assert _shape(KNOWN_MODELS[hub_id], "t").params() == sum(q.numel() for q in model.parameters())


def test_qwen3_shape_by_hand():
    """Qwen3-4B: head_dim 128 from config.json, not hidden / heads = 2560 / 32 = 80 (for the 8B both
    give 128), no q/k/v biases, per-head q/k norms, tied embeddings; Qwen2.5 unchanged."""
    s4 = _shape(KNOWN_MODELS["Qwen/Qwen3-4B-Instruct-2507"], "t")
    assert (s4.head_dim, s4.q_dim, s4.kv_dim, s4.bias, s4.qk_norm, s4.tied) == (128, 4096, 1024, False, True, True)
    h, i, q, kv, L, V = 2560, 9728, 4096, 1024, 36, 151936
    assert s4.params() == V * h + L * (h * q + 2 * h * kv + q * h + 2 * 128 + 3 * h * i + 2 * h) + h
    q2 = _shape(KNOWN_MODELS["Qwen/Qwen2.5-Math-1.5B"], "t")
    assert (q2.head_dim, q2.q_dim, q2.bias, q2.qk_norm) == (128, 1536, True, False)


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


SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "vocab_size", "tie_word_embeddings", "model_type", "max_position_embeddings")


def test_the_built_in_models_rows_are_their_built_configs(tiny_model_path, tiny_bpe_model_path):
    """The plan reads a built-in model's shape from the table alone, so the table must be what a build writes."""
    for name, folder in (("builtin:tiny", tiny_model_path), ("builtin:tiny-bpe", tiny_bpe_model_path)):
        built = json.loads((Path(folder) / "config.json").read_text())
        assert {k: built[k] for k in SHAPE_KEYS} == {k: KNOWN_MODELS[name][k] for k in SHAPE_KEYS}, name


def test_a_recipe_page_reads_the_same_whatever_the_local_cache_holds(tiny_model_path, tiny_bpe_model_path, tmp_path,
                                                                      monkeypatch):
    """Issue 50: the recipe pages embed `mixrl plan`; a built tiny model in the cache (another HOME,
    another MIXRL_CACHE) must not put its path, or anything else, into them."""
    import shutil

    from mixrl.cli.reference import recipe_page
    from mixrl.models import tiny_bpe, tiny_spec

    names = ["grpo/arith-tiny", "opd/arith-tiny"]
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("MIXRL_CACHE", str(tmp_path / "empty"))
    bare = [recipe_page(n) for n in names]
    monkeypatch.delenv("MIXRL_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    shutil.copytree(tiny_model_path, tiny_spec.default_path())  # built here, as `mixrl model build-tiny` leaves it
    shutil.copytree(tiny_bpe_model_path, tiny_bpe.default_path())
    assert tiny_spec.is_complete(tiny_spec.default_path()) and str(tmp_path / "home") in str(tiny_spec.default_path())
    built = [recipe_page(n) for n in names]
    assert built == bare
    assert not any(str(tmp_path) in page or ".cache" in page for page in built)
    assert all("model shape from mixrl.models.known.KNOWN_MODELS" in page for page in built)
    assert model_shape(compose_config(["model.path=builtin:tiny-bpe"])).source.startswith("mixrl.models.known.KNOWN_MODELS")


def test_estimate_by_hand_for_each_strategy():
    """1.5B model (bf16, p = 2), 8 processes: the per-GPU terms of the docstring by hand."""
    base = ["recipe=grpo/qwen2.5-math-1.5b-gsm8k", "hardware=gpu-8x80g", "trainer.micro_batch_size=4", "hardware.use_vllm=false"]
    shape = model_shape(compose_config(base))
    N, W, p = shape.params(), 8, 2
    ddp = estimate(compose_config(base), shape, prompt_tokens=256)
    assert (ddp["weights"], ddp["gradients"], ddp["optimizer"], ddp["ddp_buckets"]) == (N * p, N * p, 2 * N * p, N * p)
    z2 = estimate(compose_config([*base, "hardware.strategy=zero2"]), shape, prompt_tokens=256)
    assert (z2["weights"], z2["gradients"], z2["optimizer"], z2["ddp_buckets"]) == (N * p, N * p / W, 12 * N / W, 0)
    z3 = estimate(compose_config([*base, "hardware.strategy=zero3"]), shape, prompt_tokens=256)
    assert (z3["weights"], z3["gradients"], z3["optimizer"]) == (N * p / W, N * p / W, 12 * N / W)
    z3o = estimate(compose_config([*base, "hardware.strategy=zero3", "hardware.offload=true"]), shape, prompt_tokens=256)
    assert (z3o["weights"], z3o["optimizer"]) == (0.0, 0.0)
    fsdp = estimate(compose_config([*base, "hardware.strategy=fsdp"]), shape, prompt_tokens=256)
    # accelerate's FSDP2 keeps float32 master weights under bf16 mixed precision
    assert (fsdp["weights"], fsdp["gradients"], fsdp["optimizer"]) == (N * 4 / W, N * 4 / W, 2 * N * 4 / W)
    h, V, L, i, kv = 1536, 151936, 28, 8960, 2 * 128
    assert fsdp["gathered"] == (2 * (N - V * h) / L + V * h) * p  # tied embeddings: one V h
    s, b, C = 256 + 1024, 4, 1024
    a = 2 * (4 * h + p * h) + p * (h + 2 * kv) + 2 * p * h + 4 * p * i + 4 * 12
    assert ddp["activations"] == s * b * (L * h * p + a + 4 * h + p * h)  # gradient checkpointing on
    T = b * C  # CUDA: the fused head scores the completion tokens only
    assert ddp["lm_head"] == T * h * p + 4096 * 32768 * p + T * h * 4 + V * h * (4 + p)  # V > 32768: full-width tile
    assert ddp["plain_log_softmax"] == T * V * (p + 4) > 2 * ddp["lm_head"]
    rows = 32 * 8 // W
    assert ddp["generation"] == 2 * L * kv * p * s * rows
    held = ddp["weights"] + ddp["optimizer"] + ddp["ddp_buckets"]
    assert ddp["train_phase"] == held + ddp["gradients"] + ddp["activations"] + ddp["lm_head"]
    assert ddp["peak"] == max(ddp["train_phase"], held + ddp["generation"])


def test_lm_head_constants_are_trls():
    """The plan's LM-head tile is TRL's: a TRL upgrade that changes it fails here."""
    from trl.kernels import chunked_logprob
    from trl.trainer import utils as trl_utils

    from mixrl.plan import LM_HEAD_TILE_TOKENS, LM_HEAD_TILE_VOCAB

    assert chunked_logprob.TOKEN_CHUNK_SIZE == LM_HEAD_TILE_TOKENS
    # TRL's value as shipped (read from its source: a trainer built earlier in this process narrows
    # the module global to its vocabulary, mixrl.trainer.lm_head.fit_tile_to_vocab)
    shipped = re.search(r"^_CHUNKED_LOGPROB_CHUNK_SIZE\s*=\s*(\d+)", Path(trl_utils.__file__).read_text(), re.M)
    assert shipped and int(shipped.group(1)) == LM_HEAD_TILE_VOCAB


@pytest.mark.parametrize("dims", [(64, 176, 2, 4, 2, None, "qwen2"), (96, 352, 2, 6, 2, None, "qwen2"),
                                  (64, 176, 2, 4, 2, 32, "qwen3"), (96, 352, 2, 6, 2, 16, "qwen3")])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_activation_formula_matches_what_autograd_saves(dims, dtype):
    """The activation estimate against the bytes a Qwen2 / Qwen3 backbone really keeps for backward
    (every saved tensor's storage counted once, parameters excluded), without checkpointing; the
    Qwen3 cases take a head_dim other than hidden / heads, as Qwen3-4B's 128 vs 2560 / 32."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from mixrl.plan import activation_bytes

    h, i, L, heads, kv_heads, head_dim, model_type = dims
    conf = dict(vocab_size=300, hidden_size=h, intermediate_size=i, num_hidden_layers=L, num_attention_heads=heads,
                num_key_value_heads=kv_heads, max_position_embeddings=128, model_type=model_type, tie_word_embeddings=True)
    if head_dim:
        conf["head_dim"] = head_dim
    torch.manual_seed(0)
    hf_conf = AutoConfig.for_model(model_type, attn_implementation="sdpa", **{k: v for k, v in conf.items() if k != "model_type"})
    model = AutoModelForCausalLM.from_config(hf_conf).to(getattr(torch, dtype)).train()
    params = {q.untyped_storage().data_ptr() for q in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(0, 300, (8, 64))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.model(input_ids=ids, use_cache=False)
    p = 2 if dtype == "bfloat16" else 4
    planned = activation_bytes(_shape(conf, "t"), p, ids.numel(), checkpointing=False)
    assert sum(saved.values()) == pytest.approx(planned, rel=0.1)


def test_every_shipped_gpu_recipe_fits_its_gpus():
    """``mixrl plan`` says every shipped GPU recipe fits its hardware with 10 % headroom."""
    from mixrl.plan import fits

    for recipe in GPU_RECIPES:
        cfg = compose_config([f"recipe={recipe}"])
        e = estimate(cfg, model_shape(cfg))
        assert e["gpu_gb"] == 80 and fits(e), f"{recipe}: {e['peak'] / GB:.1f} GB"


def test_the_fit_check_can_fail():
    """The same check refuses an over-large setting: the 7B CHORD recipe under DDP, with 32-row micro-batches
    (no token budget), or with a token budget of 32 full-length rows."""
    from mixrl.plan import fits

    for extra in (["hardware=gpu-8x80g-vllm"], ["trainer.micro_batch_size=32", "trainer.max_tokens_per_micro_batch=null"],
                  [f"trainer.max_tokens_per_micro_batch={32 * (512 + 10240)}"]):
        cfg = compose_config(["recipe=chord/qwen2.5-7b-openr1", *extra])
        e = estimate(cfg, model_shape(cfg))
        assert not fits(e), extra
    out = CliRunner().invoke(app, ["plan", "recipe=chord/qwen2.5-7b-openr1", "hardware=gpu-8x80g-vllm"]).output
    assert "does NOT fit a 80 GB GPU" in out


def test_sleep_mode_and_teachers():
    """vLLM's share counts while training only without sleep mode; a teacher model's weights count."""
    on = estimate(cfg := compose_config(["recipe=luffy/qwen2.5-math-7b-openr1"]), model_shape(cfg))
    off = estimate(cfg := compose_config(["recipe=luffy/qwen2.5-math-7b-openr1", "hardware.vllm_enable_sleep_mode=false"]),
                   model_shape(cfg))
    assert on["vllm_sleeps"] and not off["vllm_sleeps"]
    assert off["train_phase"] - on["train_phase"] == pytest.approx(0.3 * 80 * GB)
    kd = estimate(cfg := compose_config(["recipe=kdrl/qwen2.5-math-1.5b-openr1"]), model_shape(cfg))
    assert kd["teachers"] == _shape(KNOWN_MODELS["Qwen/Qwen2.5-Math-7B-Instruct"], "t").params() * 2


def test_vllm_colocate_share_and_lora():
    cfg = compose_config(["recipe=chord/qwen2.5-7b-openr1"])
    shape = model_shape(cfg)
    e = estimate(cfg, shape)
    assert e["vllm_share"] == pytest.approx(0.3 * 80 * GB) and e["vllm_weights"] == shape.params() * 2
    assert e["vllm_kv_tokens"] == int((0.3 * 80 * GB - shape.params() * 2) // (2 * 28 * 512 * 2))
    lora = estimate(compose_config(["recipe=chord/qwen2.5-7b-openr1", "hardware=gpu-8x80g-vllm", "model.lora.enabled=true",
                                    "model.lora.r=8"]), shape)
    assert lora["trainable_params"] == shape.lora_params(8) < shape.params() / 100
    assert lora["optimizer"] == 2 * shape.lora_params(8) * 2  # DDP: two bf16 moments of the adapter
    assert lora["lm_head"] < e["lm_head"]  # the LM head's weight gradient is not accumulated (frozen)
