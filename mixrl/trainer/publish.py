"""What a run hands to the outside: held-out results in the trackers, a model card, a merged LoRA model.

Trackers (``logger=wandb`` / ``logger=tensorboard``): TRL's step metrics already carry mixrl's
own (``mu``, ``accuracy``, ``reward_on_policy``, per-source ``<source>/rows``, each loss term)
and the periodic held-out evaluation (``eval/*`` every ``trainer.eval_every`` steps, see
:mod:`mixrl.evaluation.periodic`). :func:`log_heldout` adds the held-out evaluations before
and after training to the same ``eval/*`` series (accuracy, per level, pass@k), at the first
and the last step, through the trackers' own transformers callbacks, so one curve runs from
the starting model to the final one. :class:`HeldoutBeforeCallback` does it for the
evaluation before training, once the trackers are set up. transformers' trackers put every
key under ``train/`` except ``eval_*`` (``rewrite_logs``), so :func:`route_to_trackers` hands
them ``eval/<metric>`` as ``eval_<metric>``: the series is ``eval/accuracy`` in TensorBoard and
W&B alike, as in ``metrics.jsonl``. TensorBoard writes its events to ``RUN_DIR/tensorboard``
(:func:`tensorboard_dir`).

:func:`write_model_card` writes ``model/README.md`` (recipe, paper, base model, data, held-out
results before/after, the resolved config, how to load it with plain transformers).
:func:`save_merged` writes ``model-merged/`` (:data:`mixrl.trainer.state.rundir.MERGED_DIR`): a LoRA adapter merged into its base model
(``model.lora.save_merged=true``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from transformers import TrainerCallback
import torch
from transformers import AutoTokenizer

from mixrl.evaluation.saved import load_saved_model


def tracker_callbacks(trainer) -> list:
    """The trainer's reporting callbacks (transformers' integrations: TensorBoard, W&B, ...)."""
    return [cb for cb in trainer.callback_handler.callbacks if type(cb).__module__.startswith("transformers.integrations")]


def tracker_logs(logs: dict) -> dict:
    """``eval/<metric>`` keys as ``eval_<metric>``, which transformers' trackers file under
    ``eval/<metric>`` (any other key goes under ``train/``)."""
    return {("eval_" + k[len("eval/"):] if k.startswith("eval/") else k): v for k, v in logs.items()}


def route_to_trackers(trainer) -> None:
    """Every tracker callback of ``trainer`` sees its logs through :func:`tracker_logs` (once)."""
    for cb in tracker_callbacks(trainer):
        if getattr(cb, "_mixrl_routed", False):
            continue
        def on_log(args, state, control, logs=None, _on_log=cb.on_log, **kwargs):
            return _on_log(args, state, control, logs=tracker_logs(logs or {}), **kwargs)
        cb.on_log = on_log
        cb._mixrl_routed = True


def tensorboard_dir(trainer, run_dir: Path) -> Path | None:
    """Point the TensorBoard callback (if any) at ``run_dir/tensorboard`` and return that folder."""
    for cb in tracker_callbacks(trainer):
        if type(cb).__name__ == "TensorBoardCallback":
            cb.logging_dir = str(Path(run_dir) / "tensorboard")
            return Path(cb.logging_dir)
    return None


def heldout_logs(results: dict) -> dict[str, float]:
    """``eval/<metric>`` for every number of a held-out result (``n`` and ``samples`` left out)."""
    return {f"eval/{k}": float(v) for k, v in results.items()
            if k not in ("n", "samples") and isinstance(v, (int, float)) and not isinstance(v, bool)}


def log_heldout(trainer, results: dict) -> dict[str, float]:
    """Send held-out ``results`` to the trackers at the trainer's current step; returns what was logged."""
    logs = heldout_logs(results or {})
    if not logs or not trainer.state.is_world_process_zero:
        return logs
    for cb in tracker_callbacks(trainer):
        cb.on_log(trainer.args, trainer.state, trainer.control, logs=dict(logs))
    return logs


class HeldoutBeforeCallback(TrainerCallback):
    """At the start of training, the held-out results of the starting model go to the trackers
    (after the trackers' own ``on_train_begin``: they are listed before user callbacks).

    ``results``: a zero-argument callable returning them (they are measured after the trainer is built);
    ``trainer``: the trainer whose trackers receive them."""

    def __init__(self, results: Callable[[], dict | None], trainer):
        self.results = results
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        results = self.results()
        if results:
            log_heldout(self.trainer, results)


