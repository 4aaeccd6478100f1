"""Per-row and per-token provenance fields of a scored batch, and appending rows to it.

TRL's scored batch (``out``) is a dict of tensors whose first dimension is the row; mixrl
adds, and every injection keeps consistent:

* ``row_source`` [B] long: the row's provenance code (the kind of row);
* ``token_source`` [B, T] long: each completion token's provenance code;
* ``behaviour_logp`` [B, T] float: log-prob recorded when the token was sampled, for
  ``stored`` provenances; NaN where none was recorded (never a silent 0);
* ``sampling_per_token_logps`` [B, T] float (TRL's, when vLLM generates): the log-prob the
  inference engine reported when it sampled each token; NaN where it sampled none (prefix
  tokens, written or appended rows). The engine-mismatch correction reads it
  (:mod:`mixrl.core.engine_mismatch`);
* ``turn_id`` [B, T] long (multi-turn batches only): the policy's (or expert's) turn of each
  token, -1 for a tool's tokens and padding (:func:`mixrl.core.turns.turn_ids`);
* ``group_id`` [B] long: the global index of the row's group; -1 for rows in no group;
* ``teacher_logp`` [B, T] float (optional): a teacher's log-prob of each token, NaN where unknown;
* ``mixrl_reward``, ``mixrl_group_mean``, ``mixrl_group_std`` [B] float: the row's reward and its
  group's reward statistics when it was scored (what a replay buffer stores); NaN for rows in no group.

Because all of them have the row as first dimension, they survive TRL's shuffling,
splitting into micro-batches, gradient accumulation and DDP sharding.
"""

from __future__ import annotations

import torch

from mixrl.core import provenance as prov
from mixrl.core.turns import turn_ids

#: per-token float fields whose unknown value is NaN
NAN_FIELDS = ("behaviour_logp", "teacher_logp", "old_per_token_logps", "ref_per_token_logps", "sampling_per_token_logps")
#: per-token fields appended rows fill with 1 (multiplicative corrections, tool masks)
ONE_FIELDS = ("importance_sampling_ratio", "tool_mask")


def _pad(rows: list[list[int]], value, side: str, width: int, dtype, device) -> torch.Tensor:
    out = torch.full((len(rows), width), value, dtype=dtype, device=device)
    for i, r in enumerate(rows):
        r = torch.as_tensor(r, dtype=dtype, device=device)
        if side == "left":
            out[i, width - len(r):] = r
        else:
            out[i, : len(r)] = r
    return out


def append_rows(
    out: dict,
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    *,
    pad_id: int,
    row_source: torch.Tensor,
    token_source: list[list[int]] | None = None,
    behaviour_logp: list[list[float]] | None = None,
    advantages: torch.Tensor | None = None,
) -> dict:
    """Append rows (in no group; advantage 0 unless given) to a scored batch, re-padding
    prompts on the left and completions on the right. ``token_source`` defaults to the
    row's provenance on every token; per-token log-probs nobody computed for the new rows
    (old, reference, sampling, behaviour, teacher) are NaN."""
    dev = out["prompt_ids"].device
    e = len(prompt_ids)
    p_old, c_old = out["prompt_ids"].shape[1], out["completion_ids"].shape[1]
    p_w = max(p_old, max(len(p) for p in prompt_ids))
    c_w = max(c_old, max(len(c) for c in completion_ids))

    def left(t, value):
        return torch.nn.functional.pad(t, (p_w - t.shape[1], 0), value=value)

    def right(t, value):
        return torch.nn.functional.pad(t, (0, c_w - t.shape[1]), value=value)

    row_source = row_source.to(dev)
    if token_source is None:
        token_source = [[int(row_source[i])] * len(c) for i, c in enumerate(completion_ids)]
    new = dict(out)
    new["prompt_ids"] = torch.cat([left(out["prompt_ids"], pad_id), _pad(prompt_ids, pad_id, "left", p_w, out["prompt_ids"].dtype, dev)])
    new["prompt_mask"] = torch.cat([left(out["prompt_mask"], 0), _pad([[1] * len(p) for p in prompt_ids], 0, "left", p_w, out["prompt_mask"].dtype, dev)])
    new["completion_ids"] = torch.cat([right(out["completion_ids"], pad_id), _pad(completion_ids, pad_id, "right", c_w, out["completion_ids"].dtype, dev)])
    new["completion_mask"] = torch.cat([right(out["completion_mask"], 0), _pad([[1] * len(c) for c in completion_ids], 0, "right", c_w, out["completion_mask"].dtype, dev)])
    new["token_source"] = torch.cat([right(out["token_source"], -1), _pad(token_source, -1, "right", c_w, torch.long, dev)])
    if "turn_id" in out:  # multi-turn batch (env=tools): the new rows' turns from their provenance
        added = new["token_source"][-e:]
        new["turn_id"] = torch.cat([right(out["turn_id"], -1), turn_ids((added >= 0) & (added != prov.ENVIRONMENT))])
    for key in NAN_FIELDS + ONE_FIELDS:
        if key in out and out[key] is not None and out[key].dim() == 2:
            fill = 1.0 if key in ONE_FIELDS else float("nan")
            added = torch.full((e, c_w), fill, dtype=out[key].dtype, device=dev)
            if key == "behaviour_logp" and behaviour_logp is not None:
                added = _pad(behaviour_logp, float("nan"), "right", c_w, out[key].dtype, dev)
            new[key] = torch.cat([right(out[key], fill), added])
    adv = torch.zeros(e, dtype=out["advantages"].dtype, device=dev) if advantages is None else advantages.to(dev)
    new["advantages"] = torch.cat([out["advantages"], adv])
    new["row_source"] = torch.cat([out["row_source"], row_source])
    new["group_id"] = torch.cat([out["group_id"], torch.full((e,), -1, dtype=torch.long, device=dev)])
    n = out["prompt_ids"].shape[0]
    for key, value in out.items():  # any other per-row field: NaN (float) or -1 (integer) for the new rows
        if key not in new or new[key] is not value or not isinstance(value, torch.Tensor) or value.dim() != 1 or len(value) != n:
            continue
        fill = float("nan") if value.is_floating_point() else -1
        new[key] = torch.cat([value, torch.full((e,), fill, dtype=value.dtype, device=dev)])
    return new


