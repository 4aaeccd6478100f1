"""``mixrl train recipe=NAME --rehearse`` (mixrl/config/rehearsal.py): the swaps, the schema samples,
and every GPU recipe rehearsed end to end on CPU.

* The fast tests (in ``make test``): every hub data config has a shipped sample with the columns of
  its dataset (the test fixtures' columns, tests/fixtures/make_fixtures.py, which cite the cards);
  the sample goes through the same loading code as the hub id (``datasets.load_dataset`` of the hub id
  answered with the sample: the same rows come out); CHORD's swaps keep its expert ratio (0.2) and its
  mu schedule's shape (values at the scaled knots = the recipe's at its knots, by hand from the
  cosine formula); bad uses exit 2 having created nothing.
* ``rehearse`` (``make rehearse``, excluded from ``make test``): each GPU recipe (discovered:
  every recipe whose hardware is a GPU config) trains, evaluates and saves through ``mixrl train
  --rehearse``; a recipe that cannot is a failure. Each one's time: ``--durations=0`` (make rehearse). A recipe that names an evaluation suite (``recipe_info.benchmarks``) is also evaluated on it (``mixrl eval RUN benchmarks=recipe``, the test fixtures).
* ``vllm`` (``make test-vllm``, .venv-vllm): one vLLM recipe rehearsed through vLLM's CPU build.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from mixrl.benchmarks import spec
from mixrl.config import rehearsal
from mixrl.config.compose import compose_config
from mixrl.config.geometry import geometry
from mixrl.config.recipe_index import recipes_dir
from train_process import free_port, train_env, train_in_group

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
TIMEOUT_S = 420  # one rehearsal; ~20-60 s on a 2-core machine, minutes when it is loaded

#: data config -> the test fixture with its hub dataset's columns (tests/fixtures/make_fixtures.py)
FIXTURE_OF = {
    "openr1-math": "openr1_math.jsonl",
    "luffy-openr1-46k": "luffy_openr1.jsonl",
    "critique-grpo-openr1-4k": "critique_grpo_openr1_4k.jsonl",
    "ampo-openr1-4longcots": "ampo_openr1_4longcots.jsonl",
    "ghpo-math3to5": "ghpo_math3to5.jsonl",
    "gsm8k": "gsm8k.jsonl",
    "ultrafeedback-binarized": "ultrafeedback_binarized.jsonl",
}


def _hub_data_configs() -> list[str]:
    from omegaconf import OmegaConf

    out = []
    for path in sorted((ROOT / "conf" / "data").glob("*.yaml")):
        if rehearsal.is_hub_id(OmegaConf.load(path).get("source")):
            out.append(path.stem)
    return out


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _shape(value):
    """A JSON value's type structure: dict keys with their shapes, a list's element shape."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


# ----------------------------------------------------------------------------- samples


def test_every_hub_data_config_has_a_sample_with_its_datasets_columns():
    configs = _hub_data_configs()
    assert set(configs) >= set(FIXTURE_OF), configs
    for name in configs:
        sample = rehearsal.sample_path(name)
        assert sample.is_file(), f"no rehearsal sample for data={name}: run scripts/make_rehearsal_samples.py"
        rows = _rows(sample)
        assert 20 <= len(rows) <= 60, (name, len(rows))
        fixture = _shape(_rows(FIXTURES / FIXTURE_OF[name])[0])
        for r in rows:
            assert _shape(r) == fixture, (name, _shape(r), fixture)


def test_sample_answers_are_checked_by_math_verify():
    """Every expert trace's boxed answer is the gold answer by math-verify (the `math` reward)."""
    from math_verify import parse, verify

    for row in _rows(rehearsal.sample_path("openr1-math")):
        assert verify(parse(f"${row['answer']}$"), parse(row["messages"][1]["content"])), row["problem"]
    for row in _rows(rehearsal.sample_path("luffy-openr1-46k")):
        assert verify(parse(f"${row['reward_model']['ground_truth']}$"), parse(row["target"][0]["content"]))
    for row in _rows(rehearsal.sample_path("ghpo-math3to5")):
        assert verify(parse(row["solution"]), parse(row["solution_hint"]))
    for row in _rows(rehearsal.sample_path("gsm8k")):
        assert row["answer"].rsplit("#### ", 1)[1].strip().isdigit()


