"""AdvantageShaping: the post-advantage stage (``algo.shaping``) and the per-rollout statistics it reads.

After the advantage estimator has given every row of the global batch its advantage, the
configured shaping (:data:`mixrl.core.advantage_shaping.SHAPINGS`) re-weights it. This part
gathers what the shaping lists in its ``needs``, from this process's batch, over all processes:

* ``token_logp``: the policy's per-token log-probs of each completion at rollout time (TRL's
  ``old_per_token_logps`` when it computed them, else one no-grad forward, :meth:`Forwards.behaviour_logps`);
* ``ref_logp``: the reference model's, TRL's ``ref_per_token_logps`` (the trainer asks TRL for them
  when a shaping needs them, :func:`mixrl.trainer.trl_args._needs_ref_logp`);
* ``prompt_logp`` / ``prompt_mask``: the policy's log-prob of each prompt token, one no-grad forward
  over the prompts (left-padded: a token whose predecessor is padding is left out);
* ``primary_rewards``: the first reward function's rewards; ``lengths``: completion tokens per row;
* ``token_entropy``: the policy's next-token entropies over each completion, one no-grad forward;
* ``tool_position``: the index of each completion's first tool-result token (provenance ``environment``), -1 without one.

Which rows are shaped: ``offpolicy: false`` (default) only the rows the policy sampled
(provenance behaviour ``policy``), ``true`` every row, expert, replayed and teacher rows
included (CHORD, LUFFY, replay: the same shaping as the rollouts). Rows not shaped keep the
estimator's advantage.

Owns: the shaping's name and parameters, and the Forwards. No state (``state_dict() == {}``).
Receives: the global batch's advantages, rewards, group ids and row sources, this process's batch
(``out``) and data rows, a controller's knobs (EntroPIC); gather/pad callables and the process index.
Returns: the shaped advantages [N_global] and ``shaping/*`` metrics; writes the row fields a term
reads (CalibRL's expert baseline) into ``out``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mixrl.core.advantage_shaping import SHAPINGS, shaping_fields, shaping_needs
from mixrl.core.aspo import first_tool_position
from mixrl.errors import ConfigError
from mixrl.trainer.parts.batch_fields import behaviour_is_policy
from mixrl.trainer.parts.forwards import Forwards


class AdvantageShaping:
    """The configured shaping over the global batch.

    Args:
        name: a :data:`SHAPINGS` name.
        params: its parameters (``offpolicy`` taken out).
        offpolicy: shape every row (True) or only the rows the policy sampled (False).
        forwards: the run's :class:`Forwards` (rollout and prompt log-probs).
        gather: concatenates a tensor over processes (dim 0; tensors of equal shape).
        pad: pads a tensor along dim 1 to the widest process's width (``accelerate``'s ``pad_across_processes``).
        process_index: this process's rank (its rows are the global rows ``rank * B ... (rank + 1) * B``).
    """

    def __init__(self, name: str, params: dict, *, offpolicy: bool, forwards: Forwards,
                 gather: Callable[[torch.Tensor], torch.Tensor], pad: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
                 process_index: int = 0):
        self.name, self.params, self.offpolicy = name, dict(params), bool(offpolicy)
        self.fn = SHAPINGS.get(name)
        self.needs = shaping_needs(self.fn)
        self.fields = shaping_fields(self.fn)  # row fields a term reads (CalibRL's expert baseline), or None
        self.forwards, self.gather, self.pad, self.process_index = forwards, gather, pad, process_index

    def shape(self, model, out: dict, *, advantages: torch.Tensor, rewards: torch.Tensor, group_ids: torch.Tensor,
              sources: torch.Tensor, include: torch.Tensor | None, rewards_per_func: torch.Tensor | None,
              rows: list | None = None, knobs: dict | None = None) -> tuple[torch.Tensor, dict]:
        """The shaped advantages [N_global] and ``shaping/*`` metrics. ``out``: this process's batch;
        ``sources``: the global rows' ``row_source``; ``rows``: this process's data rows (dicts), one per batch row;
        ``knobs``: a controller's values for this batch, ``shaping.<param>`` overriding the config's (EntroPIC)."""
        if advantages.dim() != 1:
            raise ValueError(f"advantage shaping {self.name} re-weights one advantage per row, got per-token advantages {tuple(advantages.shape)}")
        runtime = self.inputs(model, out, rewards_per_func, rows)
        set_now = {k.split(".", 1)[1]: float(v) for k, v in (knobs or {}).items() if k.startswith("shaping.")}
        shaped = self.fn(advantages, rewards=rewards, group_ids=group_ids, include=include, **runtime, **{**self.params, **set_now})
        shaped = torch.nan_to_num(shaped.to(advantages.dtype), nan=0.0)
        if self.fields is not None:
            self.write_fields(out, self.fields(runtime, rewards=rewards, group_ids=group_ids, sources=sources, params=self.params))
        shaped_rows = torch.ones_like(sources, dtype=torch.bool) if self.offpolicy else behaviour_is_policy(sources)
        result = torch.where(shaped_rows, shaped, advantages)
        changed = shaped_rows & (advantages != 0)
        ratio = (result[changed] / advantages[changed]).abs() if bool(changed.any()) else None
        metrics = {"shaping/rows": float(shaped_rows.float().mean()), **{f"shaping/{k}": v for k, v in set_now.items()}}
        if ratio is not None:
            metrics["shaping/scale_mean"] = float(ratio.mean())
        return result, metrics

    def inputs(self, model, out: dict, rewards_per_func: torch.Tensor | None, rows: list | None = None) -> dict:
        """The runtime inputs the shaping needs, over all processes."""
        needs, runtime = self.needs, {}
        mask = out["completion_mask"]
        if "mask" in needs:
            runtime["mask"] = self._rows(mask.float())
        if "token_logp" in needs:
            runtime["token_logp"] = self._rows(self.forwards.behaviour_logps(model, out).float() * mask)
        if "ref_logp" in needs:
            ref = out.get("ref_per_token_logps")
            if ref is None:
                raise ValueError(f"advantage shaping {self.name} needs the reference model's log-probs, which TRL did not compute")
            runtime["ref_logp"] = self._rows(ref.float() * mask)
        if "prompt_logp" in needs:
            logp, pmask = self.prompt_logps(model, out["prompt_ids"], out["prompt_mask"])
            runtime["prompt_logp"], runtime["prompt_mask"] = self._rows(logp), self._rows(pmask)
        if "primary_rewards" in needs and rewards_per_func is not None:
            runtime["primary_rewards"] = rewards_per_func[:, 0].nan_to_num(0.0)  # already gathered by TRL
        if "lengths" in needs:
            runtime["lengths"] = self.gather(mask.sum(dim=1).float())
        if "token_entropy" in needs:
            runtime["token_entropy"] = self._rows(self.entropies(model, out) * mask)
        if "tool_position" in needs:  # ASPO: where the first tool call ran
            runtime["tool_position"] = self.gather(first_tool_position(out["token_source"], mask))
        if "row_values" in needs:
            runtime["row_values"] = self.gather(self.column_values(rows, mask.shape[0], mask.device))
        return runtime

    def write_fields(self, out: dict, fields: dict) -> None:
        """This process's rows of global row fields [N_global, ...] into the batch (``out``), per-token
        ones cut to this batch's completion width; the objective hands them to the terms."""
        n_local, width = out["completion_mask"].shape
        start = self.process_index * n_local
        for key, value in fields.items():
            local = value[start : start + n_local]
            out[key] = local[:, :width] if local.dim() == 2 else local

    def entropies(self, model, out: dict) -> torch.Tensor:
        """The policy's next-token entropy [B, T] at each completion position (one no-grad forward; FunRL / EGPO)."""
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        att = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        with torch.no_grad(), self.forwards.no_checkpointing(model):
            _, ent, _ = self.forwards.logps(model, ids, att, out["completion_ids"].size(1), batch_size=self.forwards.batch_size,
                                            compute_entropy=True)
        return ent.float()

    def column_values(self, rows: list | None, n: int, device) -> torch.Tensor:
        """This process's rows' values of the data column ``params['column']`` (GUI-G1's per-problem weight)."""
        column = self.params.get("column", "rate")
        if rows is None or len(rows) != n:
            raise ValueError(f"advantage shaping {self.name} reads the data column {column!r} of each row, "
                             f"but the batch has {n} rows and {0 if rows is None else len(rows)} data rows")
        missing = [i for i, row in enumerate(rows) if column not in row]
        if missing:
            raise ConfigError(f"algo.shaping={self.name} reads the data column {column!r}, which the training data does not have "
                              f"(its columns: {', '.join(sorted(rows[missing[0]]))}); set algo.shaping.column to a numeric column")
        return torch.tensor([float(row[column]) for row in rows], dtype=torch.float32, device=device)

    def prompt_logps(self, model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy's log-prob of each prompt token but the first [B, P - 1] and which count (1: a
        prompt token after a prompt token; padding and the first token 0). No gradient."""
        width = prompt_ids.shape[1]
        if width < 2:
            return torch.zeros_like(prompt_ids[:, :1], dtype=torch.float32), torch.zeros_like(prompt_ids[:, :1], dtype=torch.float32)
        with torch.no_grad(), self.forwards.no_checkpointing(model):
            logp, _, _ = self.forwards.logps(model, prompt_ids, prompt_mask, width - 1, batch_size=self.forwards.batch_size)
        counted = (prompt_mask[:, 1:] * prompt_mask[:, :-1]).float()
        return logp.float() * counted, counted

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        """A [B, W] tensor of this process's rows over all processes (padded with 0 to the widest)."""
        return self.gather(self.pad(t))

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None
