"""Sharded forwards: under FSDP or DeepSpeed ZeRO-3 every process joins every policy forward.

A sharded policy gathers its parameters from all processes in each forward, so a forward that
one process runs and another skips (the behaviour forward of hinted rows, a self-teacher scoring
some rows, AMPO's student scoring) leaves the others waiting forever. This mixin of
:class:`mixrl.trainer.grpo.MixrlGRPOTrainer` owns that rule: whether forwards are collective,
how many dummy forwards a process owes (one all_reduce), and running them. Without sharding
(one process, DDP) it does nothing.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class ShardedForwards:
    """Joining the policy's forwards over processes (mixin; reads the trainer's ``accelerator``,
    ``_dist``, ``model`` and ``processing_class``)."""

    def _forwards_collective(self) -> bool:
        """Does every forward of the policy need every process? Under FSDP and DeepSpeed ZeRO-3
        each forward gathers the sharded parameters from all processes, so a forward that one
        process runs and another skips (the behaviour forward of hinted rows, a self-teacher
        scoring some rows, AMPO's student scoring) leaves it waiting forever. DDP's forward is local."""
        return self.accelerator.num_processes > 1 and (self._dist.is_fsdp or self._dist.is_zero3)

    def _forward_deficit(self, mine: int) -> int:
        """Before ``mine`` no-grad policy forwards: how many dummy ones this process must add so
        that every process runs as many as the busiest (one all_reduce, before any of them, so
        that the processes' collectives stay in the same order). 0 without sharding."""
        if not self._forwards_collective():
            return 0
        most = torch.tensor([int(mine)], dtype=torch.long, device=self.accelerator.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        return int(most) - int(mine)

    def _dummy_token(self) -> int:
        tok = self.processing_class
        return int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)

    def _dummy_forwards(self, n: int) -> None:
        """``n`` no-grad forwards of the policy on one token (their output unused)."""
        if n <= 0:
            return
        ids = torch.full((1, 1), self._dummy_token(), dtype=torch.long, device=self.accelerator.device)
        with torch.no_grad():
            for _ in range(n):
                self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)

    def _join_forwards(self, mine: int) -> None:
        """A call site some processes skip: join the busiest process's forwards with dummy ones."""
        self._dummy_forwards(self._forward_deficit(mine))
