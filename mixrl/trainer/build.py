"""Turn a validated config into the pieces of a run and the trainer: model path, tokenizer, data,
reward functions (:func:`prepare_inputs`, checked together), objective, sources; TRL's arguments
come from :mod:`mixrl.trainer.trl_args`.

:func:`trainer_from_config` is the one assembly: ``mixrl train`` (:mod:`mixrl.trainer.run`), the
benchmark (``bench/throughput.py``), the DDP/FSDP test workers and the tests all build their
trainer with it, so what they measure is what a run trains. What it reads comes from
:mod:`mixrl.trainer.policy_model` (model folder, tokenizer), :mod:`mixrl.trainer.rows` (training
and held-out rows) and :mod:`mixrl.trainer.reward_funcs` (the reward functions)."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
import torch

from mixrl.config.builders import component as _component
from mixrl.config.generation import resolve_generation
from mixrl.config.geometry import Geometry, geometry
from mixrl.config.sampler import build_sampler
from mixrl.errors import ConfigError
from mixrl.trainer.env_rollout import env_episodes, env_rewards
from mixrl.config.checks import check_train_size, check_training_data, row_texts
from mixrl.config.builders import build_controller, build_injection, build_objective, build_source, build_teacher
from mixrl.config.shaping import shaping_spec
from mixrl.rewards.components import heldout_reward
from mixrl.trainer.generation.engine_sync import default_tolerance
from mixrl.trainer.magnitude import MagnitudeBounds
from mixrl.trainer.parts_spec import PartsSpec
from mixrl.trainer.policy_model import extend_tiny, load_tokenizer, resolve_model_path, tiny_missing_characters
from mixrl.trainer.reward_funcs import build_reward_funcs
from mixrl.trainer.sample_log import SampleTap
from mixrl.trainer.trl_args import grpo_args, peft_config  # noqa: F401  (build.grpo_args: the bench and the tests read it through build)
from mixrl.trainer.rows import describe_heldout, heldout_rows, load_eval_rows
from mixrl.trainer.rows import load_train_rows  # noqa: F401  (build.load_train_rows: the tests read the rows through build)
from mixrl.trainer.trl_vllm import colocated_engine_dtype, install_client
from mixrl.vllm_cpu import engine_dtype


# --------------------------------------------------------------------------- objective
def advantage_spec(cfg: DictConfig) -> tuple[str, dict, bool]:
    name, params = _component(cfg.algo.advantage)
    return name, params, bool(cfg.algo.advantage_include_offpolicy)


# --------------------------------------------------------------------------- inputs
def _set_threads(cfg: DictConfig) -> None:
    """``hardware.torch_threads``: torch's CPU threads (0 leaves torch's default)."""
    if cfg.hardware.torch_threads:
        torch.set_num_threads(int(cfg.hardware.torch_threads))


@dataclass
class RunInputs:
    """What a run reads, loaded and checked before its run directory is created."""

    model_path: str
    tokenizer: object
    train_ds: object
    eval_rows: list
    heldout: dict
    reward_funcs: list
    reward_weights: list | None
    seconds: float = 0.0  # wall-clock and CPU time of the preparation (part of the run's setup time)
    cpu_seconds: float = 0.0
    source: object = None  # the off-policy source, prepared on train_ds (see prepare_sources)
    source_rows: object = None  # the training rows after the source's prepare: what the run trains on
    benchmarks: list = field(default_factory=list)  # trainer.eval_benchmarks, loaded (mixrl.benchmarks.live.LiveBenchmark)
    teacher: object = None  # the teacher node's teacher, built, resolved and checked against the tokenizer (or None)
    injection: object = None  # the algo's injection, built with the source (see prepare_sources)
    sampler: tuple = (None, None)  # (sampler, its max-completion-length schedule), built on source_rows


def prepare_sources(cfg: DictConfig, train_ds, *, teacher=None):
    """``(source, rows, injection, sampler)``: the off-policy source built and prepared on the
    training rows (its file read, its pairs or pool built), with the rows it leaves to train on;
    the injection, built with it (its constructor tells the source what it reads); the sampler
    ``(sampler, max-completion-length schedule)`` built on those rows, after the teacher's data
    check (``sampler.arms_column``, ``teacher.source.privileged``). :func:`prepare_inputs` calls
    it, so everything the data can refuse is refused before the run directory exists; the trainer
    is built with these objects (:func:`trainer_from_config`): each is built once."""
    source = build_source(cfg)
    injection = build_injection(cfg, source=source, geometry=geometry(cfg))  # sets what the source must read (e.g. expert rows per prompt)
    rows = source.prepare(train_ds, cfg.data)
    if teacher is not None:
        rows = teacher.prepare(rows, cfg.data)
    return source, rows, injection, build_sampler(cfg, rows)


def source_texts(cfg: DictConfig, source, injection, *, teacher=None) -> dict[str, list[str]]:
    """The text the run tokenizes beyond the training rows, by where it comes from (the source's
    file, the injection's and the teacher's templates): checked for characters like the rows,
    and learned by the tiny model (:func:`prepare_inputs`)."""
    name = str(cfg.offpolicy.source.name)
    dataset = cfg.offpolicy.source.get("dataset")
    out = {f"offpolicy.source.dataset={dataset}" if dataset else f"the {name} source's text": list(source.texts()),
           "algo.inject.template": list(injection.texts())}
    if teacher is not None:
        out["teacher.source.template"] = list(teacher.texts())
    return {k: v for k, v in out.items() if v}


def prepare_inputs(cfg: DictConfig, console: Console, *, check: bool = True) -> RunInputs:
    """Resolve the model, load the tokenizer, the training and held-out rows and the reward
    functions, and check them together (:func:`mixrl.config.checks.check_training_data`,
    :func:`mixrl.config.checks.check_train_size`) before anything of the run is created: a
    bad data file, reward or model path fails here, with one line, and leaves no run
    directory behind. The tiny model's extended vocabulary (a cache, not the run) is built here too.
    ``check=False`` loads the same inputs without those checks (they only refuse, never change
    what is loaded): :func:`trainer_from_config` for tests and tools."""
    from transformers import set_seed  # deferred: transformers is heavy; the light commands (--help, config show, plan) never load it

    from mixrl.benchmarks.live import selection  # deferred: reads conf/benchmarks only here

    selection(cfg)  # trainer.eval_benchmarks: a bad name or setting is one line, before anything loads
    t0, cpu0 = time.perf_counter(), time.process_time()
    _set_threads(cfg)
    set_seed(int(cfg.seed))
    model_path = resolve_model_path(cfg, progress=cfg.logger.progress)
    tokenizer = load_tokenizer(model_path, cfg)
    check_env_tokenizer(cfg, tokenizer, model_path)
    train_ds, eval_rows, heldout = heldout_rows(cfg)
    reward_funcs, reward_weights = build_reward_funcs(cfg, model_path=model_path, tokenizer=tokenizer)  # a judge on the policy's model is asked during the data check below
    teacher = build_teacher(cfg)
    source, source_rows, injection, sampler = prepare_sources(cfg, train_ds, teacher=teacher)  # its file, pairs, sampler columns: refused here
    extra = {"the held-out rows": row_texts(eval_rows), **source_texts(cfg, source, injection, teacher=teacher)}
    new_chars = tiny_missing_characters(cfg, model_path, tokenizer, row_texts(train_ds) + [t for v in extra.values() for t in v])
    if new_chars:  # the tiny model learns the data's characters: check with its extended tokenizer
        from mixrl.models.tiny_vocab import extend_tokenizer  # deferred: tiny_vocab imports transformers; `mixrl plan` imports this module and must not load it

        tokenizer = extend_tokenizer(tokenizer, new_chars)
    if check:
        check_training_data(cfg, tokenizer, train_ds, reward_funcs, model_path, extra_texts=extra)  # before the model loads
        check_train_size(cfg, train_ds, heldout)
        for fn in reward_funcs:  # a reward model that is no sequence classifier, or with another tokenizer: refused (or re-tokenised, said once)
            fn.check_at_start(tokenizer)
    if check:
        check_padding_free(cfg, model_path)  # trainer.padding_free=true with a model that cannot take packed rows
    if teacher is not None:  # a missing teacher folder or another vocabulary fails here, not after the run directory exists
        teacher.check_builtin_teacher(tokenizer)  # before building it
        teacher.resolve(progress=bool(cfg.logger.progress), why=f"the teacher of algo={cfg.algo.name}")
        teacher.check_tokenizer(tokenizer)  # built once: trainer_from_config takes this teacher from the inputs
    if int(os.environ.get("RANK", "0")) == 0:
        console.print(describe_heldout(heldout), soft_wrap=True, highlight=False)
        for note in source.notes:
            console.print(note, soft_wrap=True, highlight=False)
    if new_chars:
        model_path, tokenizer = extend_tiny(
            cfg, model_path, new_chars, say=lambda text: console.print(text, soft_wrap=True, highlight=False)
        )
        reward_funcs, reward_weights = build_reward_funcs(cfg, model_path=model_path, tokenizer=tokenizer)  # the grown model's path and tokenizer
    benchmarks = []
    if cfg.trainer.get("eval_benchmarks") and int(cfg.trainer.eval_every) > 0:  # the papers' benchmarks, read before the run starts
        from mixrl.benchmarks.live import prepare  # deferred: benchmarks load only for runs that score them

        benchmarks = prepare(cfg, tokenizer, heldout_reward(reward_funcs[0]), eval_rows=load_eval_rows)
    return RunInputs(model_path, tokenizer, train_ds, eval_rows, heldout, reward_funcs, reward_weights,
                     time.perf_counter() - t0, time.process_time() - cpu0, source=source, source_rows=source_rows,
                     benchmarks=benchmarks, teacher=teacher, injection=injection, sampler=sampler)


def packing_mode(cfg: DictConfig) -> str:
    """``trainer.padding_free`` (``auto`` | ``true`` | ``false``): the one place the trainer reads it."""
    from mixrl.trainer.parts.packing import resolve_mode  # deferred: as the trainer's modules below

    return resolve_mode(cfg.trainer.get("padding_free", "auto"))


def check_padding_free(cfg: DictConfig, model_path: str) -> None:
    """``trainer.padding_free=true`` refused, before the model loads, for a model whose class and
    config cannot take packed rows (:func:`mixrl.trainer.parts.packing.unsupported_class`); a
    model of custom code (no class in transformers' mapping) is checked when it loads."""
    from mixrl.trainer.parts.packing import refusal, unsupported_class  # deferred: as the trainer's modules below

    if packing_mode(cfg) != "true":
        return
    from transformers import AutoConfig, AutoModelForCausalLM  # deferred: transformers is heavy; `mixrl plan` imports this module and must not load it

    try:
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=bool(cfg.model.trust_remote_code))
        model_class = AutoModelForCausalLM._model_mapping[type(config)]
    except Exception:  # noqa: BLE001 - unknown here: the loaded model is checked (mixrl.trainer.grpo)
        return
    if cfg.model.attn_implementation:
        config._attn_implementation = cfg.model.attn_implementation
    why = unsupported_class(model_class, config)
    if why is not None:
        raise ConfigError(refusal(why))


