"""How off-policy rows enter a generation batch (the ``algo.mix.mode`` axis).

A mixer is consulted by ``MixrlGRPOTrainer`` at two points of each generation batch:

* ``rewrite_completions(trainer, inputs, completion_ids, logprobs)``: after rollouts are
  generated and before they are scored. ``group_inject`` (LUFFY) replaces the last
  ``k`` rollouts of each group by expert completions; ``sft`` replaces all of them.
* ``after_scoring(trainer, inputs, out)``: after advantages are computed. ``aux_loss``
  (CHORD) appends its own expert rows (other prompts, advantage 0) to the batch.

Every injected row is tagged ``row_source = EXPERT`` in a tensor whose first dimension
is the batch, so the tag survives TRL's shuffling and splitting. Group position comes
from the *global* row index (``process_index * rows_per_process + i``): TRL lays a
group's ``num_generations`` rows out consecutively across processes, so a group that
straddles two processes still gets exactly ``k`` expert rows.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from omegaconf import DictConfig

from mixrl.config.rules import Geometry
from mixrl.core.objective import EXPERT, ON_POLICY
from mixrl.errors import DataError


def _expert_ids(trainer, text: str) -> list[int]:
    """Token ids of one expert completion, ended by eos and cut to max_completion_length."""
    tok = trainer.processing_class
    ids = tok(text=text, add_special_tokens=False)["input_ids"]
    eos = tok.eos_token_id
    return (list(ids) + [eos])[: trainer.max_completion_length]


class GroupInjectMixer:
    """LUFFY: the last ``k`` of each group's ``num_generations`` rollouts are replaced by
    expert completions of the same prompt before rewards are computed, so they share the
    group's reward statistics. ``k = num_generations`` replaces every rollout (SFT)."""

    def __init__(self, experts_per_group: int, num_generations: int):
        self.k = experts_per_group
        self.num_generations = num_generations
        # every rollout is replaced (SFT): the trainer skips generation altogether
        self.replaces_all = experts_per_group >= num_generations

    def positions(self, trainer, n_local: int) -> list[int]:
        """Slot within its group of each local row (from the global row index)."""
        start = trainer.accelerator.process_index * n_local
        return [(start + i) % self.num_generations for i in range(n_local)]

    def rewrite_completions(self, trainer, inputs, completion_ids, logprobs):
        n_local = len(completion_ids)
        sources = torch.full((n_local,), ON_POLICY, dtype=torch.long)
        completion_ids = list(completion_ids)
        for i, slot in enumerate(self.positions(trainer, n_local)):
            experts = inputs[i].get("expert") or []
            j = slot - (self.num_generations - self.k)
            if j < 0 or not experts:
                continue
            completion_ids[i] = _expert_ids(trainer, experts[j % len(experts)])
            if logprobs is not None:
                logprobs[i] = [None] * len(completion_ids[i])  # behaviour probability unknown
            sources[i] = EXPERT
        trainer._mixrl_global_sources = trainer.accelerator.gather(sources.to(trainer.accelerator.device))
        return completion_ids, logprobs

    def after_scoring(self, trainer, inputs, out):
        return out


class AuxRowsMixer:
    """CHORD: after scoring, append ``rows_per_process`` expert rows, drawn from the expert
    pool (prompts with an expert completion) with a seeded generator; advantage 0."""

    def __init__(self, pool: list[dict], rows_per_process: int, seed: int):
        self.pool = pool
        self.rows_per_process = rows_per_process
        self.seed = seed

    def rewrite_completions(self, trainer, inputs, completion_ids, logprobs):
        return completion_ids, logprobs

    def sample(self, trainer) -> list[tuple[Any, str]]:
        rng = random.Random(hash((self.seed, trainer.accelerator.process_index, trainer.state.global_step, trainer._step)))
        picks = []
        for _ in range(self.rows_per_process):
            row = self.pool[rng.randrange(len(self.pool))]
            picks.append((row["prompt"], row["expert"][rng.randrange(len(row["expert"]))]))
        return picks

    def after_scoring(self, trainer, inputs, out):
        if self.rows_per_process == 0:
            return out
        picks = self.sample(trainer)
        prompt_ids, _, _ = trainer._tokenize_prompts([p for p, _ in picks])
        completion_ids = [_expert_ids(trainer, text) for _, text in picks]
        return append_rows(out, prompt_ids, completion_ids, pad_id=trainer.processing_class.pad_token_id)


def _pad(rows: list[list[int]] | list[torch.Tensor], value, side: str, width: int, dtype, device) -> torch.Tensor:
    out = torch.full((len(rows), width), value, dtype=dtype, device=device)
    for i, r in enumerate(rows):
        r = torch.as_tensor(r, dtype=dtype, device=device)
        if side == "left":
            out[i, width - len(r) :] = r
        else:
            out[i, : len(r)] = r
    return out


