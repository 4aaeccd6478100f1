"""The teacher service: frozen teacher models next to the policy, and what they compute for a batch.

A teacher (:mod:`mixrl.sources.teacher`, the ``teacher`` config node) is loaded by the assembly
(:func:`mixrl.trainer.parts.assemble.load_teacher_models`: frozen, with TRL's fused LM head at
the run's temperature, as TRL prepares its reference model); :data:`SELF` stands for the policy
in the list of teacher models (OPSD's self-teacher). Injections use teachers through generic
callables of the :class:`mixrl.sources.base.InjectContext`: ``score_tokens`` (the shared
:class:`~mixrl.trainer.parts.forwards.Forwards`), ``generate_with`` (:meth:`Teachers.sample`) and
``rewards`` (:class:`~mixrl.trainer.parts.scoring.Scoring`). The teacher's log-probs of the batch's
completion tokens are computed once per generation batch, under ``no_grad``, into ``teacher_logp``
(:meth:`Teachers.logps`).

Owns: the teacher spec and models, the tokens a teacher term trains on, whether SRPO's entropies
are wanted (nothing that changes: ``state_dict() == {}``). Receives at construction the shared
``Forwards``, the prompt tokenizer and the sampling settings; per call: the policy as it is now,
the batch and its rows. Returns tensors and a metrics dict (``teacher/*``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from mixrl.core import provenance as prov
from mixrl.sources.teacher import combine_logps

SELF = object()  # stands for the policy in the list of teacher models (OPSD's self-teacher)


class Teachers:
    """Teacher models: scoring a batch (``teacher_logp``), sampling for injections."""

    def __init__(self, spec, models: list, *, forwards, tokens: tuple, entropy: bool, tokenize_prompts: Callable,
                 reduce_sum: Callable, temperature: float, top_p: float, max_completion_length: int,
                 eos_token_id: int, pad_token_id: int | None):
        self.spec = spec  # mixrl.sources.teacher's teacher: paths, privileged context, how several combine
        self.models = list(models)  # frozen models; SELF: the policy
        self.forwards = forwards
        self.tokens = tuple(tokens)  # token populations a teacher term trains on (empty: no teacher_logp)
        self.entropy = bool(entropy)  # SRPO's weights need the teacher's entropies
        self.tokenize_prompts = tokenize_prompts
        self.reduce_sum = reduce_sum
        self.temperature, self.top_p = temperature, float(top_p)
        self.max_completion_length = max_completion_length
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id

    @property
    def frozen(self) -> list:
        """The teacher models other than the policy."""
        return [m for m in self.models if m is not SELF]

    def sample(self, model, prompt_ids: list[int], n: int) -> list[list[int]]:
        """``InjectContext.generate_with``: ``n`` sampled completions of one prompt (eos included),
        at the run's temperature and top_p, at most ``max_completion_length`` tokens."""
        dev = next(model.parameters()).device
        ids = torch.as_tensor([prompt_ids] * n, dtype=torch.long, device=dev)
        eos, pad = self.eos_token_id, self.pad_token_id
        with torch.no_grad():
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=self.temperature,
                top_p=self.top_p, top_k=0, max_new_tokens=self.max_completion_length,
                pad_token_id=pad, eos_token_id=eos,
            )
        result = []
        for row in out[:, ids.size(1):].tolist():
            cut = row.index(eos) + 1 if eos in row else len(row)
            result.append(row[:cut])
        return result

    def logps(self, policy, out: dict, inputs: list[dict]) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float]]:
        """``(teacher_logp, teacher_entropy, metrics)``: the teacher's log-prob [B, T] of every
        completion token of the rows a teacher term trains on (NaN elsewhere and where no
        privileged context exists), once per generation batch, under no_grad; the teachers' mean
        entropy there when SRPO's weights want it (else None). A privileged teacher (OPSD) reads
        each row's prompt with its context inserted; rows an injection appended (no training
        row) get none. ``policy``: the policy as it is now (a self-teacher's model)."""
        t0 = time.perf_counter()
        metrics: dict[str, float] = {}
        mask = out["completion_mask"].bool()
        result = torch.full(mask.shape, float("nan"), dtype=torch.float32, device=mask.device)
        entropy = None
        rows = torch.nonzero((mask & prov.select(out["token_source"], self.tokens)).any(-1)).squeeze(1)
        teacher = self.spec
        if teacher.privileged is not None and rows.numel():
            prompts = [teacher.teacher_prompt(inputs[i]) if i < len(inputs) else None for i in rows.tolist()]
            keep = [k for k, p in enumerate(prompts) if p is not None]
            rows = rows[keep]
        if rows.numel():
            width = int(mask[rows].sum(-1).max().clamp(min=1))
            c_ids, c_mask = out["completion_ids"][rows, :width], out["completion_mask"][rows, :width]
            if teacher.privileged is not None:
                p_list = self.tokenize_prompts([prompts[k] for k in keep])
                p_ids, p_mask, _, _ = self.forwards.pad(p_list, [[0]] * len(p_list))
            else:
                p_ids, p_mask = out["prompt_ids"][rows], out["prompt_mask"][rows]
            ents: list | None = [] if self.entropy else None
            lp = combine_logps([self.forwards.score_padded(policy if m is SELF else m, p_ids, p_mask, c_ids, c_mask,
                                                           is_policy=m is SELF or m is policy, entropies=ents)
                                for m in self.models], teacher.combine)
            block = torch.where(c_mask.bool(), lp, torch.full_like(lp, float("nan")))
            result[rows, :width] = block
            if ents is not None:  # several teachers: the mean of their entropies (not the mixture's)
                ent = torch.stack(ents).mean(0)
                entropy = torch.full_like(result, float("nan"))
                entropy[rows, :width] = torch.where(c_mask.bool(), ent, torch.full_like(ent, float("nan")))
            scored = c_mask.bool()
            metrics["teacher/logp"] = float(lp[scored].mean()) if scored.any() else float("nan")
            old = out.get("old_per_token_logps")
            if old is not None:
                metrics["teacher/kl_k1"] = float((old[rows, :width] - lp)[scored].mean())
        elif SELF in self.models:  # no row to score here: join the other processes' forwards
            self.forwards.join(policy, 0)
        metrics["teacher/scored_tokens"] = float(self.reduce_sum(torch.tensor(float((~result.isnan()).sum()), device=mask.device)))
        metrics["teacher/seconds"] = time.perf_counter() - t0
        return result, entropy, metrics

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
