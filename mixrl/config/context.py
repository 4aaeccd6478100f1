"""The context check: every model a run feeds ``prompt + completion`` to holds that many positions.

A completion is generated after its prompt, in the same sequence, so the policy (and each teacher
and reward model, which score the same sequence) needs ``prompt tokens + trainer.max_completion_length``
positions. A model's positions are its ``max_position_embeddings`` (:func:`model_positions`), read
without downloading anything:

1. a local folder: its ``config.json``;
2. a hub id mixrl ships a recipe for: :data:`mixrl.models.known.KNOWN_MODELS` (copied from the
   published ``config.json``);
3. any other hub id: its ``config.json`` when it is in the local Hugging Face cache;
4. otherwise unknown: no check here (the data-load check, :func:`mixrl.config.checks.check_training_data`,
   still measures every prompt once the tokenizer is loaded).

Built-in models (``builtin:...`` and their cached folders, which carry a ``mixrl_tiny*.json``) are not
checked here: their context is fitted to the built-in task, and the data-load check measures their
prompts.

The prompt side is the **prompt budget** (:func:`prompt_budget`). The data's prompts are only
tokenized at load, so the config-time check uses ``data.max_prompt_tokens`` when the config states it
(the data-load check then refuses any longer prompt, so the check is exact); else the number ``mixrl
plan`` assumes for its memory estimate, 512 tokens for real data (at most half the model's context,
so a small local model is not refused for prompts it has not seen; ``--prompt-tokens`` in ``mixrl
plan``), and the built-in task's longest prompt for ``builtin:`` data. The authors' verl scripts mostly
cap prompts at 1024 (``data.max_prompt_length``); 512 is the plan's default, not theirs, and the
data-load check still refuses any prompt that does not fit ``context - max_completion_length``.

Only the policy's context is refused; a teacher or reward model whose context is too short is shown
(``mixrl plan``'s context section, ``mixrl train``'s warning line) but not refused, because which
teacher a recipe uses is a method choice (``ampo/qwen2.5-7b-instruct-openr1``'s Qwen2.5-Math-7B-Instruct
teacher, 4096 positions, writes up to 8192 tokens; its recipe is left to the AMPO ledger).

Called by ``mixrl plan``, ``mixrl explain``, ``mixrl train`` (before any model or data loads and
before a run directory is made) and the rehearsal (against the real model, before it is swapped for
the tiny one). Layer 2 (config): imports only the known-model table; the tiny models' modules
(torch) are imported only for ``builtin:`` data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from mixrl.errors import ConfigError
from mixrl.models.known import KNOWN_MODELS, LONGER_CONTEXT

#: the prompt budget of real (non built-in) data, in tokens: ``mixrl plan``'s default ``--prompt-tokens``
PROMPT_TOKENS = 512

#: files that mark a folder as one of mixrl's built-in models (mixrl.models.tiny_spec, tiny_bpe, tiny_bpe_tools)
BUILTIN_MARKERS = ("mixrl_tiny.json", "mixrl_tiny_bpe.json", "mixrl_tiny_bpe_tools.json")


@dataclass(frozen=True)
class Positions:
    """A model's context: ``n`` positions (None: unknown or not checked) and where that was read."""

    path: str
    n: int | None
    source: str


def _positions_of(conf: dict) -> int | None:
    n = conf.get("max_position_embeddings")
    if n is None and isinstance(conf.get("text_config"), dict):  # multimodal configs nest the language model's
        n = conf["text_config"].get("max_position_embeddings")
    return int(n) if n else None