def append_rows(out: dict, prompt_ids: list[list[int]], completion_ids: list[list[int]], *, pad_id: int) -> dict:
    """Append expert rows (advantage 0, ``row_source = EXPERT``) to a scored batch,
    re-padding prompts on the left and completions on the right. Per-token tensors the
    objective does not read for expert rows (old/ref/sampling log-probs) are padded with 0."""
    dev = out["prompt_ids"].device
    e = len(prompt_ids)
    p_old, c_old = out["prompt_ids"].shape[1], out["completion_ids"].shape[1]
    p_w = max(p_old, max(len(p) for p in prompt_ids))
    c_w = max(c_old, max(len(c) for c in completion_ids))

    def left(t, value):
        return torch.nn.functional.pad(t, (p_w - t.shape[1], 0), value=value)

    def right(t, value):
        return torch.nn.functional.pad(t, (0, c_w - t.shape[1]), value=value)

    new = dict(out)
    new["prompt_ids"] = torch.cat([left(out["prompt_ids"], pad_id), _pad(prompt_ids, pad_id, "left", p_w, out["prompt_ids"].dtype, dev)])
    new["prompt_mask"] = torch.cat([left(out["prompt_mask"], 0), _pad([[1] * len(p) for p in prompt_ids], 0, "left", p_w, out["prompt_mask"].dtype, dev)])
    new["completion_ids"] = torch.cat([right(out["completion_ids"], pad_id), _pad(completion_ids, pad_id, "right", c_w, out["completion_ids"].dtype, dev)])
    new["completion_mask"] = torch.cat([right(out["completion_mask"], 0), _pad([[1] * len(c) for c in completion_ids], 0, "right", c_w, out["completion_mask"].dtype, dev)])
    for key in ("old_per_token_logps", "ref_per_token_logps", "sampling_per_token_logps", "importance_sampling_ratio", "tool_mask"):
        if key in out and out[key] is not None and out[key].dim() == 2:
            fill = 1.0 if key in ("importance_sampling_ratio", "tool_mask") else 0.0
            new[key] = torch.cat([right(out[key], fill), torch.full((e, c_w), fill, dtype=out[key].dtype, device=dev)])
    new["advantages"] = torch.cat([out["advantages"], torch.zeros(e, dtype=out["advantages"].dtype, device=dev)])
    new["row_source"] = torch.cat([out["row_source"], torch.full((e,), EXPERT, dtype=torch.long, device=dev)])
    return new


# --------------------------------------------------------------------------- build
def _has_expert(row) -> bool:
    return bool(row.get("expert"))


def apply_missing_policy(cfg: DictConfig, train_ds):
    """Rows without an expert completion: keep (on-policy only), drop, or fail."""
    if "expert" not in train_ds.column_names:
        raise DataError(
            f"offpolicy={cfg.offpolicy.name} needs expert completions but the training data has none; "
            "set data.expert_column=<column with expert solutions> (or offpolicy.dataset)"
        )
    missing = sum(1 for e in train_ds["expert"] if not e)
    if missing == 0:
        return train_ds
    policy = cfg.offpolicy.missing
    if policy == "error":
        raise DataError(
            f"{missing} of {len(train_ds)} training prompts have no expert completion; "
            "set offpolicy.missing=skip to drop them or on_policy to train them on rollouts only"
        )
    if policy == "skip":
        kept = train_ds.filter(_has_expert)
        if len(kept) == 0:
            raise DataError("no training prompt has an expert completion; check data.expert_column")
        return kept
    return train_ds  # on_policy: those prompts get rollouts only


def _expert_pool(cfg: DictConfig, train_ds) -> list[dict]:
    if cfg.offpolicy.dataset:
        from mixrl.data.loading import load_dataset_rows

        ds = load_dataset_rows(
            cfg.offpolicy.dataset, prompt_column=cfg.data.prompt_column, answer_column=None,
            expert_column=cfg.offpolicy.column or cfg.data.expert_column, system_prompt=cfg.data.system_prompt,
            config_prefix="offpolicy",
        )
    else:
        ds = train_ds
    pool = [{"prompt": r["prompt"], "expert": r["expert"]} for r in ds if r.get("expert")]
    if not pool:
        raise DataError("the expert pool is empty: no row has an expert completion; check data.expert_column / offpolicy.dataset")
    return pool


def build_mixer(cfg: DictConfig, train_ds, geom: Geometry):
    """The mixer for ``cfg.algo.mix.mode`` and the training dataset it needs."""
    mode = cfg.algo.mix.get("mode", "none")
    if mode == "none":
        return None, train_ds
    if mode in ("group_inject", "sft"):
        if mode == "sft":  # SFT trains on expert rows only: prompts without one are dropped
            cfg.offpolicy.missing = "skip"
        train_ds = apply_missing_policy(cfg, train_ds)
        k = geom.num_generations if mode == "sft" else int(cfg.algo.mix.get("experts_per_group", 1))
        return GroupInjectMixer(k, geom.num_generations), train_ds
    if mode == "aux_loss":
        if "expert" not in train_ds.column_names and not cfg.offpolicy.dataset:
            apply_missing_policy(cfg, train_ds)  # raises the one-line error
        pool = _expert_pool(cfg, train_ds)
        return AuxRowsMixer(pool, geom.expert_rows_per_process, int(cfg.seed)), train_ds
    raise ValueError(f"unknown mix mode {mode!r}")  # rules.py rejects it before this point