@pytest.mark.parametrize("name", sorted(FIXTURE_OF))
def test_sample_loads_through_the_hub_ids_code_path(name, monkeypatch):
    """The rehearsal swaps the source only: ``load_dataset_rows(<hub id>)`` with the hub answering
    the sample's rows, and ``load_dataset_rows(<sample file>)``, give the same standard rows."""
    import datasets

    from mixrl.data.loading import load_dataset_rows

    cfg = compose_config([f"data={name}"])
    d = cfg.data
    sample = rehearsal.sample_path(name)
    calls = []
    real = datasets.load_dataset

    def hub(path, *args, **kwargs):
        if path == d.source:
            calls.append((path, args, kwargs))
            return real("json", data_files=[str(sample)], split="train")
        return real(path, *args, **kwargs)

    kw = dict(split=d.split, prompt_column=d.prompt_column, answer_column=d.answer_column,
              expert_column=d.expert_column, system_prompt=d.system_prompt)
    monkeypatch.setattr(datasets, "load_dataset", hub)
    via_hub = load_dataset_rows(d.source, subset=d.subset, **kw)
    assert calls and calls[0][1] == (d.subset,)  # the hub path ran, with the config's subset
    via_file = load_dataset_rows(str(sample), subset=None, **kw)
    assert via_hub.column_names == via_file.column_names
    assert via_hub.to_list() == via_file.to_list()
    assert len(via_file) == len(_rows(sample))
    if d.expert_column:  # a data set with expert traces (critique-grpo-openr1-4k has none)
        assert "expert" in via_file.column_names and all(via_file["expert"])
    else:
        assert "expert" not in via_file.column_names


# ----------------------------------------------------------------------------- the swaps


@pytest.fixture(scope="module")
def chord():
    cfg = compose_config(["recipe=chord/qwen2.5-7b-openr1"])
    swaps = rehearsal.plan_rehearsal(cfg, vllm=False)
    reh = compose_config(["recipe=chord/qwen2.5-7b-openr1", *rehearsal.overrides(swaps)])
    return cfg, swaps, reh


def test_chord_swaps_model_data_hardware_and_keeps_the_rest(chord):
    cfg, swaps, reh = chord
    keys = {s.key for s in swaps}
    assert {"model", "model.path", "data.source", "hardware", "trainer.max_steps"} <= keys
    assert reh.model.name == "tiny-bpe" and reh.model.dtype == "float32"
    assert Path(reh.model.path).name.endswith(f"-context{rehearsal.CONTEXT}")
    assert json.loads((Path(reh.model.path) / "config.json").read_text())["max_position_embeddings"] == rehearsal.CONTEXT
    assert reh.data.source == str(rehearsal.sample_path("chord-openr1")) and reh.data.subset is None
    assert reh.offpolicy.source.dataset == str(rehearsal.sample_path("chord-openr1"))
    assert reh.hardware.name == "cpu-2proc-fsdp" and reh.hardware.strategy == "fsdp" and not reh.hardware.bf16
    assert reh.trainer.max_steps == rehearsal.STEPS and 0 < reh.trainer.save_steps <= reh.trainer.max_steps
    # what the recipe says, untouched
    for key in ("algo.loss", "algo.advantage", "algo.terms", "reward", "data.system_prompt", "data.prompt_column",
                "data.expert_column", "trainer.learning_rate", "trainer.temperature", "algo.coefs.mu.peak",
                "algo.coefs.mu.valley", "algo.coefs.mu.name"):
        from omegaconf import OmegaConf

        assert OmegaConf.select(reh, key) == OmegaConf.select(cfg, key), key


