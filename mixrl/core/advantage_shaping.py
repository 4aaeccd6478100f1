"""Advantage shaping: one post-advantage stage that re-weights each row's advantage (``algo.shaping``).

The advantage estimator (:mod:`mixrl.core.advantages`) gives every row of the global batch an
advantage ``A_i`` from the rewards; a shaping then maps it to ``A'_i`` from what is known about the
row once it is scored: the sign of ``A_i``, its reward and its group's rewards, the policy's
log-probs of its completion at rollout time (its confidence), the reference model's (the
sequence log-ratio), the policy's log-probs of its prompt (the prompt's perplexity), the lengths.

Signature of every registered shaping::

    fn(advantages [N], *, rewards [N], group_ids [N], include=None, <runtime inputs it needs>, <params>) -> Tensor [N]

The result is detached: a shaping changes the weight each row's policy-gradient term gets, never
the gradient's form (the loss's gradient w.r.t. the policy's log-probs is ``-A'_i`` per token).
The runtime inputs a shaping reads are listed in its ``needs`` attribute; the trainer
(:mod:`mixrl.trainer.parts.advantage_shaping`) computes only those:

=====================  ==========================================================================
``token_logp``          [N, T] the policy's per-token log-probs of each completion at rollout time
``ref_logp``            [N, T] the reference model's per-token log-probs of each completion
``mask``                [N, T] the completion tokens (1) and padding (0)
``prompt_logp``         [N, P] the policy's log-prob of each prompt token given the ones before it
``prompt_mask``         [N, P] the prompt tokens that are predicted (1), padding and the first token (0)
``primary_rewards``     [N] the first reward function's reward (the task's; DGPO's difficulty)
``lengths``             [N] completion tokens per row
``row_values``          [N] each row's value of a data column (``column``: a per-problem weight)
``token_entropy``       [N, T] the policy's next-token entropy at each completion position (rollout time)
``tool_position``       [N] index of each completion's first tool-result token (-1: no tool call; ASPO)
=====================  ==========================================================================

``include`` (bool [N]) marks the rows that count in group statistics, as for the estimators.
Which rows are shaped at all is the trainer's business (``algo.shaping.offpolicy``: rows the
policy sampled only, or every row, off-policy ones included); the others keep ``A_i``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from mixrl.core.registry import Registry

#: the runtime inputs (not config parameters) a shaping may read; see the module docstring
SHAPING_INPUTS = ("token_logp", "ref_logp", "mask", "prompt_logp", "prompt_mask", "primary_rewards", "lengths", "row_values",
                  "token_entropy", "tool_position")
SHAPINGS = Registry("advantage shaping", runtime=("rewards", "group_ids", "include", *SHAPING_INPUTS))
#: ``psr_nsr``'s modes (the authors' ``advantage`` setting)
PSR_NSR_MODES = ("positive", "negative", "weighted")
#: ``ace``'s gates on the confidence shift
ACE_GATES = ("softplus", "relu")


@runtime_checkable
class WritesFields(Protocol):
    """A shaping whose term reads row fields computed from the same inputs (CalibRL's expert baseline):
    ``fields(runtime, *, rewards, group_ids, sources, params) -> {name: Tensor [N, ...]}``, the global
    rows' fields the trainer writes into its batch (:mod:`mixrl.trainer.parts.advantage_shaping`)."""

    fields: Callable[..., dict]


def shaping_needs(fn) -> tuple[str, ...]:
    """The runtime inputs (of :data:`SHAPING_INPUTS`) a shaping reads: its ``needs`` attribute."""
    return tuple(getattr(fn, "needs", ()))


def shaping_fields(fn) -> Callable[..., dict] | None:
    """The row fields a shaping writes (:class:`WritesFields`), or None."""
    return fn.fields if isinstance(fn, WritesFields) else None


def _float(x: Tensor) -> Tensor:
    x = x.detach()
    return x if torch.is_floating_point(x) else x.float()


def _group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    _, inv = torch.unique(group_ids, return_inverse=True)
    return inv, (int(inv.max()) + 1 if inv.numel() else 0)


def _group_sum(x: Tensor, inv: Tensor, n: int) -> Tensor:
    """Per-row sum of ``x`` over the row's group."""
    return torch.zeros(n, dtype=x.dtype, device=x.device).index_add(0, inv, x)[inv]


def sequence_log_ratio(token_logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    """``c_i = log pi(y_i|x) - log pi_ref(y_i|x) = sum_t (log pi - log pi_ref)`` over the completion's tokens."""
    m = mask.to(token_logp.dtype)
    return ((_float(token_logp) - _float(ref_logp)) * m).sum(-1)


def low_probability_confidence(token_logp: Tensor, mask: Tensor, fraction: float) -> Tensor:
    """Mean log-prob of the ``ceil(fraction * L_i)`` least likely tokens of each row (at least one;
    0 for a row without tokens)."""
    lp, m = _float(token_logp), mask.bool()
    big = torch.finfo(lp.dtype).max
    ordered = torch.where(m, lp, torch.full_like(lp, big)).sort(dim=-1).values
    lengths = m.sum(-1)
    k = torch.clamp(torch.ceil(lengths.to(lp.dtype) * fraction), min=1.0).long()
    k = torch.minimum(k, lengths.clamp(min=1))
    keep = torch.arange(lp.shape[-1], device=lp.device).unsqueeze(0) < k.unsqueeze(1)
    keep = keep & (lengths > 0).unsqueeze(1)
    total = torch.where(keep, ordered, torch.zeros_like(ordered)).sum(-1)
    return total / k.to(lp.dtype)


def mean_log_prob(logp: Tensor, mask: Tensor) -> Tensor:
    """Mean log-prob over the masked tokens of each row (0 without any): minus the log-perplexity."""
    m = mask.to(logp.dtype if torch.is_floating_point(logp) else torch.float32)
    return (_float(logp) * m).sum(-1) / m.sum(-1).clamp(min=1.0)


@SHAPINGS.register("none")
def none(advantages: Tensor, *, rewards: Tensor | None = None, group_ids: Tensor | None = None,
         include: Tensor | None = None) -> Tensor:
    """No shaping: ``A' = A``.

    Formula: ``A'_i = A_i``

    Paper: none (the estimator's advantage as it is).

    Parameters:
        (none)
    """
    return _float(advantages)


@SHAPINGS.register("sign_weight", bounds={
    "positive": (">= 0", "a negative coefficient inverts the gradient of the rows with A > 0"),
    "negative": (">= 0", "a negative coefficient inverts the gradient of the rows with A < 0"),
})
def sign_weight(advantages: Tensor, *, rewards: Tensor | None = None, group_ids: Tensor | None = None,
                include: Tensor | None = None, positive: float = 1.0, negative: float = 1.0,
                success: float | None = None, success_advantage: float | None = None) -> Tensor:
    """Separate coefficients for positive and negative advantages: ``A' = positive A`` (A >= 0), ``negative A`` (A < 0).

    The PSR / NSR decomposition of the policy gradient ("The Surprising Effectiveness of Negative
    Reinforcement in LLM Reasoning", arXiv 2506.01347): ``negative: 0`` keeps only the rows with a
    positive advantage (the non-positive-advantage row filter: a row with ``A <= 0`` then adds no
    gradient), ``positive: 0`` only the negative ones. With ``success`` and ``success_advantage`` set,
    a row whose reward is at least ``success`` gets ``A' = success_advantage`` whatever its A: on
    top of the ``dr_grpo`` advantage, ``positive: 3, negative: 1, success: 1, success_advantage: 1``
    is R3L's Positive Amplification (the ``positive_amplified`` estimator, tested equal).

    Formula: ``A'_i = {positive} A_i`` if A_i >= 0, ``{negative} A_i`` if A_i < 0; a row with R_i >= {success|(unset: no such row)} gets A'_i = {success_advantage|(unset)}

    Paper: "The Surprising Effectiveness of Negative Reinforcement in LLM Reasoning" (arXiv
    2506.01347), PSR / NSR; R3L (arXiv 2601.03715), Positive Amplification.

    Parameters:
        positive (1.0): coefficient on non-negative advantages.
        negative (1.0): coefficient on negative advantages.
        success (None): a row whose reward is at least this gets success_advantage (None: no such rule).
        success_advantage (None): the advantage of such a row.
    """
    a = _float(advantages)
    out = torch.where(a >= 0, a * positive, a * negative)
    if success is not None and success_advantage is not None:
        if rewards is None:
            raise ValueError("sign_weight with success needs the rewards (the trainer passes them)")
        out = torch.where(_float(rewards).to(out.device) >= success, torch.full_like(out, float(success_advantage)), out)
    return out


@SHAPINGS.register("psr_nsr", bounds={
    "positive_weight": (">= 0", "lambda weighs the correct rows' reinforcement; below 0 it would push them down"),
})
def psr_nsr(advantages: Tensor, *, rewards: Tensor, group_ids: Tensor | None = None, include: Tensor | None = None,
            mode: str = "weighted", positive_weight: float = 0.1) -> Tensor:
    """PSR / NSR / W-REINFORCE: REINFORCE on the raw 0/1 reward, correct rows weighted by lambda, incorrect rows -1.

    Replaces the estimator's advantage (REINFORCE without a baseline, as the authors'
    ``compute_psr_nsr_outcome_advantage``, TianHongZXY/RLVR-Decomposed @
    a5d4e7c1df6016ebd7396bd6db83d885120adb6d, ``verl/trainer/ppo/core_algos.py`` lines 111-151):
    ``positive`` (PSR) ``A = R``; ``negative`` (NSR) ``A = R - 1``; ``weighted`` (W-REINFORCE)
    ``A = lambda R`` for a correct row (R = 1), ``R - 1`` for an incorrect one (R = 0), R for any
    other reward (the authors' code leaves it). The authors' recommended lambda is 0.1.

    Formula: mode={mode}: positive: ``A'_i = R_i``; negative: ``A'_i = R_i - 1``; weighted: ``A'_i = {positive_weight} R_i`` if R_i = 1, ``R_i - 1`` if R_i = 0, ``R_i`` otherwise

    Paper: "The Surprising Effectiveness of Negative Reinforcement in LLM Reasoning" (arXiv 2506.01347).

    Parameters:
        mode (weighted): positive (PSR) | negative (NSR) | weighted (W-REINFORCE).
        positive_weight (0.1): lambda, the weight of correct rows in weighted mode.
    """
    if mode not in PSR_NSR_MODES:
        raise ValueError(f"psr_nsr mode must be one of {', '.join(PSR_NSR_MODES)}, got {mode!r}")
    r = _float(rewards).to(advantages.device)
    if mode == "positive":
        return r.clone()
    if mode == "negative":
        return r - 1.0
    correct, incorrect = r == 1.0, r == 0.0
    return torch.where(correct, r * positive_weight, torch.where(incorrect, r - 1.0, r))


psr_nsr.needs = ()


@SHAPINGS.register("ace", bounds={
    "alpha": (">= 0", "a negative alpha would shrink, then invert, the penalty of confident errors"),
})
def ace(advantages: Tensor, *, rewards: Tensor | None = None, group_ids: Tensor | None = None,
        include: Tensor | None = None, token_logp: Tensor | None = None, ref_logp: Tensor | None = None,
        mask: Tensor | None = None, alpha: float = 1.0, gate: str = "softplus") -> Tensor:
    """ACE: negative advantages scaled up by the softplus of the row's confidence shift ``c_i = log pi(y|x) / pi_ref(y|x)``.

    An error the policy has grown more confident in than the reference (c_i > 0) is penalised
    harder; an exploratory error (c_i << 0) keeps about its advantage. Positive advantages are
    unchanged. ``c_i`` is the sum over the completion's tokens of ``log pi - log pi_ref``, pi the
    policy at rollout time. The paper's summaries fix the pieces (c_i, a softplus, applied to the
    negative advantages only, softplus preferred to ReLU); the exact form ``A (1 + alpha
    softplus(c))`` and the default alpha = 1 are mixrl's reading: no code of the authors was found.

    Formula: ``A'_i = A_i (1 + {alpha} g(c_i))`` if A_i < 0, else A_i; c_i = sum_t (log pi_old - log pi_ref)(y_i,t); g = {gate}

    Paper: ACE, "Overconfident Errors Need Stronger Correction: Asymmetric Confidence Penalties
    for Reinforcement Learning" (arXiv 2602.21420).

    Parameters:
        alpha (1.0): strength of the confidence penalty.
        gate (softplus): softplus | relu, the gate on c_i.
    """
    if token_logp is None or ref_logp is None or mask is None:
        raise ValueError("ace needs the rollouts' and the reference model's log-probs (the trainer passes them)")
    if gate not in ACE_GATES:
        raise ValueError(f"ace gate must be one of {', '.join(ACE_GATES)}, got {gate!r}")
    a = _float(advantages)
    c = sequence_log_ratio(token_logp, ref_logp, mask).to(a.device)
    g = torch.nn.functional.softplus(c) if gate == "softplus" else torch.relu(c)
    return torch.where(a < 0, a * (1.0 + alpha * g), a)


ace.needs = ("token_logp", "ref_logp", "mask")


@SHAPINGS.register("arm", bounds={
    "alpha": (">= 0", "a negative alpha would favour the over-confident answers ARM damps"),
    "low_fraction": ("(0, 1]", "the share of an answer's tokens its confidence is taken over"),
})
def arm(advantages: Tensor, *, rewards: Tensor, group_ids: Tensor, include: Tensor | None = None,
        token_logp: Tensor | None = None, mask: Tensor | None = None, prompt_logp: Tensor | None = None,
        prompt_mask: Tensor | None = None, alpha: float = 0.1, low_fraction: float = 0.2) -> Tensor:
    """ProGRPO's ARM: ``A' = A + alpha (c(q) - c(o|q))`` in groups with a reward, c the prompt's and the answer's confidence.

    ``c(q)``: the mean log-prob of the prompt's tokens under the policy (minus its log-perplexity);
    ``c(o|q)``: the mean log-prob of the answer's least likely ``low_fraction`` of tokens
    (T_low, about 20% in the paper). An answer the policy is more confident in than in its prompt
    gets a smaller advantage, an under-explored one a larger; a group whose rewards sum to 0 keeps
    its advantages. The case split and the shift come from the paper; the exact definitions of the
    two confidences and the default alpha are mixrl's reading of its summary (no code of the
    authors was found).

    Formula: ``A'_i = A_i + {alpha} (c(q_i) - c(o_i|q_i))`` if sum_{j in g} R_j != 0, else A_i; c(q) = mean_t log pi(q_t|q_<t); c(o|q) = mean log pi over the {low_fraction} least likely tokens of o

    Paper: ProGRPO, "Back to Basics: Revisiting Exploration in Reinforcement Learning for LLM
    Reasoning via Generative Probabilities" (arXiv 2602.05281).

    Parameters:
        alpha (0.1): weight of the confidence gap.
        low_fraction (0.2): share of the answer's tokens (the least likely) its confidence is taken over.
    """
    if token_logp is None or mask is None or prompt_logp is None or prompt_mask is None:
        raise ValueError("arm needs the rollouts' and the prompts' log-probs (the trainer passes them)")
    a = _float(advantages)
    r = _float(rewards).to(a.device)
    inv, n = _group_index(group_ids.to(a.device))
    rewarded = _group_sum(r, inv, n) != 0
    c_q = mean_log_prob(prompt_logp, prompt_mask).to(a.device)
    c_o = low_probability_confidence(token_logp, mask, low_fraction).to(a.device)
    return torch.where(rewarded, a + alpha * (c_q - c_o), a)


arm.needs = ("token_logp", "mask", "prompt_logp", "prompt_mask")


@SHAPINGS.register("dgpo", bounds={
    "temperature": ("> 0", "the softmax over the groups' accuracies divides by it"),
    "eps": ("> 0", "G A / (sum |A| + eps) divides by zero for a group of equal rewards when eps = 0"),
})
def dgpo(advantages: Tensor, *, rewards: Tensor, group_ids: Tensor, include: Tensor | None = None,
         primary_rewards: Tensor | None = None, lengths: Tensor | None = None, temperature: float = 2.0,
         eps: float = 1e-4, question_weight: bool = True, token_balance: bool = True) -> Tensor:
    """DGPO (MathForge): group advantages normalised by their mean absolute deviation, harder questions weighted up.

    1. Difficulty-balanced group advantage: ``A'_i = G A_i / (sum_{j in g} |A_j| + eps)``, G the
       group's rows; on the ``dr_grpo`` advantage (``R - mean_g``) this is the authors'
       ``num_generations * advantages / (advantages_extent + 1e-4)``; it does not depend on a
       per-group scale, so on ``grpo``'s advantage it is the same up to eps.
    2. Difficulty-aware question weighting (DQW, ``question_weight``): the groups whose rewards
       are not all equal (K of them) get ``K softmax_g(-acc_g / T)``, acc_g the mean of the first
       reward function's rewards (an all-wrong group counts as accuracy 1, as the authors'),
       the others 1.
    3. ``token_balance``: times ``sum of all rows' tokens / sum of the tokens of the rows in groups
       whose rewards are not all equal`` (the authors' ``zero_mask_ratio``), so a token-mean over the
       batch is one over the groups that carry a signal.

    As the authors' ``enable_dgpo`` / ``enable_dgpo_dqw`` (AMAP-ML/MathForge @
    83edda024759f052a4a715eb2c2e553fb9da25ca, ``trl-0.20.0/trl/trainer/grpo_trainer.py`` lines
    1680-1745, temperature 2.0 in every ``scripts_mathforge/*/run_dgpo.sh``); their per-process
    ``global_balancing_ratio`` is a data-parallel rescale that mixrl's global normalisers already do.

    Formula: ``A'_i = G A_i / (sum_{j in g} |A_j| + {eps})`` x (question_weight={question_weight}) K softmax_g(-acc_g / {temperature}) x (token_balance={token_balance}) L_all / L_informative

    Paper: MathForge, "Harder Is Better: Boosting Mathematical Reasoning via Difficulty-Aware GRPO
    and Multi-Aspect Question Reformulation" (arXiv 2601.20614).

    Parameters:
        temperature (2.0): T of the question weights' softmax.
        eps (1e-4): added to the group's sum of |A|.
        question_weight (True): weight groups by difficulty (DQW).
        token_balance (True): rescale by all tokens / tokens of informative groups.
    """
    a = _float(advantages)
    r = _float(rewards).to(a.device)
    inv, n = _group_index(group_ids.to(a.device))
    size = _group_sum(torch.ones_like(a), inv, n)
    out = size * a / (_group_sum(a.abs(), inv, n) + eps)
    zeros = torch.zeros(n, dtype=r.dtype, device=r.device)
    hi = zeros.scatter_reduce(0, inv, r, "amax", include_self=False)
    lo = zeros.scatter_reduce(0, inv, r, "amin", include_self=False)
    informative = hi > lo  # [groups]: rewards not all equal
    if question_weight and bool(informative.any()):
        p = _float(primary_rewards).to(a.device) if primary_rewards is not None else r
        acc = zeros.index_add(0, inv, p) / zeros.index_add(0, inv, torch.ones_like(p))
        acc = torch.where(acc == 0, torch.ones_like(acc), acc)
        w = torch.ones_like(acc)
        w[informative] = int(informative.sum()) * torch.softmax(-acc[informative] / temperature, dim=0)
        out = out * w[inv]
    if token_balance and bool(informative.any()):
        if lengths is None:
            raise ValueError("dgpo with token_balance needs the completion lengths (the trainer passes them)")
        length = _float(lengths).to(a.device)
        out = out * (length.sum() / length[informative[inv]].sum().clamp(min=1.0))
    return out


dgpo.needs = ("primary_rewards", "lengths")


@SHAPINGS.register("row_weight")
def row_weight(advantages: Tensor, *, rewards: Tensor | None = None, group_ids: Tensor | None = None,
               include: Tensor | None = None, row_values: Tensor | None = None, column: str = "rate") -> Tensor:
    """A per-problem weight from the data: ``A' = w A``, w the row's value of the data column ``column``.

    GUI-G1's difficulty-aware scaling: each training sample carries a weight (the authors' ``rate``
    column, precomputed in their data from the target box's size: smaller boxes are harder) that
    multiplies the row's loss (Yuqi-Zhou/GUI-G1 @ e581fe98fe902d7903207686351d6d30c2ca4acd,
    ``src/open-r1-multimodal/src/open_r1/trainer/grpo_trainer.py`` line 739, ``(per_token_loss *
    completion_mask).sum(dim=1) * rates / 64``; the ``/ 64`` is the ``seq-mean-token-sum-norm``
    aggregation). How their ``rate`` is computed is data preparation, not in their code; a weight
    below 0 would invert the row's gradient and is refused at run time.

    Formula: ``A'_i = w_i A_i``, w_i = the row's {column} column

    Paper: GUI-G1, "GUI-G1: Understanding R1-Zero-Like Training for Visual Grounding in GUI Agents"
    (arXiv 2505.15810).

    Parameters:
        column (rate): the data column holding each problem's weight (>= 0).
    """
    if row_values is None:
        raise ValueError(f"row_weight needs each row's {column!r} value (the trainer passes it)")
    w = _float(row_values).to(advantages.device)
    if bool((w < 0).any()) or not bool(torch.isfinite(w).all()):
        raise ValueError(f"row_weight: the {column!r} column holds a negative or non-finite weight; a weight must be >= 0")
    return _float(advantages) * w


row_weight.needs = ("row_values",)
