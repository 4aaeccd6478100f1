"""Loss aggregation: per-token loss [B, T] -> scalar.

Signature of every registered aggregation::

    fn(per_token_loss, mask, *, max_len=None, count_empty_rows=False, num_items=None) -> scalar Tensor

``num_items`` is an optional *global* normaliser: the global token count for
``token-mean``; the global count of rows for the ``seq-mean-*`` modes. With it,
summing the aggregated losses of gradient-accumulation micro-batches (or DDP ranks)
gives exactly the full-batch value and gradient. Without it, the local count of this
call is used. Empty masks give 0 with the graph connected (no NaN). Positions with mask 0
never contribute, even if the loss there is NaN/inf.

Fully masked rows (no trainable token: all padding, or a truncated completion under
``trainer.mask_truncated_completions``) in the ``seq-mean-*`` modes: by default they count for
nothing, as in verl's ``agg_loss`` (``seq_mask = (sum(loss_mask, -1) > 0)``); with
``count_empty_rows: true`` they count in the row mean with loss 0, as TRL's ``loss_type`` grpo,
sapo (``.mean()`` over the micro-batch's rows), dr_grpo (``/ (B * max_completion_length)``) and
verl's ``geo_mean`` (``torch.mean`` over rows) do. The two differ by the factor
(rows) / (non-empty rows).
"""

from __future__ import annotations

import torch
from torch import Tensor

from mixrl.core._tensor import bool_mask, zero_masked
from mixrl.core.registry import Registry

AGGREGATIONS = Registry("aggregation", runtime=("num_items",))


def _denominator(local: Tensor, num_items: float | None) -> Tensor:
    if num_items is not None:
        if num_items <= 0:
            # nothing anywhere: keep 0 instead of dividing by zero
            return torch.ones_like(local)
        return torch.as_tensor(float(num_items), dtype=local.dtype, device=local.device)
    return local.clamp(min=1.0)