def test_chord_expert_ratio_kept(chord):
    """CHORD: 32 prompts x 8 rollouts + 64 expert rows = 0.2 expert; the rehearsal's geometry too."""
    cfg, _, reh = chord
    g0, g1 = geometry(cfg), geometry(reh)
    assert (g0.rollouts_per_step, g0.expert_rows_per_step) == (256, 64)
    assert g1.expert_rows_per_step / (g1.rollouts_per_step + g1.expert_rows_per_step) == pytest.approx(0.2)
    assert g1.world_size == 2 and g1.rollouts_per_step < g0.rollouts_per_step


def test_chord_mu_schedule_shape_kept(chord):
    """mu: cosine, warmup 200 -> peak 0.5, cosine decay over 400 -> valley 0.02, over 600 steps.
    Scaled by 2/600: warmup 1, decay 1. By hand from the formula (linear warmup 0 -> peak, then
    valley + (peak - valley)(1 + cos(pi t/decay))/2): mu(0) = 0, mu(end of warmup) = 0.5, mu(end of
    decay) = 0.02, in the recipe at 0/200/600 and in the rehearsal at 0/1/2."""
    from mixrl.core.schedules import resolve_schedule

    cfg, _, reh = chord
    m0, m1 = cfg.algo.coefs.mu, reh.algo.coefs.mu
    assert (m1.warmup, m1.decay) == (1, 1)
    f0, f1 = resolve_schedule(dict(m0)), resolve_schedule(dict(m1))
    for (s0, s1), want in zip(((0, 0), (200, 1), (600, 2)), (0.0, 0.5, 0.02)):
        assert f0(s0) == pytest.approx(want) and f1(s1) == pytest.approx(want), (s0, s1)


def test_a_qwen3_recipe_swaps_to_the_qwen2_family_tiny_model_and_says_so():
    """Qwen3 (explicit head_dim, q/k norms, its own chat template) rehearses on the Qwen2-family
    tiny model like any hub model; the swap's reason names the family change; a Qwen2.5 recipe's does not."""
    q3 = rehearsal.plan_rehearsal(compose_config(["recipe=srpo/qwen3-8b-openr1"]), vllm=False)
    model = next(s for s in q3 if s.key == "model")
    assert model.recipe.startswith("Qwen/Qwen3-8B") and "a qwen3 model: rehearsed as Qwen2 family" in model.why
    reh = compose_config(["recipe=srpo/qwen3-8b-openr1", *rehearsal.overrides(q3)])
    assert reh.model.name == "tiny-bpe" and reh.teacher.source.models == ["self"]
    q2 = rehearsal.plan_rehearsal(compose_config(["recipe=chord/qwen2.5-7b-openr1"]), vllm=False)
    assert "rehearsed as" not in next(s for s in q2 if s.key == "model").why


def test_a_hub_reward_model_swaps_to_the_builtin_one_and_a_builtin_one_stays():
    """reward=model with a hub classifier (simplemix/llama-3.1-8b-instruct-ultrafeedback) rehearses on
    builtin:tiny-rm, the rest of its reward config (no verifier, raw score) as the recipe's; the
    recipe's data has no gold answers (data.answer_column null) and its sample loads without them."""
    from mixrl.data.loading import load_dataset_rows

    cfg = compose_config(["recipe=simplemix/llama-3.1-8b-instruct-ultrafeedback"])
    swaps = rehearsal.plan_rehearsal(cfg, vllm=False)
    rm = next(s for s in swaps if s.key == "reward.params.path")
    assert (rm.recipe, rm.rehearsal) == ("Skywork/Skywork-Reward-Llama-3.1-8B-v0.2", "builtin:tiny-rm")
    assert "a llama model: rehearsed as Qwen2 family" in next(s for s in swaps if s.key == "model").why
    reh = compose_config(["recipe=simplemix/llama-3.1-8b-instruct-ultrafeedback", *rehearsal.overrides(swaps)])
    assert reh.reward.params.path == "builtin:tiny-rm" and reh.reward.params.verifier == "none"
    assert reh.data.answer_column is None
    rows = load_dataset_rows(reh.data.source, split=reh.data.split, prompt_column=reh.data.prompt_column,
                             answer_column=None, expert_column=reh.data.expert_column)
    assert "answer" not in rows.column_names and len(rows) == 24
    assert rows[0]["expert"] == ["She has 3 + 2 = <<3+2=5>>5 apples. The answer is 5."]  # the chosen conversation's reply
    cpu = compose_config(["recipe=grpo/arith-tiny", "reward=model"])
    assert not [s for s in rehearsal.plan_rehearsal(cpu, vllm=False) if s.key.startswith("reward")]