# --------------------------------------------------------------------------- the trainer
def trainer_from_config(cfg: DictConfig, *, inputs: RunInputs | None = None, callbacks: list | None = None,
                        run_dir: str | Path | None = None, console: Console | None = None, for_run: bool = False,
                        **arg_overrides):
    """The ``MixrlGRPOTrainer`` of a config, as ``mixrl train`` builds it: TRL arguments
    (:func:`grpo_args`), source and injection, teacher, objective, advantage and controller all
    come from ``cfg``. ``inputs``: what :func:`prepare_inputs` loaded (``mixrl train`` prepares
    them before its run directory exists); left out, they are prepared here (the same seed,
    threads, model, rows and rewards, without the data checks that only refuse: a unit test may
    build a trainer for a config ``mixrl train`` would refuse; ``console`` shows the notes,
    silent by default). ``run_dir``: where TRL
    writes checkpoints (default ``cfg.run_dir``); ``for_run`` (``mixrl train``): each checkpoint records
    the config (a resume of an edited config.yaml is refused) and the trainer keeps
    ``logger.samples_per_step`` rows of each batch for ``samples.jsonl``; ``arg_overrides`` set extra
    ``GRPOConfig`` fields (the benchmark's ``generation_kwargs``)."""
    from transformers import PrinterCallback  # deferred: transformers is heavy; the light commands (--help, config show, plan) never load it

    from mixrl.trainer.update_hooks import add_update_hooks  # deferred: loaded with the trainer (SFPO's callback imports transformers)
    from mixrl.trainer.grpo import MixrlGRPOTrainer  # deferred: trainer.grpo imports trl and transformers; `mixrl plan` imports this module and must not load them

    if inputs is None:
        inputs = prepare_inputs(cfg, console or Console(quiet=True), check=False)
    model_path, tokenizer = inputs.model_path, inputs.tokenizer
    geom = geometry(cfg)
    tools = env_tools(cfg)
    reward_funcs, reward_weights = env_rewards(cfg, inputs.reward_funcs, inputs.reward_weights)  # the task's, or an environment's return
    args = grpo_args(cfg, Path(run_dir or cfg.run_dir), geom, reward_weights=reward_weights,
                     # TRL's tool loop: rounds per rollout (None: no limit)
                     **({"max_tool_calling_iterations": cfg.env.max_tool_calls} if tools else {}), **arg_overrides)
    # built once, by prepare_inputs: the source and its rows, the injection, the teacher (resolved and
    # checked before the policy loads), the sampler
    train_ds, injection, teacher = inputs.source_rows, inputs.injection, inputs.teacher
    sampler, sampler_length = inputs.sampler
    spec = parts_spec(cfg, geom, injection=injection, teacher=teacher, sampler=sampler, sampler_length=sampler_length,
                      model_path=model_path, for_run=for_run)
    with _colocated_engine(cfg, model_path):
        trainer = MixrlGRPOTrainer(
            model=model_path,
            reward_funcs=reward_funcs,
            **({"tools": tools} if tools else {}),
            args=args,
            train_dataset=train_ds,
            processing_class=tokenizer,
            peft_config=peft_config(cfg),
            callbacks=list(callbacks or []),
            spec=spec,
        )
    trainer.remove_callback(PrinterCallback)  # mixrl prints its own progress and summary
    add_update_hooks(trainer, cfg)  # SFPO's reposition (algo.reposition), ALP's layer noise (algo.perturbation)
    return trainer


