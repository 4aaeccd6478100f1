"""The teacher service: teacher models loaded next to the policy, and what injections may ask of them.

A teacher (:mod:`mixrl.sources.teacher`) is loaded here, frozen, with TRL's fused LM head at
the run's temperature (as TRL prepares its reference model); ``_SELF`` stands for the policy in
the list of teacher models (OPSD's self-teacher). Injections use teachers through three generic
callables of the :class:`mixrl.sources.base.InjectContext`: ``score_tokens``
(:meth:`TeacherService._score_token_lists`), ``generate_with`` (:meth:`TeacherService._sample`)
and ``rewards`` (:meth:`TeacherService._local_rewards`). The teacher's log-probs of the batch's
completion tokens are computed once per generation batch, under ``no_grad``, into
``teacher_logp`` (:meth:`TeacherService._teacher_logps`).

This mixin of :class:`mixrl.trainer.grpo.MixrlGRPOTrainer` reads the trainer's ``model``,
``accelerator``, ``args``, ``processing_class``, ``temperature``, ``reward_funcs``,
``reward_weights``, ``teacher``, ``_teacher_models``, ``_teacher_tokens`` and ``_metrics``; a
policy forward joins the other processes' under sharding (:mod:`mixrl.trainer.sharded_forward`).
"""

from __future__ import annotations

import contextlib
import math
import time

import torch
from transformers import AutoModelForCausalLM
from trl.data_utils import is_conversational
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import add_fused_lm_head

from mixrl.core import provenance as prov
from mixrl.errors import ConfigError
from mixrl.sources.teacher import combine_logps

_SELF = object()  # stands for the policy in the list of teacher models (OPSD's self-teacher)


