"""Held-out evaluation during training (``trainer.eval_every``) and of a saved model (``mixrl eval``).

:class:`PeriodicEvalCallback` runs greedy accuracy (and sampled pass@k when
``trainer.eval_pass_k`` > 0) on the run's fixed held-out rows every ``trainer.eval_every``
optimizer steps. Each evaluation appends one row to ``eval.jsonl`` in the run directory::

    {"step": 20, "rollouts": 1280, "accuracy": 0.41, "n": 256.0, "accuracy/level1": ...,
     "pass@4": ..., "sampled_accuracy": ..., "seconds": 3.2}

and logs the same values as ``eval/<key>`` in that step's metrics row (``metrics.jsonl``,
and any logger). Rows are written at steps N, 2N, ...; the evaluations before and after
training stay in ``summary.json`` (``eval_before`` / ``eval_after``).

The evaluation runs inside a forked RNG state seeded by (seed, step), so sampled pass@k is
reproducible and an evaluation never changes the training trajectory: a run with
``eval_every`` trains exactly as the same run without it. Its time is part of the step's
``step_time`` (see ``eval/seconds`` in the same row).

:func:`evaluate_saved_model` evaluates a saved model folder on the configured held-out split
(the logic of ``mixrl eval``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from mixrl.errors import ConfigError

EVAL_FILE = "eval.jsonl"


class PeriodicEvalCallback(TrainerCallback):
    """Every ``every`` optimizer steps: held-out accuracy -> ``eval.jsonl`` + ``eval/*`` metrics.

    Args:
        every: evaluate when ``global_step % every == 0`` (0 disables).
        run_dir: where ``eval.jsonl`` is appended.
        tokenizer, rows, reward_fn: as for :func:`mixrl.evaluation.accuracy.evaluate_accuracy`.
        trainer: the trainer, or a zero-argument callable returning it (``lambda: trainer``,
            so the callback can be built before the trainer it is passed to). Used for the
            rollout count (``mixrl_rollouts``), to log ``eval/*`` into the trainer's metrics,
            and for the model when none is given. Optional: without it the model comes from
            the callback arguments and ``eval/*`` is added to the logs of that step.
        model: the model to evaluate (default: the trainer's).
    """

    def __init__(
        self,
        *,
        every: int,
        run_dir: str | Path,
        tokenizer,
        rows: list[dict],
        reward_fn: Callable,
        max_new_tokens: int,
        batch_size: int = 128,
        pass_k: int = 0,
        samples: int = 0,
        ks: tuple = (),
        temperature: float = 1.0,
        seed: int = 0,
        trainer: Any = None,
        model: Any = None,
    ):
        self.every = int(every)
        self.path = Path(run_dir) / EVAL_FILE
        self.tokenizer = tokenizer
        self.rows_in = list(rows)
        self.reward_fn = reward_fn
        self.max_new_tokens = int(max_new_tokens)
        self.batch_size = int(batch_size)
        self.pass_k = int(pass_k)
        self.samples = int(samples)
        self.ks = tuple(int(k) for k in ks)
        self.temperature = float(temperature)
        self.seed = int(seed)
        self._trainer = trainer
        self.model = model
        self.rows: list[dict] = []  # the eval.jsonl rows written by this callback
        self._pending: dict[str, float] | None = None

    @classmethod
    def from_config(cls, cfg, run_dir, tokenizer, rows, reward_fn, *, trainer=None, model=None) -> "PeriodicEvalCallback":
        t = cfg.trainer
        return cls(
            every=int(t.eval_every), run_dir=run_dir, tokenizer=tokenizer, rows=rows, reward_fn=reward_fn,
            max_new_tokens=int(t.max_completion_length), batch_size=int(t.eval_batch_size), pass_k=int(t.eval_pass_k) if t.eval_sample_every else 0,
            samples=int(t.eval_samples) if t.eval_sample_every else 0, ks=tuple(t.eval_pass_at),
            temperature=float(t.temperature), seed=int(cfg.seed), trainer=trainer, model=model,
        )

    @property
    def trainer(self):
        t = self._trainer
        if t is not None and callable(t) and not hasattr(t, "state"):
            try:
                t = t()
            except NameError:  # `lambda: trainer` called before the trainer was assigned
                return None
        return t

    def due(self, step: int) -> bool:
        return self.every > 0 and bool(self.rows_in) and step > 0 and step % self.every == 0

    def evaluate(self, model, step: int) -> dict:
        """One evaluation (greedy accuracy, per level, pass@k) in a forked, seeded RNG state."""
        from mixrl.evaluation.accuracy import evaluate_accuracy

        devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.seed * 1_000_003 + step)
            return evaluate_accuracy(
                model, self.tokenizer, self.rows_in, self.reward_fn, max_new_tokens=self.max_new_tokens,
                batch_size=self.batch_size, pass_k=self.pass_k, samples=self.samples, ks=self.ks, temperature=self.temperature,
            )

    def on_step_end(self, args, state, control, model=None, **kwargs):
        step = int(state.global_step)
        if not self.due(step):
            return
        trainer = self.trainer
        model = self.model or model or (trainer.model if trainer is not None else None)
        if model is None:
            raise RuntimeError("PeriodicEvalCallback has no model: pass model= or trainer=")
        t0 = time.perf_counter()
        result = self.evaluate(model, step)
        seconds = time.perf_counter() - t0
        row: dict[str, Any] = {"step": step}
        rollouts = getattr(trainer, "mixrl_rollouts", None)
        if rollouts is not None:
            row["rollouts"] = int(rollouts)
            row["generated_tokens"] = int(getattr(trainer, "mixrl_generated_tokens", 0))
        row.update(result)
        row["seconds"] = round(seconds, 3)
        self.rows.append(row)
        if state.is_world_process_zero:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")
        logged = {f"eval/{k}": float(v) for k, v in result.items() if k != "n"}
        logged["eval/seconds"] = seconds
        metrics = getattr(trainer, "_metrics", None)
        if isinstance(metrics, dict) and "train" in metrics:
            for k, v in logged.items():  # averaged and logged by GRPOTrainer.log right after this step
                metrics["train"][k].append(v)
        else:
            self._pending = logged

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._pending and logs is not None and "train_runtime" not in logs:
            logs.update(self._pending)
            self._pending = None


# --------------------------------------------------------------------------- mixrl eval
def resolve_model_dir(path: str | Path) -> Path:
    """A saved model folder (a full model, or a LoRA adapter whose base model is still there);
    a run directory stands for its ``model/`` folder."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"model directory '{p}' does not exist; give a run's model/ folder or the run directory")
    if p.is_dir() and not _is_model(p) and _is_model(p / "model"):
        p = p / "model"
    if not p.is_dir() or not _is_model(p):
        raise ConfigError(
            f"'{p}' is not a saved model folder (no config.json, nor a LoRA adapter_config.json); "
            "give a run's model/ folder or the run directory"
        )
    adapter_base(p)  # a LoRA adapter's base model must still be there
    return p


def _is_model(p: Path) -> bool:
    return (p / "config.json").is_file() or (p / "adapter_config.json").is_file()


def adapter_base(path: Path) -> str | None:
    """The base model a LoRA adapter folder was trained on (``adapter_config.json``), or None
    for a full model folder; raises ConfigError when that base is a local folder that is gone."""
    if (path / "config.json").is_file() or not (path / "adapter_config.json").is_file():
        return None
    try:
        base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
    except (OSError, ValueError) as e:
        raise ConfigError(f"could not read {path / 'adapter_config.json'} ({e}); re-save the adapter") from None
    if not base:
        raise ConfigError(f"{path / 'adapter_config.json'} names no base model (base_model_name_or_path); set it to the base model")
    if Path(base).is_absolute() and not Path(base).is_dir():
        raise ConfigError(
            f"the LoRA adapter in '{path}' was trained on the base model '{base}', which is no longer there; restore "
            "that folder (mixrl model build-tiny rebuilds the built-in tiny model) or point base_model_name_or_path "
            "in adapter_config.json at the base model"
        )
    return str(base)


def load_saved_model(path: Path, cfg, dtype=None):
    """The model in ``path``: a full model folder, or a LoRA adapter merged into its base model."""
    from transformers import AutoModelForCausalLM

    trust = bool(cfg.model.trust_remote_code)
    base = adapter_base(path)
    if base is None:
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, trust_remote_code=trust)
    from peft import PeftModel

    model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype, trust_remote_code=trust)
    return PeftModel.from_pretrained(model, str(path)).merge_and_unload()


def eval_config(model_dir: str | Path, overrides: list[str], *, trust_run_code: bool = False):
    """The config ``mixrl eval`` uses: the run's own ``config.yaml`` when ``model_dir`` is a
    run directory (or its ``model/``), with the command line's overrides applied on top
    (``group=option`` replaces that whole section); otherwise the overrides alone.
    Returns ``(cfg, config_path or None)``.

    Code the run's config names (plugins, a reward file or module, remote model code) is
    refused unless ``trust_run_code`` (``--trust-run-code``) or the overrides replace it
    (:mod:`mixrl.config.trust`); with it, the run's plugins are imported before validation."""
    from omegaconf import OmegaConf

    from mixrl.config.compose import _parse, compose_config, expand_aliases, import_plugins, validate
    from mixrl.config.schema import GROUPS
    from mixrl.config.trust import require_trust

    p = Path(model_dir)
    saved_path = next((c / "config.yaml" for c in (p, p.parent) if (c / "config.yaml").is_file()), None)
    if saved_path is None or overrides:
        fresh = compose_config(list(overrides))  # a bad override fails here, before any model is loaded
    if saved_path is None:
        return fresh, None
    saved = OmegaConf.load(saved_path)
    user_keys = []
    for ov in _parse(expand_aliases(list(overrides))):
        key = ov.key_or_group
        user_keys.append(key)
        if key in GROUPS:
            saved[key] = fresh[key]
        else:
            OmegaConf.update(saved, key, OmegaConf.select(fresh, key), merge=False, force_add=True)
    require_trust(saved, saved_path.parent, trusted=trust_run_code, what=f"eval {model_dir}", user_keys=user_keys,
                  alternative=" (or override those keys, e.g. reward=exact)")
    import_plugins(list(saved.get("plugins") or []))  # the run's own components (trusted, or named by the user)
    return validate(saved), saved_path


def evaluate_saved_model(model_dir: str | Path, cfg, *, progress: Callable[[int], None] | None = None,
                         on_rows: Callable[[int], None] | None = None) -> dict:
    """Evaluate the model saved in ``model_dir`` on ``cfg``'s held-out split (``data``,
    ``trainer.eval_size``, ``trainer.eval_pass_k``, ``trainer.eval_samples``, ``reward``). Returns a JSON-ready dict
    with the metrics of :func:`~mixrl.evaluation.accuracy.evaluate_accuracy` under ``metrics``."""
    from transformers import set_seed

    from mixrl.trainer import build
    from mixrl.evaluation.accuracy import evaluate_accuracy

    path = resolve_model_dir(model_dir)
    t = cfg.trainer
    if int(t.eval_size) <= 0:
        raise ConfigError("trainer.eval_size must be > 0 to evaluate (it is the number of held-out problems)")
    device = str(cfg.hardware.device)
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("hardware.device=cuda but no CUDA device is available; use hardware=cpu")
    if cfg.hardware.torch_threads:
        torch.set_num_threads(int(cfg.hardware.torch_threads))
    from mixrl.models import tiny_bpe
    from mixrl.trainer.run import describe_heldout, heldout_rows

    if tiny_bpe.is_tiny_bpe(path) and not tiny_bpe.is_tiny_bpe(cfg.model.path):  # a BPE chat model folder without its run's config
        cfg = cfg.copy()
        cfg.model.path = str(path)  # the built-in task then gives it chat prompts (build.builtin_system_prompt)
    _, rows, heldout = heldout_rows(cfg)  # the same held-out rows as training used, never training rows
    if not rows:
        raise ConfigError(f"the held-out split of '{cfg.data.eval_source or cfg.data.source}' is empty")
    if on_rows is not None:
        on_rows(len(rows))
    reward_funcs, _ = build.build_reward_funcs(cfg)
    tokenizer = build.load_tokenizer(str(path), cfg)
    from mixrl.config.checks import check_chat_template

    check_chat_template(tokenizer, [r["prompt"] for r in rows], str(path), cfg)
    dtype = None if cfg.model.dtype == "auto" else getattr(torch, str(cfg.model.dtype))
    t0 = time.perf_counter()
    model = load_saved_model(path, cfg, dtype)
    model.to(device)
    set_seed(int(cfg.seed))
    metrics = evaluate_accuracy(
        model, tokenizer, rows, reward_funcs[0], max_new_tokens=int(t.max_completion_length),
        batch_size=int(t.eval_batch_size), pass_k=int(t.eval_pass_k),
        samples=int(t.eval_samples), ks=[int(k) for k in t.eval_pass_at], temperature=float(t.temperature), progress=progress,
    )
    return {
        "model_dir": str(path),
        "lora_base": adapter_base(path),  # None: a full model folder
        "data": str(cfg.data.eval_source or cfg.data.source),
        "split": cfg.data.eval_split or ("heldout" if str(cfg.data.source).startswith("builtin:") else "test"),
        "heldout": describe_heldout(heldout),
        "reward": str(cfg.reward.name),
        "max_new_tokens": int(t.max_completion_length),
        "seed": int(cfg.seed),
        "metrics": metrics,
        "seconds": round(time.perf_counter() - t0, 2),
    }