def parts_spec(cfg: DictConfig, geom: Geometry, *, injection, teacher, sampler, sampler_length, model_path: str,
               for_run: bool = False) -> PartsSpec:
    """What the trainer is built with (:class:`~mixrl.trainer.parts_spec.PartsSpec`), from ``cfg`` and
    the objects :func:`trainer_from_config` built (the injection, the teacher, the sampler); ``for_run``:
    :func:`trainer_from_config`'s."""
    samples = int(cfg.logger.samples_per_step) if for_run else 0
    return PartsSpec(
        objective=build_objective(cfg),
        advantage=advantage_spec(cfg),
        shaping=shaping_spec(cfg),
        injections=(injection,),
        controller=build_controller(cfg),
        teacher=teacher,
        staleness=int(cfg.trainer.get("staleness", 0) or 0),
        async_generation=int(cfg.hardware.get("vllm_async_max_staleness", 1)) if cfg.hardware.get("vllm_async", False) else 0,
        sampler=sampler,
        sampler_length=sampler_length,
        critic=OmegaConf.to_container(cfg.algo.critic, resolve=True) if cfg.algo.get("critic") is not None else None,
        padding_free=packing_mode(cfg),
        token_budget=token_budget_spec(cfg, geom),
        sync_tolerance=_sync_tolerance(cfg, model_path),  # checked after every weight sync (engine_sync)
        magnitude=MagnitudeBounds.from_config(cfg.trainer),  # checked every micro-batch (mixrl.trainer.magnitude)
        generation=resolve_generation(cfg),  # shared-prefill; continuous: per-call cache size (assembly.wrap_generation)
        config=OmegaConf.to_container(cfg, resolve=True) if for_run else None,
        samples=SampleTap(samples, int(cfg.logger.samples_max_chars)) if samples > 0 else None,  # for samples.jsonl
        episodes=env_episodes(cfg),  # an environment's episodes (mixrl.trainer.env_rollout), or None
    )


