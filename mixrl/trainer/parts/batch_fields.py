"""The fields mixrl adds to TRL's generation batch, and the batch's own metrics: plain functions.

After TRL generated and scored a batch, :func:`provenance_fields` gives the provenance of
:mod:`mixrl.sources.rows` for the local rows (``row_source``, per-token ``token_source``,
``behaviour_logp``) from the rollouts as the injections left them, and :func:`global_counts` the
global (tokens, rows) of every token population the objective normalises over.
:func:`engine_mismatch_metrics` gives the ``engine/*`` metrics (the mismatch between the
engine's and the trainer's log-probs, :mod:`mixrl.core.engine_mismatch`).
:func:`behaviour_is_policy` and :func:`behaviour_known` tell, per provenance code, whether the
policy sampled a row or token.

The batch's fields, as the TRL hooks and the parts read and write them (one place to look):

=========================  =====================  ===========================================================
field                      written by             what
=========================  =====================  ===========================================================
``row_source``             provenance_fields      [B] provenance code of each row (:mod:`mixrl.core.provenance`)
``token_source``           provenance_fields      [B, T] provenance code of each completion token
``behaviour_logp``         provenance_fields      [B, T] log-probs recorded when a stored row was sampled (NaN: none)
``turn_id``                provenance_fields      [B, T] the policy turn of each token of a multi-turn row (-1: a tool's / environment's)
``tool_mask``              TRL (tools=)           [B, T] 1 the model's tokens, 0 a tool's result (read into ``token_source``)
``old_per_token_logps``    TRL / Forwards         [B, T] behaviour log-probs of the rollouts (lagged, async: the generating weights')
``policy_version``         the trainer            [B] the weights version that sampled each row (-1: no policy did)
``advantages``             the trainer / Critic   [B] or, with the critic, [B, T]
``group_id``               the trainer            [B] the row's group in the global batch
``old_values`` ``returns``  Critic                 [B, T] the critic's values at rollout time and GAE's returns
``critic_mask``            Critic                 [B, T] on-policy completion tokens (the value loss's targets)
``teacher_logp``           Teachers               [B, T] the teacher's log-probs (NaN where none)
``teacher_entropy``        Teachers               [B, T] the teachers' mean entropy (SRPO's weights)
``mixrl_reward`` ...       the trainer            the row's reward, its group's mean and std (what replay stores)
=========================  =====================  ===========================================================

No state: nothing here is a part.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mixrl.core import provenance as prov
from mixrl.core.engine_mismatch import EngineCorrection, mismatch_metrics
from mixrl.core.objective import Objective, population_key
from mixrl.core.turns import turn_ids, written_spans
from mixrl.sources.base import Rollouts


def engine_mismatch_metrics(out: dict, objective: Objective, mode: str) -> dict[str, float]:
    """``engine/*`` metrics (:func:`mixrl.core.engine_mismatch.mismatch_metrics`) of this
    process's generation batch, on the tokens the policy sampled, when the engine reported
    log-probs (vLLM) and TRL computed the trainer's (the correction is enabled)."""
    engine, old = out.get("sampling_per_token_logps"), out.get("old_per_token_logps")
    if engine is None or old is None:
        return {}
    c = objective.engine_correction or EngineCorrection()
    sampled = out["completion_mask"].bool() & behaviour_is_policy(out["token_source"])
    return dict(mismatch_metrics(old, engine, sampled, mode=c.mode, c_min=c.c_min, c_max=c.c_max))


def guided_rows(rollouts: Rollouts | None, n_local: int, device, gather: Callable) -> torch.Tensor:
    """Per global row: 0 free rollout, 1 continued from a prefix, 2 generated with a hint."""
    local = rollouts.guided if rollouts is not None and len(rollouts.guided) == n_local else [0] * n_local
    return gather(torch.tensor(local, dtype=torch.long, device=device))


def provenance_fields(out: dict, rollouts: Rollouts | None, turn_marks: tuple[int, list[int]] | None = None) -> dict[str, torch.Tensor]:
    """``row_source``, ``token_source``, ``behaviour_logp`` and ``turn_id`` of the local rows,
    from the rollouts as the injections left them (all on-policy when nothing was injected).

    A row TRL generated with tools (``out["tool_mask"]``, 0 on a tool's result) keeps its
    tool tokens in the sequence with provenance ``environment``, which no term selects; a row an
    injection wrote carries its own per-token provenance (an expert trajectory's tool results
    are ``environment`` too: with ``turn_marks`` = (end-of-turn id, assistant-header ids), a row no
    policy sampled is read by :func:`mixrl.core.turns.written_spans`). ``turn_id`` numbers the
    policy's turns (:func:`mixrl.core.turns.turn_ids`)."""
    ids = out["completion_ids"]
    n, width = ids.shape
    if rollouts is None or len(rollouts.row_source) != n:
        rollouts = Rollouts([[]] * n, None, [prov.ON_POLICY] * n)
    row_source = torch.tensor(rollouts.row_source, dtype=torch.long, device=ids.device)
    token_source = row_source.unsqueeze(1).expand(n, width).clone()
    behaviour = torch.full((n, width), float("nan"), dtype=torch.float32, device=ids.device)
    tool_mask = out.get("tool_mask")
    tool_mask = None if tool_mask is None else tool_mask[:, :width].to(ids.device).bool()
    for i in range(n):
        if rollouts.token_source[i] is not None:
            t = torch.as_tensor(rollouts.token_source[i][:width], dtype=torch.long, device=ids.device)
            token_source[i, : len(t)] = t
        elif turn_marks is not None and int(row_source[i]) != prov.ON_POLICY:  # an expert's multi-turn trajectory
            length = int(out["completion_mask"][i].sum())
            written = written_spans(ids[i, :length].tolist(), *turn_marks)
            token_source[i, :length] = token_source[i, :length].masked_fill(
                torch.tensor(written, dtype=torch.bool, device=ids.device), prov.ENVIRONMENT)
        elif tool_mask is not None:  # TRL's tool loop: the row as generated (an injected row carries its own)
            token_source[i] = token_source[i].masked_fill(~tool_mask[i], prov.ENVIRONMENT)
        if rollouts.behaviour_logp[i] is not None:
            b = torch.as_tensor(rollouts.behaviour_logp[i][:width], dtype=torch.float32, device=ids.device)
            behaviour[i, : len(b)] = b
    fields = {"row_source": row_source, "token_source": token_source, "behaviour_logp": behaviour}
    if tool_mask is not None or bool((token_source == prov.ENVIRONMENT).any()):
        fields["turn_id"] = turn_ids((token_source != prov.ENVIRONMENT) & (token_source != prov.PATCHED))  # an injected turn is not the policy's
    return fields


def global_counts(out: dict, objective: Objective, *, reduce_sum: Callable, num_processes: int) -> dict[str, tuple[float, float, float]]:
    """Effective (tokens, rows with a trainable token, all rows) of each token population the
    objective normalises over (all rows: with a position of the population, trainable or not;
    what ``count_empty_rows`` divides by).

    DDP averages gradients over W processes and each process adds up its
    gradient-accumulation micro-batches, so dividing local sums by N_global / W makes the
    step's gradient that of the global mean, whatever W and the accumulation are.

    Formula: N_pop = (sum over processes of the population's tokens) / W, likewise rows.
    """
    mask = out["completion_mask"].bool()
    stats = []
    pops = objective.populations()
    for pop in pops:
        member = prov.select(out["token_source"], pop)
        m = (mask & member).float()
        stats += [m.sum(), (m.sum(-1) > 0).float().sum(), member.any(-1).float().sum()]
    totals = reduce_sum(torch.stack(stats))
    t = (totals / float(num_processes)).tolist()
    return {population_key(p): (t[3 * i], t[3 * i + 1], t[3 * i + 2]) for i, p in enumerate(pops)}


def behaviour_known(token_source: torch.Tensor) -> torch.Tensor:
    """Tokens some policy sampled (behaviour ``policy`` or ``stored``), not written ones."""
    codes = [prov.code(n) for n in prov.provenance_names() if prov.provenance(n).behaviour != "unknown"]
    return torch.isin(token_source, torch.tensor(codes, dtype=token_source.dtype, device=token_source.device))


def behaviour_is_policy(row_source: torch.Tensor) -> torch.Tensor:
    """Rows whose provenance was sampled by the policy (they form the groups' statistics)."""
    policy_codes = [prov.code(n) for n in prov.provenance_names() if prov.provenance(n).behaviour == "policy"]
    return torch.isin(row_source, torch.tensor(policy_codes, dtype=row_source.dtype, device=row_source.device))


def assistant_turn_marks(tokenizer) -> tuple[int, list[int]]:
    """(end-of-turn id, the ids that open an assistant turn) of ``tokenizer``'s chat template:
    what :func:`mixrl.core.turns.written_spans` reads an expert's multi-turn trajectory with.
    The header is what the generation prompt adds after a closed user turn."""
    msgs = [{"role": "user", "content": "x"}]
    closed = tokenizer.apply_chat_template(msgs, tokenize=True, add_generation_prompt=False, return_dict=False)
    opened = tokenizer.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, return_dict=False)
    eos = tokenizer.eos_token_id
    return eos, list(opened[len(closed):]) if list(opened[: len(closed)]) == list(closed) else list(opened[-3:])