def _cached_config(repo_id: str) -> Path | None:
    """``config.json`` of hub model ``repo_id`` when the local Hugging Face cache has it (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache  # deferred: only for hub ids mixrl does not know
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - not a valid repo id, unreadable cache: unknown
        return None
    return Path(found) if isinstance(found, str) and Path(found).is_file() else None


def model_positions(path: str) -> Positions:
    """The context of the model at ``path`` (see the module docstring for the order of the sources)."""
    path = str(path)
    if path.startswith("builtin:"):
        return Positions(path, None, "a built-in model (its context fits the built-in task; prompts are measured at data load)")
    folder = Path(path).expanduser()
    if folder.is_dir():
        if any((folder / m).is_file() for m in BUILTIN_MARKERS):
            return Positions(path, None, "a built-in model's folder (prompts are measured at data load)")
        conf = folder / "config.json"
        if conf.is_file():
            try:
                n = _positions_of(json.loads(conf.read_text()))
            except (OSError, ValueError):
                n = None
            return Positions(path, n, str(conf) if n else f"{conf} (no max_position_embeddings)")
        return Positions(path, None, f"{folder} has no config.json")
    if path in KNOWN_MODELS and KNOWN_MODELS[path].get("max_position_embeddings"):
        return Positions(path, int(KNOWN_MODELS[path]["max_position_embeddings"]),
                         "mixrl.models.known, copied from its published config.json")
    cached = _cached_config(path)
    if cached is not None:
        try:
            n = _positions_of(json.loads(cached.read_text()))
        except (OSError, ValueError):
            n = None
        if n:
            return Positions(path, n, f"its config.json in the Hugging Face cache ({cached})")
    return Positions(path, None, "unknown: not a local folder, not in mixrl.models.known, not in the Hugging Face cache")


def prompt_budget(cfg: DictConfig, positions: int | None = None) -> int:
    """Prompt tokens assumed before the data is read: ``data.max_prompt_tokens`` when set (the data-load
    check then refuses a longer prompt); for ``builtin:`` data the built-in task's longest prompt (in the
    tiny BPE model's tokens for it); else :data:`PROMPT_TOKENS`, at most half of ``positions`` (a
    model's context) so that a small local model is not refused for prompts it has not seen."""
    stated = cfg.data.get("max_prompt_tokens")
    if stated:
        return int(stated)
    if str(cfg.data.source).startswith("builtin:"):
        from mixrl.models import tiny_bpe, tiny_spec  # deferred: these modules import torch

        return int(tiny_bpe.MAX_PROMPT_TOKENS if tiny_bpe.is_tiny_bpe(cfg.model.path) else tiny_spec.MAX_PROMPT_TOKENS)
    return min(PROMPT_TOKENS, positions // 2) if positions else PROMPT_TOKENS


def sequence_models(cfg: DictConfig) -> list[tuple[str, str]]:
    """``(role, path)`` of every model that reads the whole prompt + completion: the policy, each
    teacher (``self`` is the policy) and each reward model (``reward=model``)."""
    out = [("model.path", str(cfg.model.path))]
    source = (cfg.get("teacher") or {}).get("source") or {}
    if source.get("name") == "teacher":
        out += [(f"teacher.source.models[{i}]", str(m)) for i, m in enumerate(source.get("models") or []) if str(m) != "self"]
    reward = cfg.get("reward")
    if reward is not None:
        specs = [("reward", reward)] + [(f"reward.extra[{i}]", s) for i, s in enumerate(reward.get("extra") or [])]
        out += [(f"{where}.params.path", str((s.get("params") or {}).get("path", "builtin:tiny-rm")))
                for where, s in specs if s.get("name") == "model"]
    return out


@dataclass(frozen=True)
class ContextCheck:
    """The result of :func:`check_context`: the prompt budget, the completion length, their sum,
    and the context of each model (role, :class:`Positions`)."""

    prompt: int
    completion: int
    models: list[tuple[str, Positions]]
    vllm_max_model_length: int | None = None

    @property
    def need(self) -> int:
        return self.prompt + self.completion

    def too_short(self) -> list[tuple[str, Positions]]:
        """The teachers and reward models whose context is below :attr:`need` (the policy's is refused)."""
        return [(role, pos) for role, pos in self.models if pos.n is not None and pos.n < self.need]

    def lines(self) -> list[str]:
        """One line per model (``mixrl plan``'s context section)."""
        out = []
        for role, pos in self.models:
            if pos.n is None:
                out.append(f"  {role:<27} {pos.path}: not checked ({pos.source})")
            elif pos.n < self.need:
                out.append(f"  {role:<27} {pos.path}: {pos.n:,} positions < {self.need:,}: it reads the whole sequence "
                           f"and does NOT hold it (from {pos.source}); lower trainer.max_completion_length to "
                           f"{pos.n - self.prompt} or use a model with a longer context")
            else:
                out.append(f"  {role:<27} {pos.path}: {pos.n:,} positions >= {self.need:,} "
                           f"(from {pos.source})")
        if self.vllm_max_model_length:
            out.append(f"  {'hardware.vllm_max_model_length':<27} {self.vllm_max_model_length:,} >= {self.need:,}")
        return out


def check_context(cfg: DictConfig, *, prompt_tokens: int | None = None) -> ContextCheck:
    """Refuse (ConfigError, one line naming the fix) a config whose prompt budget plus
    ``trainer.max_completion_length`` exceeds the context of a model that reads the whole
    sequence, or ``hardware.vllm_max_model_length`` when vLLM generates. ``prompt_tokens``
    overrides :func:`prompt_budget` (``mixrl plan --prompt-tokens``)."""
    models = [(role, model_positions(path)) for role, path in sequence_models(cfg)]
    policy = models[0][1].n
    prompt = int(prompt_tokens) if prompt_tokens else prompt_budget(cfg, policy)
    completion = int(cfg.trainer.max_completion_length)
    need = prompt + completion
    why = f"{need} positions (a {prompt}-token prompt budget + trainer.max_completion_length={completion})"
    for role, pos in models:
        if pos.n is None or need <= pos.n or role != "model.path":
            continue  # teachers and reward models: reported (ContextCheck.lines, ContextCheck.too_short), not refused
        room = pos.n - prompt
        fix = (f"set trainer.max_completion_length<={room} (its context minus the prompt budget)" if room > 0
               else "use a model with a longer context")
        if not prompt_tokens:
            fix += ", or data.max_prompt_tokens=N if no prompt is longer than N tokens"
        longer = LONGER_CONTEXT.get(pos.path)
        if longer and role == "model.path":
            option, hub_id = longer
            fix += f", or model={option} ({hub_id}, {int(KNOWN_MODELS[hub_id]['max_position_embeddings'])} positions)"
        elif room > 0:
            fix += ", or a model with a longer context"
        raise ConfigError(f"{why} exceed the context of {role}={pos.path}: {pos.n} positions "
                          f"(max_position_embeddings, from {pos.source}); {fix}")
    vllm_len = None
    hw = cfg.get("hardware") or {}
    if hw.get("use_vllm") and hw.get("vllm_max_model_length"):
        vllm_len = int(hw.vllm_max_model_length)
        if need > vllm_len:
            raise ConfigError(f"{why} exceed hardware.vllm_max_model_length={vllm_len} (vLLM's context); "
                              f"raise it to {need} or more, or set it to null (the model's own context)")
    return ContextCheck(prompt, completion, models, vllm_len)

