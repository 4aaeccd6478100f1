"""``reward=model``: a sequence-classification reward model scores completions, alone or combined
with a verifier.

The model (a local folder, a hub id, or ``builtin:tiny-rm``, :mod:`mixrl.models.tiny_rm`) is loaded
on first use in each process, on its own device (``device``; default: the run's device,
``hardware.device``: the CPU on a CPU hardware config even with a GPU visible, else this process's GPU;
:func:`mixrl.rewards.components.local_device`), frozen, and reads ``prompt + completion`` as text in batches of ``batch_size``. Its scalar
output (``logits[:, 0]``) becomes the score ``s`` (``transform=sigmoid``: ``sigma(logit)``, in (0, 1)).

Normalisation of ``s`` over the call's rows (``normalize``): ``none``; ``batch``: ``(s - mean) / (std + 1e-6)``
over the batch; ``group``: the same within the rows that share a prompt (a GRPO group).

Combination with the verifier ``v`` (``verifier``, a reward name, default ``exact``; ``none``: RM only):
``gate=none``: ``r = rm_weight s + verifier_weight v``; ``gate=undecided``: ``r = v`` where the verifier
can decide and ``r = rm_weight s`` where it cannot. The verifier *cannot decide* a row when the
completion has no parsable answer (no non-empty text after ``marker``, ``####`` by default) or the row
has no gold answer (the verifier returns None).

Tokenizers: the reward model reads text, so a policy with another tokenizer is served by decoding the
completion and re-tokenising it with the reward model's tokenizer (said once in the log); with
``retokenize=false`` that case is refused at start-up with one line (:meth:`RewardModelReward.check_tokenizer`).
Held-out accuracy is judged by the verifier, not the model (:func:`mixrl.rewards.components.heldout_reward`).

The model's files are checked before it loads (:meth:`RewardModelReward.check_model`, at start-up and
before the first load): its ``config.json`` must name a ``*ForSequenceClassification`` architecture, and
the classification head's weights (the parameters outside the base model, ``score.weight`` for a
decoder) must be in its safetensors files. Anything else, e.g. the policy's own saved causal LM, is
refused in one line: transformers would load it with a randomly initialised head, and train on noise.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mixrl.models.files import check_model_files
from mixrl.errors import ConfigError
from mixrl.rewards.components import local_device, register_model_reward
from mixrl.rewards.extract import completion_text, extract_after_marker
from mixrl.rewards.protocol import RewardContext
from mixrl.rewards.registry import REWARDS, build_reward

logger = logging.getLogger(__name__)

NORMALIZE = ("none", "batch", "group")
GATES = ("none", "undecided")
TRANSFORMS = ("sigmoid", "none")
BUILTIN_RM = "builtin:tiny-rm"


def normalize_scores(scores: Sequence[float], keys: Sequence[Any], mode: str, eps: float = 1e-6) -> list[float]:
    """``mode=batch``: z-scores over all rows; ``group``: over the rows with the same key; ``none``: as is.
    The std is the population std (divide by n); a group of one row gets 0."""
    if mode == "none":
        return [float(x) for x in scores]
    groups: dict[Any, list[int]] = {}
    for i, k in enumerate(keys if mode == "group" else [0] * len(scores)):
        groups.setdefault(k, []).append(i)
    out = [0.0] * len(scores)
    for rows in groups.values():
        vals = [float(scores[i]) for i in rows]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
        for i, v in zip(rows, vals):
            out[i] = (v - mean) / (std + eps)
    return out


def verifier_decides(text: str, verdict: float | None, marker: str) -> bool:
    """Whether the verifier can decide a row: it returned a value and the completion has an answer after ``marker``."""
    if verdict is None:
        return False
    found = extract_after_marker(text, marker)
    return bool(found and found.strip())


def combine(scores: Sequence[float], verdicts: Sequence[float | None] | None, decided: Sequence[bool] | None, *,
            gate: str, rm_weight: float, verifier_weight: float) -> list[float]:
    """The reward per row (see the module docstring); a None verdict adds nothing with ``gate=none``."""
    if verdicts is None:
        return [rm_weight * s for s in scores]
    if gate == "undecided":
        return [float(v) if d else rm_weight * s for s, v, d in zip(scores, verdicts, decided)]
    return [rm_weight * s + verifier_weight * (float(v) if v is not None else 0.0) for s, v in zip(scores, verdicts)]


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, list):  # conversational: the messages' contents
        return "".join(m.get("content", "") for m in prompt if isinstance(m, dict))
    return "" if prompt is None else str(prompt)


def _missing_head_weights(path: str, config) -> list[str]:
    """The classification head's parameter names (those outside the base model) that the folder's
    safetensors files lack; [] when the folder holds no safetensors file (a hub id, ``.bin`` weights:
    left to the load)."""
    files = sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else []
    if not files:
        return []
    import torch  # deferred: config validation builds this reward
    from safetensors import safe_open  # deferred: reads the files' headers only
    from transformers import AutoModelForSequenceClassification  # deferred: transformers, 1 s

    try:
        with torch.device("meta"):  # parameter names only, no memory
            shell = AutoModelForSequenceClassification.from_config(config)
    except Exception:  # noqa: BLE001 - a config transformers cannot build here: the load will say why
        return []
    prefix = f"{shell.base_model_prefix}."
    head = [n for n, _ in shell.named_parameters() if not n.startswith(prefix)]
    stored: set[str] = set()
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            stored.update(fh.keys())
    return [n for n in head if n not in stored]


class RewardModelReward:
    """The picklable reward function of ``reward=model`` (the model is loaded lazily, per process)."""

    def __init__(self, *, path: str, batch_size: int, normalize: str, transform: str, verifier: str, verifier_weight: float,
                 rm_weight: float, gate: str, retokenize: bool, device: str | None, marker: str, answer_column: str,
                 run_device: str | None = None):
        self.__name__ = "reward_model"
        self.path, self.batch_size, self.normalize, self.transform = path, batch_size, normalize, transform
        self.rm_weight, self.verifier_weight, self.gate, self.retokenize = rm_weight, verifier_weight, gate, retokenize
        self.device, self.marker, self.answer_column = device, marker, answer_column
        self.verifier_name = verifier
        self.verifier = None if verifier == "none" else build_reward(verifier, answer_column=answer_column)
        self._model = self._tokenizer = None
        self._said_retokenize = False
        self._checked = False  # check_model passed (in this process)
        self.run_device = run_device  # hardware.device (the run's RewardContext): where the model loads when ``device`` is unset

    def __getstate__(self):
        return {**self.__dict__, "_model": None, "_tokenizer": None, "_checked": False}

    # ------------------------------------------------------------------ the model
    def resolved_path(self) -> str:
        if self.path == BUILTIN_RM:
            from mixrl.models.tiny_rm import build_tiny_rm  # deferred: trains the model on first use (torch)

            return str(build_tiny_rm())
        return str(self.path)

    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer  # deferred: transformers, 1 s; config validation builds this reward

            self._tokenizer = AutoTokenizer.from_pretrained(self.resolved_path())
            if self._tokenizer.pad_token is None:
                self._tokenizer.pad_token = self._tokenizer.eos_token
        return self._tokenizer

    def check_model(self) -> None:
        """Refuse, in one line and before any weight loads, a model that is not a sequence classifier
        with its head saved (see the module docstring). Checked once per process."""
        if getattr(self, "_checked", False):
            return
        path = self.resolved_path()
        where = f"reward.params.path={self.path}"
        if Path(path).is_dir():  # a local folder: the files any model needs first (mixrl.models.files)
            check_model_files(path, where)
        try:
            from transformers import AutoConfig  # deferred: transformers, 1 s

            config = AutoConfig.from_pretrained(path)
        except (OSError, ValueError) as e:
            raise ConfigError(f"{where}: no model config could be read there ({str(e).splitlines()[0]}); "
                              "give a sequence-classification model's folder or hub id, or builtin:tiny-rm") from None
        archs = list(getattr(config, "architectures", None) or [])
        if not any(a.endswith("ForSequenceClassification") for a in archs):
            raise ConfigError(f"{where} is a {', '.join(archs) or config.model_type} model without a classification head "
                              "(config.json names no *ForSequenceClassification architecture), so its scores would come from a "
                              "randomly initialised head; give a trained reward model (a sequence classifier) or builtin:tiny-rm")
        missing = _missing_head_weights(path, config)
        if missing:
            raise ConfigError(f"{where}: its config names {archs[0]} but its weights hold no classification head "
                              f"({', '.join(missing)} missing), so its scores would come from a randomly initialised head; "
                              "give a trained reward model (a sequence classifier) or builtin:tiny-rm")
        self._checked = True

    def model(self):
        if self._model is None:
            from transformers import AutoModelForSequenceClassification  # deferred: transformers, 1 s

            self.check_model()
            device = self.device or local_device(self.run_device)
            model = AutoModelForSequenceClassification.from_pretrained(self.resolved_path(), dtype="auto")  # its checkpoint's dtype
            if model.config.pad_token_id is None:
                model.config.pad_token_id = self.tokenizer().pad_token_id
            self._model = model.to(device).eval().requires_grad_(False)
        return self._model

    def check_tokenizer(self, policy_tokenizer: Any) -> None:
        """At start-up: a policy tokenizer unlike the reward model's is re-tokenised (logged once) or refused."""
        mine = self.tokenizer()
        if mine.get_vocab() == policy_tokenizer.get_vocab():
            return
        if not self.retokenize:
            raise ConfigError(
                f"reward model {self.path!r} has another tokenizer than the policy ({len(mine)} vs {len(policy_tokenizer)} "
                "tokens); set reward.params.retokenize=true (completions are decoded and re-tokenised for it) or use a "
                "reward model trained on the policy's tokenizer")
        if not self._said_retokenize:
            logger.warning("reward model %r has its own tokenizer (%d tokens, the policy's: %d): completions are decoded to "
                           "text and re-tokenised for it", self.path, len(mine), len(policy_tokenizer))
            self._said_retokenize = True

    def scores(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[float]:
        """The reward model's score of each ``prompt + completion`` (after ``transform``)."""
        import torch  # deferred: config validation builds this reward

        model, tok = self.model(), self.tokenizer()
        texts = [_prompt_text(p) + completion_text(c) for p, c in zip(prompts, completions)]
        out: list[float] = []
        with torch.no_grad():
            for i in range(0, len(texts), self.batch_size):
                enc = tok(texts[i:i + self.batch_size], return_tensors="pt", padding=True, truncation=True)
                enc = {k: v.to(model.device) for k, v in enc.items()}
                logits = model(**enc).logits[:, 0].float()
                out.extend((torch.sigmoid(logits) if self.transform == "sigmoid" else logits).cpu().tolist())
        return out

    # ------------------------------------------------------------------ the reward
    def __call__(self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None, **kwargs: Any):
        prompts, completions = list(prompts or [""] * len(completions or [])), list(completions or [])
        raw = self.scores(prompts, completions)
        s = normalize_scores(raw, [_prompt_text(p) for p in prompts], self.normalize)
        verdicts = decided = None
        if self.verifier is not None:
            verdicts = self.verifier(prompts=prompts, completions=completions, **kwargs)
            decided = [verifier_decides(completion_text(c), v, self.marker) for c, v in zip(completions, verdicts)]
        log = kwargs.get("log_metric")
        if callable(log) and completions:
            log("reward_model/score", sum(raw) / len(raw))
            if decided is not None:
                log("reward_model/undecided_frac", 1.0 - sum(decided) / len(decided))
        return combine(s, verdicts, decided, gate=self.gate, rm_weight=self.rm_weight, verifier_weight=self.verifier_weight)


@register_model_reward("model", bounds={"batch_size": ">= 1"})
def reward_model(*, path: str = BUILTIN_RM, batch_size: int = 64, normalize: str = "none", transform: str = "sigmoid",
                 verifier: str = "exact", verifier_weight: float = 0.0, rm_weight: float = 1.0, gate: str = "none",
                 retokenize: bool = True, device: str | None = None, marker: str = "####",
                 answer_column: str = "answer", context: RewardContext | None = None) -> RewardModelReward:
    """A sequence-classification reward model's score of each completion, optionally normalised and combined with a verifier.

    The score is the model's scalar output on ``prompt + completion`` (sigmoid of the logit by default),
    normalised per batch or per group, and combined with the verifier ``v``: weighted
    (``gate=none``) or, with ``gate=undecided``, the verifier where it can decide (a parsable answer
    after ``marker`` and a gold answer) and the reward model elsewhere. ``path``: a folder, a hub id or
    ``builtin:tiny-rm`` (a Qwen2 classifier trained here on the arithmetic task's right and wrong completions).

    Formula: r_i = {rm_weight} norm_{normalize}(s_i) + {verifier_weight} v_i (gate=none) or r_i = v_i if the verifier decides row i else {rm_weight} norm(s_i) (gate=undecided); s_i = {transform}(RM(prompt_i + completion_i)) [gate={gate}]

    Paper: "Training language models to follow instructions with human feedback" (Ouyang et al. 2022, arXiv 2203.02155): a learned scalar reward model scores the policy's completions for RL.

    Parameters:
        path (str): a folder, a hub id, or builtin:tiny-rm.
        batch_size (int): completions per forward of the reward model.
        normalize (str): none, batch (z-score over the batch) or group (z-score over the rows of one prompt).
        transform (str): sigmoid (s = sigma(logit)) or none (s = logit).
        verifier (str): the verifier combined with the score, and that judges held-out accuracy: exact, math or none.
        verifier_weight (float): gate=none: the verifier's weight.
        rm_weight (float): the reward model's weight.
        gate (str): none (weighted sum) or undecided (the verifier where it decides, the reward model elsewhere).
        retokenize (bool): a policy with another tokenizer: re-tokenise the text (true) or refuse at start-up (false).
        device (str | None): where the reward model runs; None: the run's device (hardware.device: cpu, or this process's GPU).
        marker (str): the answer marker; a completion with nothing after it is one the verifier cannot decide.
        answer_column (str): the gold answer column the verifier reads.
    """
    for key, value, allowed in (("normalize", normalize, NORMALIZE), ("gate", gate, GATES), ("transform", transform, TRANSFORMS)):
        if value not in allowed:
            raise ConfigError(f"reward 'model': {key}={value!r} is not one of {', '.join(allowed)}; fix reward.params.{key}")
    if verifier != "none" and verifier not in REWARDS:
        raise ConfigError(f"reward 'model': verifier={verifier!r} is not a registered reward; use one of exact, math, none")
    if verifier in ("model", "judge", "process"):
        raise ConfigError(f"reward 'model': verifier={verifier!r} is not a verifier; use exact, math or none")
    if gate == "undecided" and verifier == "none":
        raise ConfigError("reward 'model': gate=undecided needs a verifier; set reward.params.verifier=exact (or math)")
    if int(batch_size) < 1:
        raise ConfigError(f"reward 'model': batch_size={batch_size} must be >= 1; fix reward.params.batch_size")
    return RewardModelReward(path=str(path), batch_size=int(batch_size), normalize=normalize, transform=transform,
                             verifier=verifier, verifier_weight=float(verifier_weight), rm_weight=float(rm_weight), gate=gate,
                             retokenize=bool(retokenize), device=device, marker=marker, answer_column=answer_column,
                             run_device=context.device if context is not None else None)
