"""Scoring: the run's reward functions on completions that are not the rollouts'.

The rollouts are scored by TRL (``GRPOTrainer._calculate_rewards``, gathered over processes).
The parts that score other completions go through :class:`Scoring`: the injections' ``score``
(a hint's retry, a teacher's candidates, gathered), ReMax's greedy completions (gathered) and the
teacher service's ``rewards`` (local, rule-based functions only, no gather). Completions are text
(or one assistant message when the row's prompt is a conversation), as TRL hands them to the
reward functions; the weighted reward is ``sum_f w_f r_f`` with NaN (no opinion) skipped.

Owns: the reward functions, their weights and the tokenizer's decode (nothing that changes:
``state_dict() == {}``). Receives at construction TRL's gathered scorer and its conversation
test as callables; per call: the rows and completion ids (and the trainer state the reward
functions may read). Returns reward tensors, and (:meth:`Scoring.correct`) which rollouts are
correct for the training ``accuracy`` metric.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from mixrl.errors import ConfigError
from mixrl.rewards.components import training_judge


class Scoring:
    """The run's reward functions on local completions (gathered through TRL, or local)."""

    def __init__(self, *, reward_funcs: list, reward_weights: torch.Tensor, decode: Callable, calculate: Callable,
                 is_conversational: Callable, device):
        self.reward_funcs = list(reward_funcs)
        self.reward_weights = reward_weights
        self.decode = decode  # token id lists -> texts (special tokens skipped)
        self.calculate = calculate  # TRL's (inputs, prompts, completions, completion_ids) -> [N_global, F], gathered
        self.is_conversational = is_conversational
        self.device = device

    def weighted(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """``[N, F] -> [N]``: the weighted sum over reward functions, NaN skipped."""
        return (rewards_per_func * self.reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)

    def _completions(self, texts: list[str], chat: bool):
        return [[{"role": "assistant", "content": t}] for t in texts] if chat else texts

    def gathered(self, rows: list[dict], completion_ids: list[list[int]]) -> torch.Tensor:
        """``InjectContext.score``: the reward functions on local (row, completion) pairs, gathered over processes: [N_global, F]."""
        prompts = [x["prompt"] for x in rows]
        return self.gathered_texts(rows, self.decode(completion_ids), completion_ids,
                                   probe={"prompt": prompts[0]} if prompts else None)

    def gathered_texts(self, rows: list[dict], texts: list[str], completion_ids: list[list[int]], *, probe: dict | None):
        """TRL's gathered reward matrix of decoded completions; ``probe``: the row whose prompt says
        whether completions are messages (None: text)."""
        prompts = [x["prompt"] for x in rows]
        chat = probe is not None and self.is_conversational(probe)
        return self.calculate(rows, prompts, self._completions(texts, chat), completion_ids)

    def local(self, rows: list[dict], completion_ids: list[list[int]], *, trainer_state) -> torch.Tensor:
        """``InjectContext.rewards``: the weighted reward of each (row, completion) on this
        process, without gathering (rule-based reward functions only)."""
        if not rows:
            return torch.zeros(0, device=self.device)
        texts = self.decode(completion_ids)
        prompts = [r["prompt"] for r in rows]
        completions = self._completions(texts, self.is_conversational(rows[0]))
        keys = [k for k in rows[0] if k not in ("prompt", "completion", "completion_ids")]
        kwargs = {k: [r.get(k) for r in rows] for k in keys}
        kwargs.update(trainer_state=trainer_state, log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None)
        per_func = torch.zeros(len(rows), len(self.reward_funcs), device=self.device)
        for i, fn in enumerate(self.reward_funcs):
            if isinstance(fn, torch.nn.Module):
                raise ConfigError("teacher completions are checked with the run's reward functions, which must be rule-based "
                                  "functions (not reward models)")
            values = fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs)
            per_func[:, i] = torch.tensor([math.nan if v is None else float(v) for v in values], device=per_func.device)
        return (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)

    def correct(self, primary: torch.Tensor, rows: list[dict], completion_ids: torch.Tensor, completion_mask: torch.Tensor, *,
                gather: Callable) -> torch.Tensor | None:
        """``[N_global]`` bool: which rollouts are correct, for the training ``accuracy`` metric
        (:func:`mixrl.rewards.components.training_judge`): ``primary >= 1`` (the first reward's
        gathered column) for a rule-based reward; a reward from a model with a verifier: the
        verifier's verdict >= 1 on this process's ``rows`` and completions (``completion_ids``
        under ``completion_mask``), gathered (every process calls it); one without: None (no accuracy).
        A row the verifier cannot judge (no gold answer: None) counts as not correct, as it does for ``primary``."""
        judge = training_judge(self.reward_funcs[0])
        if judge is None:
            return None
        if judge is self.reward_funcs[0]:
            return primary >= 1.0 - 1e-6
        ids = [row[mask.bool()].tolist() for row, mask in zip(completion_ids, completion_mask)]
        if len(rows) != len(ids):
            raise RuntimeError(f"accuracy: {len(rows)} rows for {len(ids)} completions")  # a collective follows: never skip it silently
        completions = self._completions(self.decode(ids), bool(rows) and self.is_conversational(rows[0]))
        keys = [k for k in rows[0] if k not in ("prompt", "completion", "completion_ids")] if rows else []
        verdicts = judge(prompts=[r["prompt"] for r in rows], completions=completions,
                         **{k: [r.get(k) for r in rows] for k in keys}) if rows else []
        local = torch.tensor([math.nan if v is None else float(v) for v in verdicts], device=self.device, dtype=torch.float32)
        return gather(local) >= 1.0 - 1e-6

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