def _row_stats(per_token_loss: Tensor, mask: Tensor, count_empty_rows: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """(row sums, row token counts, local row count): the rows with a token, or every row
    of the call with ``count_empty_rows``."""
    m = bool_mask(mask)
    loss = zero_masked(per_token_loss, m)
    tokens = m.sum(-1).to(per_token_loss.dtype)
    rows = torch.ones_like(tokens) if count_empty_rows else (tokens > 0).to(per_token_loss.dtype)
    return loss.sum(-1), tokens, rows.sum()



@AGGREGATIONS.register("token-mean", bounds={"max_len": (">= 1", "a length in tokens")})
def token_mean(
    per_token_loss: Tensor,
    mask: Tensor,
    *,
    max_len: int | None = None,
    num_items: float | None = None,
) -> Tensor:
    """Token mean: ``sum_{b,t} m L / N_tokens`` (every token weighs the same).

    Formula: ``L = sum over tokens of l_t / N``, N = the population's tokens in the step

    ``N`` = ``num_items`` (global token count) if given, else the tokens in this call.

    Paper: "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (token-level
    loss); CHORD's RL term.

    Parameters:
        max_len (None): unused here.
        num_items (None): global token count.
    """
    m = bool_mask(mask)
    total = zero_masked(per_token_loss, m).sum()
    return total / _denominator(m.sum().to(per_token_loss.dtype), num_items)


@AGGREGATIONS.register("seq-mean-token-mean", bounds={"max_len": (">= 1", "a length in tokens")})
def seq_mean_token_mean(
    per_token_loss: Tensor,
    mask: Tensor,
    *,
    max_len: int | None = None,
    count_empty_rows: bool = False,
    num_items: float | None = None,
) -> Tensor:
    """Sequence mean of per-row token means: ``(1/N_rows) sum_b (sum_t m L / |y_b|)``.

    Formula: ``L = (1 / N) sum_b (sum_t l_t / |y_b|)``, N = the population's rows in the step (rows with no trainable token counted: {count_empty_rows})

    ``N`` = ``num_items`` (the global row count) if given, else the rows in this call; a row
    with no trainable token adds 0 to the sum and counts in N only with ``count_empty_rows``.

    Paper: GRPO's original objective ("DeepSeekMath: Pushing the Limits of Mathematical
    Reasoning in Open Language Models"); "Group Sequence Policy Optimization".

    Parameters:
        max_len (None): unused here.
        count_empty_rows (False): count rows with no trainable token in N (with loss 0), as TRL's loss_type grpo and sapo; false leaves them out, as verl.
        num_items (None): global row count (of the rows N counts).
    """
    row_sum, tokens, rows = _row_stats(per_token_loss, mask, count_empty_rows)
    row_mean = row_sum / tokens.clamp(min=1.0)
    return row_mean.sum() / _denominator(rows, num_items)


@AGGREGATIONS.register("seq-mean-token-sum", bounds={"max_len": (">= 1", "a length in tokens")})
def seq_mean_token_sum(
    per_token_loss: Tensor,
    mask: Tensor,
    *,
    max_len: int | None = None,
    count_empty_rows: bool = False,
    num_items: float | None = None,
) -> Tensor:
    """Sequence mean of per-row token sums: ``(1/N_rows) sum_b sum_t m L``.

    Formula: ``L = (1 / N) sum_b sum_t l_t``, N = the population's rows in the step (rows with no trainable token counted: {count_empty_rows})

    ``N`` as in ``seq-mean-token-mean``.

    Paper: verl's ``seq-mean-token-sum``; the trajectory log-likelihood sum of "Tapered
    Off-Policy REINFORCE: Stable and efficient reinforcement learning for LLMs".

    Parameters:
        max_len (None): unused here.
        count_empty_rows (False): count rows with no trainable token in N (with loss 0); false leaves them out, as verl.
        num_items (None): global row count (of the rows N counts).
    """
    row_sum, _, rows = _row_stats(per_token_loss, mask, count_empty_rows)
    return row_sum.sum() / _denominator(rows, num_items)


@AGGREGATIONS.register("seq-mean-token-sum-norm", bounds={"max_len": (">= 1", "a length in tokens")})
def seq_mean_token_sum_norm(
    per_token_loss: Tensor,
    mask: Tensor,
    *,
    max_len: int | None = None,
    count_empty_rows: bool = False,
    num_items: float | None = None,
) -> Tensor:
    """Dr.GRPO: token sums divided by a fixed length: ``(1/N_rows) sum_b sum_t m L / max_len``.

    Removes GRPO's per-response length normalisation (no length bias). ``max_len`` should
    be the fixed maximum response length (constant over training); if None, the padded
    width T of this call is used, which varies between micro-batches, so pass it
    explicitly for gradient-accumulation invariance. LUFFY divides by the max length too.
    In a config, a missing ``max_len`` is ``trainer.max_completion_length`` (verl's default:
    its ``loss_scale_factor`` None is the response width, padded to the maximum response
    length). verl divides the batch's token sum by that length only, not also by the number
    of rows as here and in the Dr.GRPO paper: a constant factor (the rows per micro-batch).

    Formula: ``L = (1 / N) sum_b sum_t l_t / {max_len|T}``, N = the population's rows in the step (rows with no trainable token counted: {count_empty_rows}), T (max_len unset) the padded width of each micro-batch

    TRL's ``loss_type=dr_grpo`` divides by ``B * max_completion_length`` with B every row of
    the micro-batch: ``count_empty_rows: true``.

    Paper: Dr.GRPO, "Understanding R1-Zero-Like Training: A Critical Perspective" (Liu et
    al. 2025, arXiv 2503.20783).

    Parameters:
        max_len (None): fixed length normaliser (default: T of this call).
        count_empty_rows (False): count rows with no trainable token in N (with loss 0), as TRL's loss_type dr_grpo; false leaves them out, as verl and LUFFY.
        num_items (None): global row count (of the rows N counts).
    """
    row_sum, _, rows = _row_stats(per_token_loss, mask, count_empty_rows)
    length = float(max_len) if max_len is not None else float(per_token_loss.shape[-1])
    length = max(length, 1.0)
    return (row_sum / length).sum() / _denominator(rows, num_items)


def aggregate(
    per_token_loss: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    *,
    max_len: int | None = None,
    num_items: float | None = None,
    **params,
) -> Tensor:
    """Convenience: ``AGGREGATIONS.get(mode)(per_token_loss, mask, ...)`` (``params``: the
    mode's other parameters, e.g. ``count_empty_rows``)."""
    return AGGREGATIONS.get(mode)(per_token_loss, mask, max_len=max_len, num_items=num_items, **params)
