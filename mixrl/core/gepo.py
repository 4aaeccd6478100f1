"""GEPO: Group Equivalent Preference Optimization, a DPO-form loss between a group of preferred
completions and a group of rejected ones, plus a penalty on the spread of the preferred group's
implicit rewards (a term).

"On-Policy Optimization with Group Equivalent Preference for Multi-Programming Language
Understanding" (OORL / GEPO, Wu et al., arXiv 2505.12723), section 3.2: for a prompt x with a
group of winners Y_w (n functionally equivalent answers) and a group of losers Y_l (m inequivalent
ones), with the implicit reward r(x, y) = beta log(pi_theta(y|x) / pi_ref(y|x)), GEPO compares the
mean reward of Y_w with the mean reward of Y_l through DPO's sigmoid and adds a Lagrangian penalty
lambda on the variance of the winners' rewards (the equivalence of the winners), lambda = 1.
OORL trains it beside on-policy RL with weights w_rl = 1, w_gepo = 0.01 (section 3.3). The
paper's equations did not survive the text extraction read here (only their description did) and
no code was published; the reading below is mixrl's:

    L_set = -log sigmoid(mean_{Y_w} r - mean_{Y_l} r) + lambda Var_{Y_w}(r),   r = beta (s(y) - s_ref(y))

with s the sequence log-prob and Var the population variance (1/n) of the winners' rewards.

The sets sit on the rows of the batch; the per-row fields (written by the ``gepo_sets``
injection, :mod:`mixrl.sources.gepo`) are ``pair_set`` (the row's set, -1: none), ``pair_set_side``
(1 winner, 0 loser), and the set's sums over the policy-now values of Delta(y) = s(y) - s_ref(y)
when it was formed: ``pair_set_w_sum`` (winners), ``pair_set_l_sum`` (losers), ``pair_set_w_sq``
(winners' squares), and the counts ``pair_set_n``, ``pair_set_m``. Each row recomputes its set's loss
with its own Delta live and the others' recorded (as the pair terms of :mod:`mixrl.core.preference`
carry the partner): the rows' gradients add up to the set's exact gradient on the first
optimisation pass. Row j's value is ``G L_j - (G - 1) sg(L_j)`` (G = n + m), spread over its tokens:
with ``seq-mean-token-sum`` over the rollouts the objective is the mean over prompts of L_set, a
prompt with no set contributing 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mixrl.core.terms import TERMS, TermInputs, TermOutput

#: per-row fields the gepo term reads
SET_FIELDS = ("pair_set", "pair_set_side", "pair_set_w_sum", "pair_set_l_sum", "pair_set_w_sq", "pair_set_n", "pair_set_m")


def gepo_set_loss(winners: torch.Tensor, losers: torch.Tensor, *, beta: float, lam: float) -> torch.Tensor:
    """L_set of one set from its rows' Delta = s - s_ref (the formula of the module docstring)."""
    rw, rl = beta * winners, beta * losers
    return -F.logsigmoid(rw.mean() - rl.mean()) + lam * rw.var(unbiased=False)


@TERMS.register("gepo", bounds={
    "beta": ("> 0", "the inverse temperature of the implicit reward beta log(pi/pi_ref); beta <= 0 inverts or removes the preference"),
    "lam": (">= 0", "the weight of the winners' variance; lam < 0 would push equivalent answers apart"),
})
def gepo(x: TermInputs, *, beta: float = 0.1, lam: float = 1.0) -> TermOutput:
    """GEPO's group preference: DPO's sigmoid on the mean implicit rewards of the winners and of the
    losers of a prompt, plus lambda times the variance of the winners' implicit rewards, per set.

    Formula: L = -log sigmoid(mean_w r - mean_l r) + {lam} Var_w(r), r(y) = {beta} (s(y) - s_ref(y)), Var the population variance; winners and losers as the gepo_sets injection forms them
    Paper: OORL / GEPO, "On-Policy Optimization with Group Equivalent Preference for Multi-Programming Language Understanding"
    (arXiv 2505.12723), section 3.2 (lambda = 1); the paper's sets are equivalent vs inequivalent compiler IRs of a
    source program, here the rollouts of a prompt the run's reward calls right vs wrong.

    Parameters:
        beta (0.1): inverse temperature of the implicit reward (DPO's; the paper does not give it).
        lam (1.0): weight of the winners' variance (the paper's lambda).
    """
    rows = x.rows or {}
    if not bool(x.mask.any()):
        return TermOutput(x.logp * 0.0)
    missing = [k for k in SET_FIELDS if k not in rows]
    if missing:
        raise ValueError(f"the gepo term needs the per-row fields {', '.join(missing)}, which algo.inject=gepo_sets writes")
    if x.ref_logp is None:
        raise ValueError("the gepo term needs reference log-probs (ref_logp)")
    dt, dev = x.logp.dtype, x.mask.device
    m = x.mask.to(dt)
    delta = (x.logp * m).sum(-1) - (x.ref_logp.detach() * m).sum(-1)
    moved = delta - delta.detach()  # 0 in value; carries the row's own gradient
    f = {k: rows[k].to(dev) for k in SET_FIELDS}
    active = x.mask.any(-1) & (f["pair_set"] >= 0)
    win = active & (f["pair_set_side"] == 1)
    lose = active & (f["pair_set_side"] == 0)
    n, k = f["pair_set_n"].to(dt).clamp(min=1.0), f["pair_set_m"].to(dt).clamp(min=1.0)
    w_sum = f["pair_set_w_sum"].to(dt) + torch.where(win, moved, torch.zeros_like(moved))
    l_sum = f["pair_set_l_sum"].to(dt) + torch.where(lose, moved, torch.zeros_like(moved))
    w_sq = f["pair_set_w_sq"].to(dt) + torch.where(win, delta ** 2 - delta.detach() ** 2, torch.zeros_like(moved))
    mean_w, mean_l = w_sum / n, l_sum / k
    var_w = (w_sq / n - mean_w ** 2) * beta ** 2
    h = beta * (mean_w - mean_l)
    row = torch.where(active, -F.logsigmoid(h) + lam * var_w, torch.zeros_like(h))
    size = f["pair_set_n"].to(dt) + f["pair_set_m"].to(dt)
    row = size * row - (size - 1.0) * row.detach()
    per_token = m * (torch.where(active, row, torch.zeros_like(row)) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    metrics = {}
    if bool(win.any()):
        metrics = {"gepo/margin": float(h.detach()[win].mean()), "gepo/winner_var": float(var_w.detach()[win].mean())}
    return TermOutput(per_token, metrics)


gepo.needs = ("ref_logp",)
gepo.row_loss = True