def test_a_recipe_that_reads_whole_groups_keeps_a_whole_group_per_process():
    """SOUP revisits round(revisit x whole groups) of each process's groups; one prompt over two processes
    is no whole group anywhere, so the historical prefix never ran: the rehearsal keeps W ceil(1/revisit)
    prompts (2 x ceil(1/0.5) = 4 here), capped at the recipe's own; a recipe without revisits keeps 1."""
    from mixrl.config.rehearsal_rules import whole_group_prompts

    cfg = compose_config(["recipe=soup/qwen2.5-math-7b-openr1"])
    swaps = rehearsal.plan_rehearsal(cfg, vllm=False)
    assert next(s for s in swaps if s.key == "trainer.prompts_per_step").rehearsal == 4
    assert whole_group_prompts(cfg, 1, 1) == 2 and whole_group_prompts(cfg, 2, 1) == 4
    small = compose_config(["recipe=soup/qwen2.5-math-7b-openr1", "trainer.prompts_per_step=8", "algo.inject.revisit=0.3"])
    assert whole_group_prompts(small, 1, 1) == 4 and whole_group_prompts(small, 4, 1) == 8  # 4 x ceil(1/0.3) = 16, capped at the recipe's 8
    plain = compose_config(["recipe=prefixrl/qwen3-4b-instruct-2507-openr1"])
    assert whole_group_prompts(plain, 2, 1) == 1
    # SimpleMix's on-policy pairs are the best vs worst of a whole group on one process: one per process
    mix = compose_config(["recipe=simplemix/llama-3.1-8b-instruct-ultrafeedback"])
    assert whole_group_prompts(mix, 2, 1) == 2 and whole_group_prompts(mix, 1, 1) == 1
    pairs = next(s for s in rehearsal.plan_rehearsal(mix, vllm=False) if s.key == "algo.inject.pairs")
    assert (pairs.recipe, pairs.rehearsal) == (128, 4)  # 2 x max(1, round(128 x 2 / (64 x 2))): 1 on- + 1 off-policy per process
    off = OmegaConf.create(OmegaConf.to_container(mix))
    off.algo.inject.on_policy = 0.0  # off-policy pairs only: no group is read
    assert whole_group_prompts(off, 2, 1) == 1


def test_no_swap_for_a_cpu_recipe():
    cfg = compose_config(["recipe=grpo/arith-tiny"])
    swaps = rehearsal.plan_rehearsal(cfg, vllm=False)
    assert not [s for s in swaps if s.key in ("model", "data.source", "hardware")]


def test_hardware_rules_cover_every_gpu_config():
    from omegaconf import OmegaConf

    for path in sorted((ROOT / "conf" / "hardware").glob("gpu-*.yaml")):
        hw = OmegaConf.load(path)
        several = int(hw.get("num_processes", 1)) > 1
        assert (str(hw.get("strategy", "ddp")), several) in rehearsal.CPU_HARDWARE, path.name


def test_gpu_recipes_are_discovered():
    names = rehearsal.gpu_recipes()
    assert "chord/qwen2.5-7b-openr1" in names and "grpo/qwen2.5-math-1.5b-gsm8k" in names
    assert not [n for n in names if n.endswith("arith-tiny")]


