"""Routing rollouts by their verdict: SRPO's correct -> GRPO, failed -> self-distillation.

The module registers the ``failed`` provenance (a rollout of the policy whose reward marks it
failed: behaviour ``policy``, so a ratio on it is against ``pi_old`` like any rollout) and the
``route_by_outcome`` injection that relabels such rollouts' tokens after the advantages. Terms
then pick their rows by provenance: ``policy`` on ``on_policy`` (the correct rollouts, which
keep their group advantage) and ``srpo_distill`` on ``failed``. The module name sorts after
every other source module, so ``failed`` is registered last and no existing provenance code
changes.
"""

from __future__ import annotations

import torch

from mixrl.core import provenance as prov
from mixrl.sources.base import INJECTIONS, InjectContext, Injection

FAILED = prov.register_provenance(
    "failed", behaviour="policy",
    description="a rollout whose reward marks it failed (SRPO routes it to self-distillation); sampled by the policy",
).code


@INJECTIONS.register("route_by_outcome")
class RouteByOutcome(Injection):
    """SRPO's routing: after the advantages, the tokens of every rollout whose first reward is
    below ``threshold`` become ``failed``; correct rollouts stay ``on_policy``. The group
    advantages are computed before, over every rollout of the group.

    Formula: y_i -> on_policy if R_1(y_i) >= {threshold} else failed (R_1 the first reward function)
    Paper: SRPO, "Unifying Group-Relative and Self-Distillation Policy Optimization via Sample Routing".

    Parameters:
        threshold (1.0): a rollout whose first reward is below it has failed.
    """

    needs_source = False
    provenances = ("failed",)

    def __init__(self, *, threshold: float = 1.0, source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        self.threshold = float(threshold)

    def after_advantages(self, ctx: InjectContext, inputs: list[dict], out: dict) -> dict:
        n = out["completion_ids"].shape[0]
        start = ctx.process_index * n
        primary = ctx.primary_rewards[start : start + n].to(out["row_source"].device)
        failed = (out["row_source"] == prov.ON_POLICY) & ~(primary >= self.threshold - 1e-6)
        ts = out["token_source"]
        out["token_source"] = torch.where(failed.unsqueeze(1) & (ts == prov.ON_POLICY), torch.full_like(ts, FAILED), ts)
        if ctx.log is not None:
            ctx.log("srpo/failed_rows", float(ctx.gather(failed.float().sum().reshape(1)).sum()))
        return out
