"""Forwards: every no-grad or training forward of a model over completion tokens, and the sharding rule.

The parts that run the policy (teacher scoring, behaviour log-probs of lagged or injected rows,
ReMax's batch, the injections' scoring) and the loss (one forward per kind of row) share this
object. It wraps TRL's per-token log-prob function (``GRPOTrainer._get_per_token_logps_and_entropies``:
the fused, chunked LM head that never builds the ``[tokens, V]`` logits), handed in by the trainer
as a plain callable, together with the rule that under FSDP or DeepSpeed ZeRO-3 every process
joins every policy forward: a sharded policy gathers its parameters from all processes in each
forward, so a forward that one process runs and another skips (the behaviour forward of hinted
rows, a self-teacher scoring some rows, AMPO's student scoring) leaves the others waiting
forever. Without sharding (one process, DDP) the rule does nothing.

Owns: the log-prob callable, whether forwards are collective, the padding token, the device and
the scoring batch size. Receives per call: the model (the policy as it is now, a teacher, the
reference model) and the rows. Returns tensors. No state to checkpoint (``state_dict() == {}``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.distributed as dist

from mixrl.core import provenance as prov

#: ``(model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False) ->
#: (logps [B, T], entropies [B, T] or None, extra)``: TRL's per-token log-probs
LogpsFn = Callable[..., tuple]


class Forwards:
    """Per-token log-probs of completions under a model, every process joining a sharded policy's forwards.

    Args:
        logps: TRL's per-token log-prob function (:data:`LogpsFn`).
        collective: every policy forward needs every process (FSDP or ZeRO-3 over more than one process).
        device: where the batch lives (the accelerator's device).
        pad_token_id: the token padded lists use.
        dummy_token: the one token of a dummy forward (the pad token, else EOS).
        batch_size: rows per no-grad forward (``per_device_train_batch_size``).
        no_checkpointing: ``model -> context``: gradient checkpointing off for a no-grad policy forward.
    """

    def __init__(self, logps: LogpsFn, *, collective: bool, device, pad_token_id: int | None, dummy_token: int,
                 batch_size: int, no_checkpointing: Callable = lambda model: contextlib.nullcontext()):
        self.logps = logps
        self.collective = bool(collective)
        self.device = device
        self.pad_token_id = pad_token_id
        self.dummy_token = int(dummy_token)
        self.batch_size = int(batch_size)
        self.no_checkpointing = no_checkpointing

    # ------------------------------------------------------------------ the loss's forward
    def by_row_kind(self, model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probs and entropies. Rows the injections appended or wrote (another
        ``row_source`` than the rollouts) get a forward of their own, trimmed to their longest
        completion, so they cost their own tokens rather than the rollouts' padded width.
        Rows are independent: the values are those of one forward over the micro-batch, up
        to float rounding (measured: equal to 1e-6 on the pinned cases). With a sharded policy
        (:attr:`collective`) every micro-batch gets one forward: the kinds of rows differ
        between processes (expert rows, replayed rows, teacher rows land on some), and one
        forward per kind would leave a process waiting for a forward the others never run."""
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        kinds = inputs["row_source"].unique()
        if len(kinds) == 1 or self.collective:
            ids = torch.cat([prompt_ids, completion_ids], dim=1)
            att = torch.cat([prompt_mask, completion_mask], dim=1)
            logps, entropies, _ = self.logps(model, ids, att, completion_ids.size(1), compute_entropy=True)
            return logps, entropies
        logps = entropies = None
        for kind in kinds:
            rows = torch.nonzero(inputs["row_source"] == kind).squeeze(1)
            w = completion_ids.size(1)
            if int(kind) != prov.ON_POLICY:
                w = int(completion_mask[rows].sum(-1).max().clamp(min=1))
            ids = torch.cat([prompt_ids[rows], completion_ids[rows, :w]], dim=1)
            att = torch.cat([prompt_mask[rows], completion_mask[rows, :w]], dim=1)
            lp, ent, _ = self.logps(model, ids, att, w, compute_entropy=True)
            if logps is None:
                logps = lp.new_zeros(completion_ids.shape)
                entropies = ent.new_zeros(completion_ids.shape)
            cols = torch.arange(w, device=rows.device).unsqueeze(0)
            logps = logps.index_put((rows.unsqueeze(1), cols), lp)
            entropies = entropies.index_put((rows.unsqueeze(1), cols), ent)
        return logps, entropies

    # ------------------------------------------------------------------ behaviour log-probs
    def behaviour_logps(self, model, out: dict) -> torch.Tensor:
        """Per-token log-probs of a generation batch's completions under the weights in place
        (lagged or a past version's): the rollouts' behaviour log-probs. TRL's own value is
        reused when it computed it."""
        if out.get("old_per_token_logps") is not None:
            return out["old_per_token_logps"]
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        att = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        with torch.no_grad():
            logps, _, _ = self.logps(model, ids, att, out["completion_ids"].size(1), batch_size=self.batch_size)
        return logps

    # ------------------------------------------------------------------ scoring padded rows
    def score_padded(self, model, prompt_ids, prompt_mask, completion_ids, completion_mask, *, is_policy: bool,
                     entropies: list | None = None) -> torch.Tensor:
        """Per-token log-probs [B, T] (float32, on :attr:`device`) of the completions under
        ``model``, under no_grad. ``is_policy``: ``model`` is the policy (its forward is
        collective under sharding, and gradient checkpointing is turned off for it).
        ``entropies``: a list to append the model's next-token entropies [B, T] to (SRPO's weights)."""
        dev = next(model.parameters()).device
        ids = torch.cat([prompt_ids, completion_ids], dim=1).to(dev)
        att = torch.cat([prompt_mask, completion_mask], dim=1).to(dev)
        batch_size = self.batch_size
        ctx = self.no_checkpointing(model) if is_policy else contextlib.nullcontext()
        with torch.no_grad(), ctx:
            missing = self.deficit(-(-ids.size(0) // batch_size)) if is_policy else 0
            lp, ent, _ = self.logps(model, ids, att, completion_ids.size(1), batch_size=batch_size,
                                    compute_entropy=entropies is not None)
            self.dummy(model, missing)
        if entropies is not None:
            entropies.append(ent.float().to(self.device))
        return lp.float().to(self.device)

    def pad(self, prompts: list[list[int]], completions: list[list[int]]):
        """Token lists as TRL's batch holds them: prompts left-padded, completions right-padded, with masks."""
        pad, dev = self.pad_token_id, self.device
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

    def score_token_lists(self, model, prompt_ids: list[list[int]], completion_ids: list[list[int]], *,
                          is_policy: bool) -> list[list[float]]:
        """``InjectContext.score_tokens``: per-token log-probs of each completion under ``model``.
        Under sharding, a call for the policy with nothing to score still joins the others' forwards."""
        if not completion_ids:
            if is_policy:
                self.join(model, 0)
            return []
        lp = self.score_padded(model, *self.pad(prompt_ids, completion_ids), is_policy=is_policy)
        return [lp[i, : len(c)].tolist() for i, c in enumerate(completion_ids)]

    # ------------------------------------------------------------------ the sharding rule
    def deficit(self, mine: int) -> int:
        """Before ``mine`` no-grad policy forwards: how many dummy ones this process must add so
        that every process runs as many as the busiest (one all_reduce, before any of them, so
        that the processes' collectives stay in the same order). 0 without sharding."""
        if not self.collective:
            return 0
        most = torch.tensor([int(mine)], dtype=torch.long, device=self.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        return int(most) - int(mine)

    def dummy(self, policy, n: int) -> None:
        """``n`` no-grad forwards of the policy on one token (their output unused)."""
        if n <= 0:
            return
        ids = torch.full((1, 1), self.dummy_token, dtype=torch.long, device=self.device)
        with torch.no_grad():
            for _ in range(n):
                policy(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)

    def join(self, policy, mine: int) -> None:
        """A call site some processes skip: join the busiest process's forwards with dummy ones."""
        self.dummy(policy, self.deficit(mine))

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
