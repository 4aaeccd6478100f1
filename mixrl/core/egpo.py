"""FunRL / EGPO: the advantage plus a clipped bonus from the entropy of the row's reasoning (a shaping).

"Exploring Superior Function Calls via Reinforcement Learning" (FunRL; revised as "Reasoning
through Exploration: A Reinforcement Learning Framework for Robust Function Calling", EGPO; arXiv
2508.05118). What the authors publish fixes the pieces: the GRPO objective on ``A_i + sigma(H_i)``
(the pipeline figure of BingguangHao/RLFC @ 12979259e783019ea77706815194123b1d0ba2d3,
``img/pipeline.png``: ``J = J_GRPO(A_i + sigma(H_i))``), H_i the entropy of the row's
chain-of-thought, the bonus "constrained by a clipping mechanism" so it never turns an advantage's
sign (the abstract of v4). Their repository holds no code (the README says it awaits release).
The clip ``min(alpha H_i, |A_i| / kappa)`` is mixrl's reading, the form of "Reasoning with
Exploration: An Entropy Perspective" (arXiv 2506.14758), which the EGPO description matches
(a detached entropy bonus bounded by a share of |A|).
"""

from __future__ import annotations

import torch
from torch import Tensor

from mixrl.core.advantage_shaping import SHAPINGS, _float, mean_log_prob


@SHAPINGS.register("egpo", bounds={
    "alpha": (">= 0", "a negative alpha would reward low-entropy (collapsed) reasoning"),
    "kappa": ("> 0", "the bonus is capped at |A| / kappa"),
})
def egpo(advantages: Tensor, *, rewards: Tensor | None = None, group_ids: Tensor | None = None,
         include: Tensor | None = None, token_entropy: Tensor | None = None, mask: Tensor | None = None,
         alpha: float = 0.4, kappa: float = 2.0) -> Tensor:
    """FunRL / EGPO: ``A' = A + min(alpha H, |A| / kappa)``, H the mean next-token entropy over the row's completion.

    A row's reasoning that the policy wrote with more uncertainty gets a larger advantage (it is
    explored more), but the bonus never exceeds ``|A| / kappa`` (kappa > 1: a negative advantage
    stays negative, a zero advantage stays zero). H is the policy's mean next-token entropy over
    the completion's tokens at rollout time (one no-grad forward); the paper takes the
    chain-of-thought's, the text before the function call; on a task without a separate reasoning
    span the whole completion stands for it. The clipped form and alpha = 0.4, kappa = 2 (the
    defaults of arXiv 2506.14758) are mixrl's reading: no code of the authors was published.

    Formula: ``A'_i = A_i + min({alpha} H_i, |A_i| / {kappa})``; H_i = mean_t H(pi_old(.|x, y_i,<t)) over the completion

    Paper: FunRL / EGPO, "Exploring Superior Function Calls via Reinforcement Learning" (arXiv
    2508.05118); the clip: "Reasoning with Exploration: An Entropy Perspective" (arXiv 2506.14758).

    Parameters:
        alpha (0.4): weight of the entropy bonus.
        kappa (2.0): the bonus is at most |A| / kappa.
    """
    if token_entropy is None or mask is None:
        raise ValueError("egpo needs the rollouts' next-token entropies (the trainer passes them)")
    a = _float(advantages)
    h = mean_log_prob(token_entropy, mask).to(a.device)  # the masked mean (of entropies here)
    bonus = torch.minimum(alpha * h, a.abs() / kappa)
    return a + bonus


egpo.needs = ("token_entropy", "mask")