def _train(args: list[str], log: Path, timeout: float = TIMEOUT_S) -> tuple[int | str, float]:
    # a process-group port of its own: TRL's colocated vLLM engine takes 29500 whenever it is free at that
    # moment, so two runs started together would both take it (torchrun --standalone picks its own)
    env = train_env(VLLM_CPU_KVCACHE_SPACE="1", MASTER_PORT=str(free_port()))
    return train_in_group(args, log, timeout=timeout, grace=60, env=env)


def test_rehearse_refuses_multirun_and_creates_nothing(tmp_path):
    run = tmp_path / "run"
    rc, _ = _train(["-m", "recipe=grpo/qwen2.5-math-1.5b-gsm8k", "seed=1,2", f"run_dir={run}", "--rehearse"], tmp_path / "log", 120)
    text = (tmp_path / "log").read_text()
    assert rc == 2, text
    assert "--rehearse rehearses one new run; drop -m" in text
    assert not run.exists()


# ----------------------------------------------------------------------------- end to end


def _check_run(run: Path, log: Path, rc, seconds: float, name: str) -> None:
    text = log.read_text(errors="replace")
    tail = "\n".join(text.splitlines()[-40:])
    assert rc == 0, f"{name}: rehearsal failed ({rc}) after {seconds:.0f}s:\n{tail}"
    assert "rehearsal: what this CPU run swaps" in text
    swaps = json.loads((run / "rehearsal.json").read_text())["swaps"]
    assert {s["key"] for s in swaps} >= {"model", "data.source", "hardware"}, name
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == rehearsal.STEPS, name
    trainer_cfg = OmegaConf.load(run / "config.yaml").trainer
    if trainer_cfg.get("eval_benchmarks"):  # the papers' benchmarks during training, on their fixtures
        last = json.loads((run / "eval.jsonl").read_text().splitlines()[-1])
        assert last["step"] == rehearsal.STEPS, name
        named = {b.name for b in spec.select([f"benchmarks={trainer_cfg.eval_benchmarks}"]).benchmarks}  # math6, chord4, ...
        assert {k.split("/")[0] for k in last if k.endswith("/avg@1")} >= named, (name, last)
    else:
        assert "accuracy" in summary.get("eval_after", {}), name  # evaluated on held-out rows
    # saved: the weights, or a LoRA recipe's adapter (model.lora.enabled; alol/llama-3.1-8b-instruct-ultrafeedback)
    saved = "adapter_model.safetensors" if OmegaConf.load(run / "config.yaml").model.lora.enabled else "model.safetensors"
    assert (run / "model" / saved).is_file(), (name, saved)
    assert list((run / "trainer").glob("checkpoint-*")), name  # checkpointed


def _recipe_hardware(name: str) -> str:
    """The hardware config a recipe names (its ``override /hardware``), "" when it names none. Plain YAML,
    not OmegaConf: this runs at every collection, `make test`'s included, which deselects these tests."""
    recipe = yaml.safe_load((recipes_dir() / f"{name}.yaml").read_text()) or {}
    return next((str(v) for d in recipe.get("defaults") or [] if isinstance(d, dict)
                 for k, v in d.items() if k == "override /hardware"), "")


@functools.lru_cache(maxsize=None)
def _processes(hardware: str) -> int:
    return (yaml.safe_load((ROOT / "conf" / "hardware" / f"{hardware}.yaml").read_text()) or {}).get("num_processes", 1)


def _longest_first(names: list[str]) -> list[str]:
    """The rehearsals in an order that ends the stage early under pytest-xdist (``make rehearse``, 2
    processes): those on 2 CPU processes (several GPUs: 30-70 s each on 2 cores) first, those on one
    (one GPU: 15-20 s) last, so that no long one starts when the other process has nothing left."""
    return sorted(names, key=lambda n: (_processes(_recipe_hardware(n) or "gpu-8x80g") == 1, n))