def splice_prefixes(
    completion_ids: list[list[int]],
    logprobs: list | None,
    prefixes: list[list[int]],
    *,
    max_len: int,
    prefix_code: int,
    continuation_code: int,
) -> tuple[list[list[int]], list | None, list[list[int] | None]]:
    """Put each row's prefix at the start of its completion.

    The policy generated ``completion_ids[i]`` after ``prompt + prefixes[i]``; the trained
    row is ``prompt`` + ``prefixes[i] + completion_ids[i]``, so a forward of the row sees
    exactly the context each continuation token was sampled in. The spliced completion is
    cut to ``max_len`` tokens (the continuation loses its tail; it then counts as
    truncated). Returns the completions, the per-token sampling log-probs (None on prefix
    tokens: none exists) and each row's per-token provenance codes (``prefix_code`` on the
    prefix, ``continuation_code`` after it; None for a row without a prefix).
    """
    out_ids, out_lp, token_source = [], [] if logprobs is not None else None, []
    for i, (ids, prefix) in enumerate(zip(completion_ids, prefixes, strict=True)):
        prefix = list(prefix)[:max_len]
        cont = list(ids)[: max_len - len(prefix)]
        out_ids.append(prefix + cont)
        if out_lp is not None:
            out_lp.append([None] * len(prefix) + list(logprobs[i])[: len(cont)])
        token_source.append([prefix_code] * len(prefix) + [continuation_code] * len(cont) if prefix else None)
    return out_ids, out_lp, token_source


def replace_rows(
    out: dict,
    rows: list[int],
    completion_ids: list[list[int]],
    *,
    pad_id: int,
    row_source: int,
    behaviour_logp: list[list[float]],
) -> dict:
    """Replace the completions of local ``rows`` of a scored batch **in place** (same prompt,
    same group) by other completions with provenance ``row_source`` and their recorded
    behaviour log-probs; completions are re-padded on the right when one is wider. Per-token
    log-probs nobody computed for them (old, reference, sampling, teacher) become NaN."""
    dev = out["completion_ids"].device
    width = max(out["completion_ids"].shape[1], max(len(c) for c in completion_ids))
    grow = width - out["completion_ids"].shape[1]
    one_fields = set(ONE_FIELDS)
    for key in ("completion_ids", "completion_mask", "token_source", *NAN_FIELDS, *ONE_FIELDS):
        t = out.get(key)
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            continue
        if grow:
            fill = {"completion_ids": pad_id, "completion_mask": 0, "token_source": -1}.get(
                key, 1.0 if key in one_fields else float("nan"))
            t = torch.nn.functional.pad(t, (0, grow), value=fill)
        else:
            t = t.clone()
        for i, c in zip(rows, completion_ids):
            n = len(c)
            if key == "completion_ids":
                t[i] = pad_id
                t[i, :n] = torch.as_tensor(c, dtype=t.dtype, device=dev)
            elif key == "completion_mask":
                t[i] = 0
                t[i, :n] = 1
            elif key == "token_source":
                t[i] = -1
                t[i, :n] = row_source
            elif key in one_fields:
                t[i] = 1.0
            else:
                t[i] = float("nan")
        out[key] = t
    bl = out["behaviour_logp"]
    for i, lp in zip(rows, behaviour_logp):
        bl[i, : len(lp)] = torch.as_tensor(lp, dtype=bl.dtype, device=dev)
    rs = out["row_source"].clone()
    rs[torch.as_tensor(rows, dtype=torch.long, device=dev)] = row_source
    out["row_source"] = rs
    return out
