"""GEPO's sets on the rollouts: the winners and losers of each prompt's group, and the sums the
``gepo`` term (:mod:`mixrl.core.gepo`) recomputes each set's loss from.

The paper ("On-Policy Optimization with Group Equivalent Preference for Multi-Programming
Language Understanding", arXiv 2505.12723) draws its sets from a static dataset: the compiler IRs
of a source program at several optimisation levels (equivalent, the winners) and mutated ones
(inequivalent, the losers). Here a set is a prompt's group of rollouts, split by the run's reward:
winners reach ``win_at``, losers do not; a group with no winner or no loser forms no set. The
rows stay where they are (nothing is appended): the injection writes the per-row set fields.
"""

from __future__ import annotations

import torch

from mixrl.errors import ConfigError
from mixrl.sources.base import INJECTIONS, InjectContext, Injection
from mixrl.sources.pair_builders import local_groups


@INJECTIONS.register("gepo_sets")
class GepoSets(Injection):
    """GEPO's sets: in each prompt's group of rollouts, the rollouts whose run reward reaches
    ``win_at`` are the winners (equivalent answers), the others the losers; groups with both form
    a set, and every rollout of it gets the set fields the gepo term reads.

    Formula: Y_w = {y_i : R(y_i) >= {win_at}}, Y_l = {y_i : R(y_i) < {win_at}} over a group {y_1..y_G ~ pi_old(.|x)}, a set iff both are non-empty; per row: Delta(y) = s(y) - s_ref(y) under the policy now, summed over Y_w, Y_l (and squared over Y_w)
    Paper: OORL / GEPO, "On-Policy Optimization with Group Equivalent Preference for Multi-Programming Language Understanding"
    (arXiv 2505.12723): groups of equivalent (winner) and inequivalent (loser) compiler IRs from a static dataset;
    here the prompt's rollouts, split by the run's reward.

    Parameters:
        win_at (1.0): the run's reward at which a rollout is a winner (1: correct, on 0/1 rewards).
    """

    needs_source = False
    provenances = ()

    def __init__(self, *, win_at: float = 1.0, source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        self.win_at = float(win_at)
        self.metrics: dict[str, float] = {}

    def after_advantages(self, ctx: InjectContext, inputs: list[dict], out: dict) -> dict:
        if "mixrl_reward" not in out:
            raise RuntimeError("algo.inject=gepo_sets needs the rollouts' rewards (mixrl_reward)")
        n_rows = out["prompt_ids"].shape[0]
        dev = out["prompt_ids"].device
        fields = {k: torch.full((n_rows,), -1 if k in ("pair_set", "pair_set_side") else 0.0,
                                dtype=torch.long if k in ("pair_set", "pair_set_side") else torch.float32, device=dev)
                  for k in ("pair_set", "pair_set_side", "pair_set_w_sum", "pair_set_l_sum", "pair_set_w_sq", "pair_set_n", "pair_set_m")}
        groups = local_groups(ctx, out)
        reward = out["mixrl_reward"].tolist()
        sets = {g: rows for g, rows in groups.items()
                if any(reward[i] >= self.win_at for i in rows) and any(reward[i] < self.win_at for i in rows)}
        rows = [i for g in sorted(sets) for i in sets[g]]
        if rows:
            delta = self._deltas(ctx, out, rows)
            for s, g in enumerate(sorted(sets)):
                members = sets[g]
                w = [delta[i] for i in members if reward[i] >= self.win_at]
                lo = [delta[i] for i in members if reward[i] < self.win_at]
                for i in members:
                    fields["pair_set"][i] = s
                    fields["pair_set_side"][i] = int(reward[i] >= self.win_at)
                    fields["pair_set_w_sum"][i], fields["pair_set_l_sum"][i] = sum(w), sum(lo)
                    fields["pair_set_w_sq"][i] = sum(d * d for d in w)
                    fields["pair_set_n"][i], fields["pair_set_m"][i] = float(len(w)), float(len(lo))
        self.metrics = {"gepo/sets": float(len(sets)), "gepo/groups": float(len(groups))}
        out.update(fields)
        return out

    @staticmethod
    def _deltas(ctx: InjectContext, out: dict, rows: list[int]) -> dict[int, float]:
        """Delta(y) = s(y) - s_ref(y) of each row, the policy now (one no-grad forward) and the reference
        log-probs TRL computed for the rollouts."""
        ref = out.get("ref_per_token_logps")
        if ref is None:
            raise ConfigError("the gepo term needs reference log-probs, but the trainer computed none for the rollouts")
        prompts = [out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist() for i in rows]
        comps = [out["completion_ids"][i][out["completion_mask"][i].bool()].tolist() for i in rows]
        policy = ctx.behaviour_logps(prompts, comps)
        result = {}
        for i, lp in zip(rows, policy):
            cm = out["completion_mask"][i].bool()
            result[i] = float(sum(lp)) - float(ref[i][cm].float().sum())
        return result
