"""Appending preference pairs to a scored batch: the sides, their reference log-probs and the links.

Every pair injection (:mod:`mixrl.sources.pairs`, :mod:`mixrl.sources.pair_builders`) describes each
pair as two :class:`Side` s (chosen first) and calls :func:`append_sides`, which appends them as rows
(in no group, advantage 0) with the per-row fields the pair terms read (:mod:`mixrl.core.preference`):
``pair_index``, ``pair_side`` (1 chosen, 0 rejected), the partner's sequence log-prob under the policy
now and under the reference model, its length, and the sides' rewards ``pair_reward`` /
``pair_partner_reward`` (NaN where no reward is known: an off-policy side nobody scored).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mixrl.core import provenance as prov
from mixrl.sources.base import InjectContext
from mixrl.sources.rows import append_rows


@dataclass
class Side:
    """One side of a pair: token ids, provenance code, and what is already known of it (None: not known)."""

    prompt: list[int]
    completion: list[int]
    code: int
    behaviour: list[float] | None = None  # log-probs of the policy that sampled it (a rollout's own)
    ref: list[float] | None = None  # reference log-probs already computed (a rollout's, by TRL)
    reward: float = math.nan  # the run's reward of this completion, when it was scored


def _finite_list(t: torch.Tensor | None) -> list[float] | None:
    return t.tolist() if t is not None and bool(torch.isfinite(t).all()) else None


def row_side(out: dict, i: int, code: int) -> Side:
    """Side from row ``i`` of the scored batch: its tokens, its behaviour (TRL's old log-probs) and
    reference log-probs where TRL computed them, its reward (``mixrl_reward``)."""
    pm, cm = out["prompt_mask"][i].bool(), out["completion_mask"][i].bool()
    old, ref = out.get("old_per_token_logps"), out.get("ref_per_token_logps")
    reward = float(out["mixrl_reward"][i]) if "mixrl_reward" in out else math.nan
    return Side(prompt=out["prompt_ids"][i][pm].tolist(), completion=out["completion_ids"][i][cm].tolist(), code=code,
                behaviour=_finite_list(old[i][cm]) if old is not None else None,
                ref=_finite_list(ref[i][cm]) if ref is not None else None, reward=reward)


def append_sides(ctx: InjectContext, out: dict, sides: list[Side]) -> dict:
    """Append pairs (``sides[2k]`` chosen, ``sides[2k + 1]`` rejected) with their links. Behaviour
    log-probs: a rollout side's own, else (``behaviour: stored`` provenances) the policy now, which
    sampled it; NaN for sides of unknown behaviour. Reference log-probs: known ones, the reference
    model's for the rest."""
    assert len(sides) % 2 == 0, "pairs come as (chosen, rejected) sides"
    prompts, completions = [s.prompt for s in sides], [s.completion for s in sides]
    policy = ctx.behaviour_logps(prompts, completions)  # the policy now: what trains on these rows this step
    if ctx.ref_logps is None:
        raise RuntimeError("preference pairs need reference log-probs, but the trainer computes none (TRL's beta is 0)")
    todo = [k for k, s in enumerate(sides) if s.ref is None]
    scored = ctx.ref_logps([prompts[k] for k in todo], [completions[k] for k in todo]) if todo else []
    ref = [s.ref for s in sides]
    for k, lp in zip(todo, scored):
        ref[k] = list(lp)
    stored = {prov.code(n) for n in prov.provenance_names() if prov.provenance(n).behaviour == "stored"}
    behaviour = [s.behaviour if s.behaviour is not None else (list(policy[k]) if s.code in stored else None)
                 for k, s in enumerate(sides)]
    n_old = out["prompt_ids"].shape[0]
    new = append_rows(
        out, prompts, completions, pad_id=ctx.tokenizer.pad_token_id,
        row_source=torch.tensor([s.code for s in sides], dtype=torch.long),
        behaviour_logp=[b if b is not None else [float("nan")] * len(c) for b, c in zip(behaviour, completions)],
    )
    dev = new["prompt_ids"].device
    e, width = len(sides), new["completion_ids"].shape[1]
    ref_t = torch.full((e, width), float("nan"), dtype=torch.float32, device=dev)
    for k, lp in enumerate(ref):
        ref_t[k, : len(lp)] = torch.as_tensor(lp, dtype=torch.float32, device=dev)
    if new.get("ref_per_token_logps") is not None:
        new["ref_per_token_logps"][n_old:] = ref_t.to(new["ref_per_token_logps"].dtype)
    else:
        new["ref_per_token_logps"] = torch.cat([torch.full((n_old, width), float("nan"), device=dev), ref_t])
    seq = [float(sum(lp)) for lp in policy]
    seq_ref = [float(sum(lp)) for lp in ref]
    partner = [k + 1 if k % 2 == 0 else k - 1 for k in range(e)]
    fields = {
        "pair_index": (torch.long, -1, [k // 2 for k in range(e)]),
        "pair_side": (torch.long, -1, [1 - k % 2 for k in range(e)]),
        "pair_partner_logp": (torch.float32, float("nan"), [seq[j] for j in partner]),
        "pair_partner_ref_logp": (torch.float32, float("nan"), [seq_ref[j] for j in partner]),
        "pair_partner_len": (torch.float32, float("nan"), [float(len(completions[j])) for j in partner]),
        "pair_reward": (torch.float32, float("nan"), [sides[k].reward for k in range(e)]),
        "pair_partner_reward": (torch.float32, float("nan"), [sides[j].reward for j in partner]),
    }
    for key, (dtype, fill, values) in fields.items():
        head = out[key] if key in out else torch.full((n_old,), fill, dtype=dtype, device=dev)
        new[key] = torch.cat([head.to(dev), torch.tensor(values, dtype=dtype, device=dev)])
    return new