@pytest.mark.slow
@pytest.mark.rehearse
@pytest.mark.parametrize("name", _longest_first(rehearsal.gpu_recipes()))
def test_gpu_recipe_rehearses(name, tmp_path):
    run = tmp_path / "run"
    rc, seconds = _train([f"recipe={name}", "--rehearse", "-q", "hardware.torch_threads=1", f"run_dir={run}"], tmp_path / "log")
    _check_run(run, tmp_path / "log", rc, seconds, name)
    _check_benchmarks(run, tmp_path)


def _check_benchmarks(run: Path, tmp_path: Path) -> None:
    """A recipe that names an evaluation suite (recipe_info.benchmarks): `mixrl eval RUN benchmarks=recipe`
    on the rehearsed model, each benchmark of the suite from its test fixture (one problem)."""
    from omegaconf import OmegaConf

    named = OmegaConf.load(run / "config.yaml").recipe_info.get("benchmarks")
    if not named:
        return
    from mixrl.cli import benchmarks as command

    result = command.evaluate(run / "model", [
        "benchmarks=recipe", f"benchmarks.source_dir={FIXTURES / 'benchmarks'}", f"benchmarks.cache_dir={tmp_path / 'bench'}",
        "benchmarks.limit=1", "benchmarks.all.protocol.samples=1", "benchmarks.all.protocol.max_new_tokens=8",
        "benchmarks.backend=hf", "hardware=cpu", "hardware.torch_threads=1"], quiet=True)
    assert result["suite"] == named and result["benchmarks"] and all(b["generated"] >= 1 for b in result["benchmarks"]), result


def _vllm_recipe() -> str:
    """CHORD's headline recipe when it generates with vLLM, else the first GPU recipe that does."""
    from omegaconf import OmegaConf

    names = rehearsal.gpu_recipes()
    for name in sorted(names, key=lambda n: n != "chord/qwen2.5-7b-openr1"):
        hw = _recipe_hardware(name)
        if OmegaConf.load(ROOT / "conf" / "hardware" / f"{hw}.yaml").get("use_vllm"):
            return name
    raise AssertionError("no GPU recipe uses vLLM")


@pytest.mark.vllm
@pytest.mark.rehearse
def test_vllm_recipe_rehearses_on_vllms_cpu_build(tmp_path):
    name = _vllm_recipe()
    run = tmp_path / "run"
    rc, seconds = _train([f"recipe={name}", "--rehearse", "-q", f"run_dir={run}"], tmp_path / "log")
    _check_run(run, tmp_path / "log", rc, seconds, name)
    swaps = {s["key"]: s for s in json.loads((run / "rehearsal.json").read_text())["swaps"]}
    assert swaps["hardware"]["rehearsal"].startswith("cpu-vllm"), swaps["hardware"]
    from omegaconf import OmegaConf

    assert OmegaConf.load(run / "config.yaml").hardware.use_vllm is True
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"step"' in line]
    synced = [s for s in steps if "vllm_sync/logp_diff_mean" in s]  # vLLM generated, its weights synced every step
    assert [s["step"] for s in synced] == list(range(1, rehearsal.STEPS + 1)), steps


def test_table_shows_values_verbatim():
    """Values print as they are (a list of paths is not read as rich markup)."""
    import io

    from rich.console import Console

    swaps = [rehearsal.Swap("teacher.source.models", ["Qwen/Qwen2.5-Math-7B-Instruct"], ["/c/teacher-context512", "/c/t2"], "why [b]x[/b]")]
    buf = io.StringIO()
    Console(file=buf, width=300).print(rehearsal.table(swaps))
    text = buf.getvalue()
    assert "[Qwen/Qwen2.5-Math-7B-Instruct]" in text and "[/c/teacher-context512,/c/t2]" in text and "[b]x[/b]" in text