def env_tools(cfg: DictConfig) -> list:
    """The tool functions of ``env`` (``env=tools``: ``mixrl.tools.builtin`` by name), else []."""
    if cfg.get("env") is None or cfg.env.name != "tools":
        return []
    from mixrl.tools.builtin import resolve_tools  # deferred: only env=tools runs need the tools (and their sandbox)

    return resolve_tools(list(cfg.env.tools))


def check_env_tokenizer(cfg: DictConfig, tokenizer, model_path: str) -> None:
    """``env=tools`` needs a chat template that renders a tool call and its result (TRL's check)."""
    if cfg.get("env") is None or cfg.env.name != "tools":
        return
    from trl.chat_template_utils import supports_tool_calling  # deferred: trl is heavy; only env=tools runs check it

    if not supports_tool_calling(tokenizer):
        raise ConfigError(f"env=tools: the chat template of '{model_path}' does not render tool calls; "
                          "use model=tiny-bpe-tools (the built-in tool model) or a chat model whose template supports tools")


def token_budget_spec(cfg: DictConfig, geom: Geometry) -> dict | None:
    """``trainer.max_tokens_per_micro_batch`` for the trainer's budget part (None: rows per micro-batch):
    the budget, whether rows are packed (``trainer.padding_free``), and the rows of a no-grad scoring
    forward (``trainer.micro_batch_size``, when set)."""
    budget = cfg.trainer.get("max_tokens_per_micro_batch")
    if budget is None:
        return None
    packed = packing_mode(cfg) != "false"  # auto: packed where the model takes it
    return {"budget": int(budget), "packed": packed,
            "scoring_batch_size": geom.micro_batch_size if cfg.trainer.micro_batch_size is not None else None}


def _cpu_colocated(cfg: DictConfig) -> bool:
    hw = cfg.hardware
    return bool(hw.use_vllm) and hw.device == "cpu" and hw.vllm_mode == "colocate"


def _colocated_engine(cfg: DictConfig, model_path: str):
    """On CPU, TRL's colocated vLLM engine in the trainer's dtype, and TRL's server client syncing
    weights through files (mixrl.trainer.trl_vllm); else nothing."""
    hw = cfg.hardware
    if hw.use_vllm and hw.device == "cpu" and hw.vllm_mode == "server":
        install_client()
    if not _cpu_colocated(cfg):
        return contextlib.nullcontext()
    return colocated_engine_dtype(engine_dtype(str(cfg.model.dtype), model_path))


def _sync_tolerance(cfg: DictConfig, model_path: str) -> float:
    """``hardware.vllm_sync_tolerance``, or its default for this device and engine dtype."""
    tol = cfg.hardware.get("vllm_sync_tolerance", None)
    if tol is not None:
        return float(tol)
    dtype = None
    if _cpu_colocated(cfg):
        dtype = engine_dtype(str(cfg.model.dtype), model_path)
    return default_tolerance(str(cfg.hardware.device), dtype)