class TeacherService:
    """Teacher loading and scoring, sampling and rule-based rewards for injections (mixin)."""

    def _load_teachers(self, teacher) -> list:
        """The teacher models, frozen, on their device and dtype, with TRL's fused LM head at the
        run's temperature (as TRL prepares its reference model); ``_SELF`` stands for the policy."""
        policy_dtype = next(self.model.parameters()).dtype
        models = []
        for path in teacher.paths or teacher.resolve():
            if path == "self":
                models.append(_SELF)
                continue
            dtype = policy_dtype if teacher.dtype == "auto" else getattr(torch, teacher.dtype)
            m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            m.to(teacher.device or self.accelerator.device).eval()
            m.requires_grad_(False)
            add_fused_lm_head(m, temperature=self.temperature, cast_lm_head_to_fp32=bool(getattr(self.args, "cast_lm_head_to_fp32", False)))
            models.append(m)
        return models

    def _score_padded(self, model, prompt_ids, prompt_mask, completion_ids, completion_mask, entropies: list | None = None) -> torch.Tensor:
        """Per-token log-probs [B, T] (float32, on the policy's device) of the completions under
        ``model`` (``_SELF``: the policy as it is now), under no_grad. ``entropies``: a list to
        append the model's next-token entropies [B, T] to (SRPO's weights)."""
        is_policy = model is _SELF or model is self.model
        model = self.model if model is _SELF else model
        dev = next(model.parameters()).device
        ids = torch.cat([prompt_ids, completion_ids], dim=1).to(dev)
        att = torch.cat([prompt_mask, completion_mask], dim=1).to(dev)
        batch_size = self.args.per_device_train_batch_size
        ctx = disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs) if is_policy else contextlib.nullcontext()
        with torch.no_grad(), ctx:
            missing = self._forward_deficit(-(-ids.size(0) // batch_size)) if is_policy else 0
            lp, ent, _ = self._get_per_token_logps_and_entropies(model, ids, att, completion_ids.size(1), batch_size=batch_size,
                                                                 compute_entropy=entropies is not None)
            self._dummy_forwards(missing)
        if entropies is not None:
            entropies.append(ent.float().to(self.accelerator.device))
        return lp.float().to(self.accelerator.device)

    def _pad(self, prompts: list[list[int]], completions: list[list[int]]):
        pad = self.processing_class.pad_token_id
        dev = self.accelerator.device
        pw, cw = max(len(p) for p in prompts), max(max(len(c) for c in completions), 1)
        p_ids = torch.full((len(prompts), pw), pad, dtype=torch.long, device=dev)
        p_mask = torch.zeros_like(p_ids)
        c_ids = torch.full((len(completions), cw), pad, dtype=torch.long, device=dev)
        c_mask = torch.zeros_like(c_ids)
        for i, (p, c) in enumerate(zip(prompts, completions)):
            if p:
                p_ids[i, pw - len(p):] = torch.as_tensor(p, device=dev)
                p_mask[i, pw - len(p):] = 1
            if c:
                c_ids[i, : len(c)] = torch.as_tensor(c, device=dev)
                c_mask[i, : len(c)] = 1
        return p_ids, p_mask, c_ids, c_mask

    def _score_token_lists(self, model, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """``InjectContext.score_tokens``: per-token log-probs of each completion under ``model``.
        Under sharding, a call for the policy with nothing to score still joins the others' forwards."""
        if not completion_ids:
            if model is _SELF or model is self.model:
                self._join_forwards(0)
            return []
        lp = self._score_padded(model, *self._pad(prompt_ids, completion_ids))
        return [lp[i, : len(c)].tolist() for i, c in enumerate(completion_ids)]

    def _sample(self, model, prompt_ids: list[int], n: int) -> list[list[int]]:
        """``InjectContext.generate_with``: ``n`` sampled completions of one prompt (eos included),
        at the run's temperature and top_p, at most ``max_completion_length`` tokens."""
        dev = next(model.parameters()).device
        ids = torch.as_tensor([prompt_ids] * n, dtype=torch.long, device=dev)
        eos, pad = self.processing_class.eos_token_id, self.processing_class.pad_token_id
        with torch.no_grad():
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=self.temperature,
                top_p=float(self.args.top_p), top_k=0, max_new_tokens=self.max_completion_length,
                pad_token_id=pad, eos_token_id=eos,
            )
        result = []
        for row in out[:, ids.size(1):].tolist():
            cut = row.index(eos) + 1 if eos in row else len(row)
            result.append(row[:cut])
        return result

    def _local_rewards(self, rows: list[dict], completion_ids: list[list[int]]) -> torch.Tensor:
        """``InjectContext.rewards``: the weighted reward of each (row, completion) on this
        process, without gathering (rule-based reward functions only)."""
        if not rows:
            return torch.zeros(0, device=self.accelerator.device)
        texts = self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        prompts = [r["prompt"] for r in rows]
        completions = [[{"role": "assistant", "content": t}] for t in texts] if is_conversational(rows[0]) else texts
        keys = [k for k in rows[0] if k not in ("prompt", "completion", "completion_ids")]
        kwargs = {k: [r.get(k) for r in rows] for k in keys}
        kwargs.update(trainer_state=self.state, log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None)
        per_func = torch.zeros(len(rows), len(self.reward_funcs), device=self.accelerator.device)
        for i, fn in enumerate(self.reward_funcs):
            if isinstance(fn, torch.nn.Module):
                raise ConfigError("teacher completions are checked with the run's reward functions, which must be rule-based "
                                  "functions (not reward models)")
            values = fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs)
            per_func[:, i] = torch.tensor([math.nan if v is None else float(v) for v in values], device=per_func.device)
        return (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)

    def _teacher_logps(self, out: dict, inputs: list[dict], mode: str) -> torch.Tensor:
        """``teacher_logp`` [B, T]: the teacher's log-prob of every completion token of the rows a
        teacher term trains on (NaN elsewhere and where no privileged context exists), once per
        generation batch, under no_grad. A privileged teacher (OPSD) reads each row's prompt
        with its context inserted; rows an injection appended (no training row) get none."""
        t0 = time.perf_counter()
        mask = out["completion_mask"].bool()
        result = torch.full(mask.shape, float("nan"), dtype=torch.float32, device=mask.device)
        rows = torch.nonzero((mask & prov.select(out["token_source"], self._teacher_tokens)).any(-1)).squeeze(1)
        teacher = self.teacher
        if teacher.privileged is not None and rows.numel():
            prompts = [teacher.teacher_prompt(inputs[i]) if i < len(inputs) else None for i in rows.tolist()]
            keep = [k for k, p in enumerate(prompts) if p is not None]
            rows = rows[keep]
        if rows.numel():
            width = int(mask[rows].sum(-1).max().clamp(min=1))
            c_ids, c_mask = out["completion_ids"][rows, :width], out["completion_mask"][rows, :width]
            if teacher.privileged is not None:
                p_list = self._tokenize_prompts([prompts[k] for k in keep])[0]
                p_ids, p_mask, _, _ = self._pad(p_list, [[0]] * len(p_list))
            else:
                p_ids, p_mask = out["prompt_ids"][rows], out["prompt_mask"][rows]
            ents: list | None = [] if getattr(self, "_teacher_entropy", False) else None
            lp = combine_logps([self._score_padded(m, p_ids, p_mask, c_ids, c_mask, ents) for m in self._teacher_models], teacher.combine)
            block = torch.where(c_mask.bool(), lp, torch.full_like(lp, float("nan")))
            result[rows, :width] = block
            if ents is not None:  # several teachers: the mean of their entropies (not the mixture's)
                ent = torch.stack(ents).mean(0)
                out["teacher_entropy"] = torch.full_like(result, float("nan"))
                out["teacher_entropy"][rows, :width] = torch.where(c_mask.bool(), ent, torch.full_like(ent, float("nan")))
            scored = c_mask.bool()
            self._metrics[mode]["teacher/logp"].append(float(lp[scored].mean()) if scored.any() else float("nan"))
            old = out.get("old_per_token_logps")
            if old is not None:
                self._metrics[mode]["teacher/kl_k1"].append(float((old[rows, :width] - lp)[scored].mean()))
        elif _SELF in self._teacher_models:  # no row to score here: join the other processes' forwards
            self._join_forwards(0)
        self._metrics[mode]["teacher/scored_tokens"].append(float(self.accelerator.reduce(
            torch.tensor(float((~result.isnan()).sum()), device=mask.device), reduction="sum")))
        self._metrics[mode]["teacher/seconds"].append(time.perf_counter() - t0)
        return result