# --------------------------------------------------------------------------- model card
def _table(before: dict, after: dict) -> list[str]:
    keys = [k for k in (after or before or {}) if k not in ("n", "samples")]
    if not keys:
        return ["(no held-out evaluation: trainer.eval_size=0)"]
    rows = ["| held-out metric | before | after |", "|---|---|---|"]
    for k in keys:
        b, a = (before or {}).get(k), (after or {}).get(k)
        rows.append(f"| {k} | {'-' if b is None else f'{b:.4f}'} | {'-' if a is None else f'{a:.4f}'} |")
    return rows


def model_card(cfg: DictConfig, summary: dict, *, base_model: str, lora: bool = False) -> str:
    """The text of ``model/README.md`` (Hugging Face model card with YAML metadata)."""
    info = cfg.recipe_info
    before, after = summary.get("eval_before") or {}, summary.get("eval_after") or {}
    hub_base = base_model if not str(base_model).startswith(("/", ".", "builtin:")) else None
    meta = ["---", "library_name: " + ("peft" if lora else "transformers"), "tags:", "- mixrl", "- trl", f"- {cfg.algo.name}"]
    if hub_base:
        meta.append(f"base_model: {hub_base}")
    meta.append("---")
    n = int(after.get("n") or before.get("n") or 0)
    data = cfg.data.source + (f" ({cfg.data.subset})" if cfg.data.subset else "")
    load = (
        ["```python", "from peft import AutoPeftModelForCausalLM", "from transformers import AutoTokenizer", "",
         'model = AutoPeftModelForCausalLM.from_pretrained("PATH/TO/model").merge_and_unload()',
         'tokenizer = AutoTokenizer.from_pretrained("PATH/TO/model")', "```"]
        if lora else
        ["```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
         'model = AutoModelForCausalLM.from_pretrained("PATH/TO/model")',
         'tokenizer = AutoTokenizer.from_pretrained("PATH/TO/model")', "```"]
    )
    lines = [
        *meta, "",
        f"# {cfg.algo.name} on {cfg.data.name}" + (f" ({info.name})" if info.name else ""), "",
        "Trained with mixrl (a TRL `GRPOTrainer` mixing on-policy RL with off-policy data).", "",
        f"- recipe: {info.name or '(command-line overrides)'}" + (f" — {info.paper}" if info.paper else ""),
        f"- description: {info.description}" if info.description else None,
        f"- base model: {base_model}" + (" (LoRA adapter; `model-merged/` holds the merged model when saved)" if lora else ""),
        f"- data: {data}, reward: {cfg.reward.name}",
        f"- steps: {summary.get('steps')}, rollouts: {summary.get('rollouts')}, seed: {summary.get('seed')}",
        f"- batch: {summary.get('geometry')}",
        f"- hardware: {cfg.hardware.name}, wall-clock {summary.get('wall_seconds')} s", "",
        f"## Held-out results ({n} problems; {summary.get('heldout', {}).get('source', cfg.data.eval_source or cfg.data.source)})", "",
        *_table(before, after), "",
        "## Load", "", *load, "",
        "## Config", "", "The resolved mixrl config of the run (`mixrl train` with it reproduces the run):", "",
        "```yaml", OmegaConf.to_yaml(cfg, resolve=True).rstrip(), "```", "",
    ]
    return "\n".join(x for x in lines if x is not None)


def write_model_card(model_dir: Path, cfg: DictConfig, summary: dict, *, base_model: str) -> Path:
    lora = (Path(model_dir) / "adapter_config.json").is_file()
    path = Path(model_dir) / "README.md"
    path.write_text(model_card(cfg, summary, base_model=base_model, lora=lora))
    return path


def save_merged(model_dir: Path, cfg: DictConfig, out_dir: Path) -> Path:
    """Merge the LoRA adapter in ``model_dir`` into its base model (loaded from disk, so it works
    whatever the training strategy sharded) and save a plain transformers folder in ``out_dir``."""
    dtype = None if cfg.model.dtype == "auto" else getattr(torch, str(cfg.model.dtype))
    merged = load_saved_model(Path(model_dir), cfg, dtype)
    out_dir = Path(out_dir)
    merged.save_pretrained(str(out_dir))
    AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=bool(cfg.model.trust_remote_code)).save_pretrained(str(out_dir))
    return out_dir
