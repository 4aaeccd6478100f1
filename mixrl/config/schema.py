"""Typed schema of a mixrl run configuration.

The Hydra config groups under ``conf/`` are composed into one tree and merged onto
``RunConfig`` (OmegaConf structured config), so that an unknown key or a value of the
wrong type is rejected before any model is loaded. Component sections (``algo.loss``,
``algo.advantage``, ...) are free-form mappings with a ``name``: their other keys are
checked against the keyword-only parameters of the registered function (see
``mixrl.config.components``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class TrainerConfig:
    """Optimisation and batch geometry. Every derived size (gradient accumulation,
    generation batch) is computed from these values; never repeat them elsewhere."""

    max_steps: int = 60
    learning_rate: float = 5e-5
    lr_scheduler_type: str = "constant"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.99
    # rollout geometry: prompts_per_step prompts x algo.num_generations completions per optimizer step
    prompts_per_step: int = 16
    micro_batch_size: Optional[int] = None  # rows per forward/backward per process; null: the whole step at once
    num_iterations: int = 1  # optimisation passes over each generation batch (PPO epochs)
    temperature: float = 1.0
    top_p: float = 1.0
    max_completion_length: int = 32
    mask_truncated_completions: bool = False
    logging_steps: int = 1
    save_steps: int = 20  # checkpoint every N steps for resume=RUN_DIR; 0: no periodic checkpoint (Ctrl-C and a divergence stop still save one)
    save_total_limit: int = 1  # checkpoints kept (the newest); resume=RUN_DIR needs one
    eval_every: int = 0  # 0: evaluate held-out accuracy only before and after training
    eval_size: int = 256  # held-out problems used for accuracy
    eval_pass_k: int = 0  # >0: also sampled pass@k on the held-out split
    eval_samples: int = 0  # >0: samples per held-out problem; pass@k for every k of eval_pass_at up to it (unbiased estimator)
    eval_pass_at: list = field(default_factory=lambda: [1, 8, 32])  # the k values reported when eval_samples > 0
    eval_sample_every: bool = True  # false: periodic evaluations (eval_every) are greedy only; sampling before/after training only
    eval_batch_size: int = 128
    eval_before_cache: Optional[str] = None  # a folder: reuse the starting model's held-out results across runs (mixrl.trainer.eval_cache)


@dataclass
class ModelConfig:
    name: str = "tiny"
    path: str = "builtin:tiny"  # builtin:tiny, a local directory, or a Hugging Face model id
    dtype: str = "float32"  # float32 | bfloat16 | float16
    trust_remote_code: bool = False
    attn_implementation: Optional[str] = None
    lora: dict = field(default_factory=lambda: {"enabled": False, "r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear",
                                                "save_merged": False})  # save_merged: also write RUN_DIR/model-merged/ (adapter merged into the base)


@dataclass
class DataConfig:
    name: str = "arith"
    source: str = "builtin:arith"  # builtin:NAME, a local .jsonl/.json/.parquet/.csv file or folder, or a HF dataset id
    subset: Optional[str] = None
    split: str = "train"
    eval_source: Optional[str] = None  # default: same as source
    eval_split: Optional[str] = None  # default: held-out part of the built-in task, else 'test'
    prompt_column: str = "prompt"
    answer_column: str = "answer"
    expert_column: Optional[str] = None
    system_prompt: Optional[str] = None
    limit: Optional[int] = None
    # built-in task only
    train_size: int = 4000
    levels: list = field(default_factory=lambda: [1, 2, 3, 4])


@dataclass
class OffPolicyConfig:
    """Where off-policy material comes from: ``source`` is a component of the off-policy
    source registry (``mixrl.sources``), e.g. ``{name: expert, dataset: null, ...}``."""

    name: str = "none"
    source: dict = field(default_factory=lambda: {"name": "none"})


@dataclass
class TeacherConfig:
    """A teacher (``mixrl.sources.teacher``): ``source`` is a component of the source registry,
    ``{name: teacher, models: [...], privileged: ...}``, or ``{name: none}``. Apart from
    ``offpolicy`` so that a teacher composes with any off-policy source."""

    name: str = "none"
    source: dict = field(default_factory=lambda: {"name": "none"})


@dataclass
class RewardConfig:
    name: str = "exact"  # a registered reward or a dotted path 'pkg.module:fn'
    params: dict = field(default_factory=dict)
    weight: float = 1.0
    extra: list = field(default_factory=list)  # more reward functions: [{name, weight, params}]


@dataclass
class HardwareConfig:
    name: str = "cpu"
    device: str = "cpu"  # cpu | cuda
    num_processes: int = 1  # processes per machine; more than one: `mixrl train` starts them (mixrl.launch)
    bf16: bool = False
    gradient_checkpointing: bool = False
    torch_threads: Optional[int] = None
    use_vllm: bool = False
    vllm_mode: str = "colocate"
    vllm_gpu_memory_utilization: float = 0.3
    deepspeed: Optional[str] = None  # your own DeepSpeed JSON (else mixrl.launch generates one for strategy=zero2|zero3)
    # the launcher (mixrl.launch): world size = num_processes (per machine) x num_machines
    strategy: str = "ddp"  # ddp | zero2 | zero3 | fsdp
    offload: bool = False  # zero2: optimizer state in CPU memory; zero3: + parameters; fsdp: parameters
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: Optional[str] = None  # machine 0's address (num_machines > 1)
    main_process_port: int = 29500
    vllm_tensor_parallel_size: int = 1  # colocate: GPUs per vLLM engine; server: per data-parallel copy
    vllm_max_model_length: Optional[int] = None  # vLLM context (prompt + completion); null: the model's
    vllm_enable_sleep_mode: bool = False  # colocate: offload vLLM weights/KV cache during the optimizer step
    vllm_server_gpus: int = 0  # server mode: GPUs of machine 0 for `trl vllm-serve`, after the training GPUs (0: a server you start)
    vllm_server_host: str = "127.0.0.1"
    vllm_server_port: int = 8000
    vllm_server_gpu_memory_utilization: float = 0.9  # server mode: the server's GPUs hold only vLLM


@dataclass
class LoggerConfig:
    name: str = "console"
    report_to: list = field(default_factory=list)  # wandb, tensorboard
    project: str = "mixrl"
    log_completions: bool = False
    progress: bool = True


@dataclass
class AlgoConfig:
    """The objective. ``loss``, ``aggregation``, ``advantage``, ``inject``, each term and
    ``controller`` are components: a ``name`` plus that component's parameters.

    ``terms`` maps a label to a term ``{name, tokens, normalise_over, weight, aggregation,
    <term parameters>}`` (see ``mixrl.core.terms``); ``coefs`` names coefficients (numbers
    or schedules) that term weights refer to (``weight: 1-mu``). ``kl`` and ``entropy_coef``
    add the KL and entropy terms on on-policy tokens."""

    name: str = "grpo"
    num_generations: int = 8
    loss: dict = field(default_factory=lambda: {"name": "ppo_clip"})
    aggregation: dict = field(default_factory=lambda: {"name": "token-mean"})
    advantage: dict = field(default_factory=lambda: {"name": "grpo"})
    advantage_include_offpolicy: bool = True
    kl: dict = field(default_factory=lambda: {"coef": 0.0, "estimator": "k3"})
    entropy_coef: Any = 0.0  # a number or a schedule {name, ...}
    inject: dict = field(default_factory=lambda: {"name": "none"})  # where off-policy rows enter (mixrl.sources)
    coefs: dict = field(default_factory=dict)  # named coefficients: {mu: 0.1 | schedule}
    terms: dict = field(default_factory=dict)  # label -> term; every algo lists its own
    controller: Optional[dict] = None  # {name: bapo|entropic, ...}: sets clip bounds / entropy coef each step
    stages: list = field(default_factory=list)  # sequential stages (sft_then_rl)


@dataclass
class RecipeInfo:
    """Set by a recipe overlay; shown by `mixrl recipes list`."""

    name: Optional[str] = None
    paper: Optional[str] = None
    description: Optional[str] = None
    hardware: Optional[str] = None


@dataclass
class RunConfig:
    seed: int = 0
    run_dir: Optional[str] = None  # default: runs/<date>/<time>-<algo>-s<seed>
    resume: Optional[str] = None  # a run directory: continue it from its last checkpoint
    plugins: list = field(default_factory=list)  # modules imported before validation: they register components
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    data: DataConfig = field(default_factory=DataConfig)
    offpolicy: OffPolicyConfig = field(default_factory=OffPolicyConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    recipe_info: RecipeInfo = field(default_factory=RecipeInfo)


GROUPS = ("algo", "data", "offpolicy", "model", "reward", "hardware", "logger", "teacher")
