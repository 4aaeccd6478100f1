"""The fields and per-batch metrics mixrl adds to TRL's generation batch.

After TRL generated and scored a batch, :meth:`BatchFields._add_provenance` writes the
provenance of :mod:`mixrl.sources.rows` for the local rows (``row_source``, per-token
``token_source``, ``behaviour_logp``) from the rollouts as the injections left them, and
:meth:`BatchFields._global_counts` the global (tokens, rows) of every token population the
objective normalises over. The batch's metrics logged here: ``engine/*`` (the mismatch between
the engine's and the trainer's log-probs, :mod:`mixrl.core.engine_mismatch`) and each
injection's own. :func:`behaviour_is_policy` and :func:`behaviour_known` tell, per provenance
code, whether the policy sampled a row or token.

This mixin of :class:`mixrl.trainer.grpo.MixrlGRPOTrainer` reads the trainer's ``objective``,
``accelerator``, ``injections``, ``_mixrl_rollouts`` and ``_metrics``.
"""

from __future__ import annotations

import torch

from mixrl.core import provenance as prov
from mixrl.core.engine_mismatch import EngineCorrection, mismatch_metrics
from mixrl.core.objective import population_key
from mixrl.sources.base import Rollouts


class BatchFields:
    """Provenance fields, normalisers and per-batch metrics of a generation batch (mixin)."""

    def _log_engine_mismatch(self, out: dict, mode: str) -> None:
        """``engine/*`` metrics (:func:`mixrl.core.engine_mismatch.mismatch_metrics`) of this
        process's generation batch, on the tokens the policy sampled, when the engine reported
        log-probs (vLLM) and TRL computed the trainer's (the correction is enabled)."""
        engine, old = out.get("sampling_per_token_logps"), out.get("old_per_token_logps")
        if engine is None or old is None:
            return
        c = self.objective.engine_correction or EngineCorrection()
        sampled = out["completion_mask"].bool() & behaviour_is_policy(out["token_source"])
        for key, value in mismatch_metrics(old, engine, sampled, mode=c.mode, c_min=c.c_min, c_max=c.c_max).items():
            self._metrics[mode][key].append(value)

    def _guided(self, n_local: int, device) -> torch.Tensor:
        """Per global row: 0 free rollout, 1 continued from a prefix, 2 generated with a hint."""
        r = self._mixrl_rollouts
        local = r.guided if r is not None and len(r.guided) == n_local else [0] * n_local
        return self.accelerator.gather(torch.tensor(local, dtype=torch.long, device=device))

    def _log_injection_metrics(self, mode: str) -> None:
        """An injection's ``metrics``: a dict it keeps, or a method returning one."""
        for inj in self.injections:
            metrics = getattr(inj, "metrics", None)
            for key, value in ((metrics() if callable(metrics) else metrics) or {}).items():
                self._metrics[mode][key].append(float(value))

    def _add_provenance(self, out: dict) -> None:
        """``row_source``, ``token_source`` and ``behaviour_logp`` of the local rows, from the
        rollouts as the injections left them (all on-policy when nothing was injected)."""
        ids = out["completion_ids"]
        n, width = ids.shape
        rollouts = self._mixrl_rollouts
        if rollouts is None or len(rollouts.row_source) != n:
            rollouts = Rollouts([[]] * n, None, [prov.ON_POLICY] * n)
        row_source = torch.tensor(rollouts.row_source, dtype=torch.long, device=ids.device)
        token_source = row_source.unsqueeze(1).expand(n, width).clone()
        behaviour = torch.full((n, width), float("nan"), dtype=torch.float32, device=ids.device)
        for i in range(n):
            if rollouts.token_source[i] is not None:
                t = torch.as_tensor(rollouts.token_source[i][:width], dtype=torch.long, device=ids.device)
                token_source[i, : len(t)] = t
            if rollouts.behaviour_logp[i] is not None:
                b = torch.as_tensor(rollouts.behaviour_logp[i][:width], dtype=torch.float32, device=ids.device)
                behaviour[i, : len(b)] = b
        out["row_source"] = row_source
        out["token_source"] = token_source
        out["behaviour_logp"] = behaviour

    def _global_counts(self, out) -> dict[str, tuple[float, float, float]]:
        """Effective (tokens, rows with a trainable token, all rows) of each token population
        the objective normalises over (all rows: with a position of the population, trainable
        or not; what ``count_empty_rows`` divides by).

        DDP averages gradients over W processes and each process adds up its
        gradient-accumulation micro-batches, so dividing local sums by N_global / W makes the
        step's gradient that of the global mean, whatever W and the accumulation are.
        """
        mask = out["completion_mask"].bool()
        stats = []
        pops = self.objective.populations()
        for pop in pops:
            member = prov.select(out["token_source"], pop)
            m = (mask & member).float()
            stats += [m.sum(), (m.sum(-1) > 0).float().sum(), member.any(-1).float().sum()]
        totals = self.accelerator.reduce(torch.stack(stats), reduction="sum")
        t = (totals / float(self.accelerator.num_processes)).tolist()
        return {population_key(p): (t[3 * i], t[3 * i + 1], t[3 * i + 2]) for i, p in enumerate(pops)}


def behaviour_known(token_source: torch.Tensor) -> torch.Tensor:
    """Tokens some policy sampled (behaviour ``policy`` or ``stored``), not written ones."""
    codes = [prov.code(n) for n in prov.provenance_names() if prov.provenance(n).behaviour != "unknown"]
    return torch.isin(token_source, torch.tensor(codes, dtype=token_source.dtype, device=token_source.device))


def behaviour_is_policy(row_source: torch.Tensor) -> torch.Tensor:
    """Rows whose provenance was sampled by the policy (they form the groups' statistics)."""
    policy_codes = [prov.code(n) for n in prov.provenance_names() if prov.provenance(n).behaviour == "policy"]
    return torch.isin(row_source, torch.tensor(policy_codes, dtype=row_source.dtype, device=row_source.device))
