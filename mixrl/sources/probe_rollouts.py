"""Probe rollouts with a policy correction (REX-RAG).

REX-RAG ("REX-RAG: Reasoning Exploration with Policy Correction in Retrieval-Augmented
Generation", arXiv 2508.08149): a rollout that fails is continued from its own reasoning after an
exploratory prompt, a revision sentence drawn from a fixed list ("Perhaps I've overlooked critical
points..."), and the probe joins the group. The probe is trained under the original prompt, so
its tokens were not sampled by pi_old(. | x): the "Policy Correction" replaces the behaviour of
every token by a mixture of the policy and the probe distribution mu, weighted by the share alpha
of probes in the batch.

The authors' code (MiliLab/REX-RAG @ d9dbbb428e39b23b5424c05abbda90c68e2096db) is the reference:

* ``search_r1/llm_agent/generation.py`` lines 659-686: a rollout whose answer is wrong is cloned
  with probability ``revision_prob`` (20% in ``scripts/search-r1-sgl/run_grpo_sglang_fsdp.sh``),
  its final answer turn is deleted (``_delete_contents``, lines 541-562) and one of the revision
  prompts (``search_r1/llm_agent/thinking_prompts.py`` lines 67-98, 30 sentences) is appended;
  the policy continues from there. The revision tokens are trained (``_info_masked_concatenate_with_padding``,
  lines 205-208, keeps them in the loss mask).
* ``verl/workers/actor/exploration_distribution.py`` lines 10-50: ``PrefixIndex``, the
  distribution of the revision prompts' tokens: the share of list prompts continuing a prefix
  with each token.
* ``verl/workers/actor/dp_actor.py`` lines 446-497 (``update_policy``): per token,
  mu = pi_old on the probe's tokens (0 on the original rollouts); on the revision prompt mu = 1
  on its first token and the ``PrefixIndex`` share on the others; before it (the failed reasoning,
  j tokens) mu = pi_old / e^(1/j), e = 1 - batch accuracy (so the prefix's mu is pi_old(prefix) / e,
  the prefix given a failure); behaviour = (1 - alpha) pi_old + alpha mu, alpha = probes / rows
  (``cloned_traj_ratio``, ``verl/trainer/ppo/ray_trainer.py`` line 1536); the PPO ratio is taken
  against it.

Here (differences, also in the preset's header):

* the probes take the last ``probes`` slots of a group (their own rollouts are discarded and
  counted in the rollout budget) instead of joining it: the group size is fixed in this trainer;
  each probe slot continues a failed rollout of the group's other slots (in turn), and a group
  whose other slots all succeed keeps its ordinary rollouts there (the authors clone a failed
  rollout with probability ``revision_prob``); a group split over processes draws its probes' failed
  rollouts from the slots on the probe's own process;
* the failed reasoning kept is the first ``keep`` share of the failed completion's tokens (the
  authors delete the final ``<answer>`` turn of a search episode);
* the original rollouts keep their ratio pi_theta / pi_old; the authors' behaviour (1 - alpha) pi_old
  on them is not applied (it would need the on-policy rows' behaviour rewritten);
* their trajectory filter (``reorder_batch``, ``ray_trainer.py`` lines 614-650: probes kept by
  the mean log-prob of their revision tokens, up to an EWM of the probes' accuracy) is not here;
* the default revision prompts are three sentences of ours in the authors' style; pass theirs
  with ``algo.inject.revisions``.
"""

from __future__ import annotations

import math
import random

import torch

from mixrl.core import provenance as prov
from mixrl.errors import ConfigError
from mixrl.sources.base import INJECTIONS, InjectContext, Injection, Rollouts
from mixrl.sources.prefix import global_rows, solution_ids

PROBE = prov.register_provenance(
    "probe", behaviour="stored",
    description="a probe rollout (REX-RAG): failed reasoning, a revision prompt, the policy's continuation; "
                "trained under the original prompt against the mixed behaviour (1 - alpha) pi_old + alpha mu",
).code

#: revision prompts in the authors' style (their list: thinking_prompts.py lines 67-98)
REVISIONS = (
    " Wait, I may have made a mistake or missed something; let me check again.",
    " Perhaps my reasoning skipped a step or misread the question.",
    " Let me reconsider: something in my work above might be wrong.",
)

#: the kind of each probe token: the failed reasoning kept, the revision prompt, the continuation
FAILED, REVISION, CONTINUATION = 0, 1, 2


def revision_mu(prompts: list[list[int]], ids: list[int]) -> list[float]:
    """mu of each token of the revision prompt ``ids`` (one of ``prompts``): 1 on its first token,
    then the share of the prompts that continue ``ids[:t]`` with ``ids[t]`` among those that
    continue ``ids[:t]`` at all (the authors' ``PrefixIndex``)."""
    out = [1.0]
    for t in range(1, len(ids)):
        longer = [p for p in prompts if len(p) > t and p[:t] == ids[:t]]
        out.append(sum(1 for p in longer if p[t] == ids[t]) / len(longer))
    return out


def probe_behaviour(pi_old: list[float], kinds: list[int], mu_revision: list[float], *, alpha: float, error: float) -> list[float]:
    """log of the corrected behaviour (1 - alpha) pi_old + alpha mu of each probe token.

    ``pi_old``: log-probs of the probe's tokens under the original prompt; ``kinds``: FAILED,
    REVISION, CONTINUATION per token; ``mu_revision``: mu of the revision tokens (:func:`revision_mu`);
    ``error``: 1 - batch success. mu = pi_old / error^(1/j) on the j failed tokens, the prefix
    index on the revision, pi_old on the continuation (whose behaviour is then pi_old itself)."""
    j = kinds.count(FAILED)
    rev = iter(mu_revision)
    out = []
    for lp, kind in zip(pi_old, kinds, strict=True):
        p = math.exp(lp)
        if kind == FAILED:
            mu = p / error ** (1.0 / j)
        elif kind == REVISION:
            mu = next(rev)
        else:
            mu = p
        out.append(math.log((1.0 - alpha) * p + alpha * mu))
    return out


@INJECTIONS.register("probe", bounds={
    "probes": (">= 1", "slots of a group that continue a failed rollout"),
    "keep": ("(0, 1]", "share of the failed completion kept before the revision prompt"),
    "success": ("> 0", "a rollout with first reward below it has failed"),
})
class ProbeRollouts(Injection):
    """REX-RAG's probe rollouts: failed reasoning + a revision prompt, continued by the policy, trained with the policy correction.

    After generation, in each group with a failed rollout among its first G - ``probes`` slots,
    the last ``probes`` slots are generated again: each keeps the first ``keep`` share of a failed
    rollout's tokens, appends a revision prompt drawn from ``revisions``, and the policy continues
    from there. The probe is scored by the run's reward and trained under the original prompt
    (provenance ``probe``) against the behaviour (1 - alpha) pi_old + alpha mu.

    Formula: y_f failed (r < {success}); y_p = y_f[:{keep} |y_f|] + v + c, v ~ U({revisions}), c ~ pi_old(. | x, y_f[:j], v); b_t = (1 - alpha) pi_old(y_t | x, y<t) + alpha mu_t, alpha = probes / rows, mu_t = pi_old / e^(1/j) (t < j, e = 1 - batch success), prefix-index share of v (revision), pi_old (continuation); ratio pi_theta(y_t | x, y<t) / b_t
    Paper: REX-RAG, "REX-RAG: Reasoning Exploration with Policy Correction in Retrieval-Augmented Generation" (arXiv 2508.08149).

    Parameters:
        probes (2): the last slots of each group that continue a failed rollout of the group's other slots.
        keep (1.0): share of the failed completion's tokens kept before the revision prompt (eos dropped).
        revisions (REVISIONS): the exploratory prompts, drawn uniformly per probe; appended as tokens and trained.
        success (1.0): a rollout fails when its first reward function gives less.
    """

    needs_source = False
    may_generate_more = True
    provenances = ("probe",)

    def __init__(self, *, probes: int = 2, keep: float = 1.0, revisions=REVISIONS, success: float = 1.0,
                 source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        revisions = [str(r) for r in (revisions or [])]
        if not revisions or not all(r.strip() for r in revisions):
            raise ConfigError("algo.inject.revisions must list at least one non-empty revision prompt, e.g. "
                              "['Wait, let me check my reasoning again.']")
        self.probes, self.keep, self.revisions, self.success = int(probes), float(keep), revisions, float(success)
        self.metrics: dict[str, float] = {}

    def texts(self) -> list[str]:
        return list(self.revisions)

    def _revision_ids(self, ctx: InjectContext) -> list[list[int]]:
        ids = [solution_ids(ctx, r) for r in self.revisions]
        longest = max(len(i) for i in ids)
        if longest >= ctx.max_completion_length:
            raise ConfigError(f"algo.inject.revisions: the longest revision prompt is {longest} tokens, not less than "
                              f"trainer.max_completion_length={ctx.max_completion_length}; shorten it or raise the completion length")
        return ids

    def _probe_jobs(self, ctx: InjectContext, rollouts: Rollouts, ok: torch.Tensor, rev_ids: list[list[int]]) -> list[tuple]:
        """(row, failed prefix ids, revision index) of every local probe slot to regenerate."""
        n, G = len(rollouts.completion_ids), ctx.num_generations
        if self.probes >= G:
            raise ConfigError(f"algo.inject.probes={self.probes} must be below num_generations={G} (a probe continues a "
                              "failed rollout of the group's other slots); lower it")
        gidx, eos = global_rows(ctx, n), ctx.tokenizer.eos_token_id
        local = {g: i for i, g in enumerate(gidx)}
        jobs = []
        for i in range(n):
            g, slot = divmod(gidx[i], G)
            if slot < G - self.probes or rollouts.row_source[i] != prov.ON_POLICY:
                continue
            failed = [g * G + s for s in range(G - self.probes) if not bool(ok[g * G + s]) and g * G + s in local]
            if not failed:
                continue
            f = local[failed[(slot - (G - self.probes)) % len(failed)]]
            ids = [t for t in rollouts.completion_ids[f] if t not in (eos, ctx.tokenizer.pad_token_id)]
            v = random.Random(f"{self.seed}:{ctx.global_step}:{gidx[i]}").randrange(len(rev_ids))
            room = ctx.max_completion_length - len(rev_ids[v]) - 1  # at least one continuation token
            jobs.append((i, ids[: min(round(self.keep * len(ids)), room)], v))
        return jobs

    def after_generation(self, ctx: InjectContext, inputs: list[dict], rollouts: Rollouts) -> Rollouts:
        rev_ids = self._revision_ids(ctx)
        ok = self._ok(ctx.score(inputs, rollouts.completion_ids))
        jobs = self._probe_jobs(ctx, rollouts, ok, rev_ids)
        gen = [list(rollouts.prompt_ids[i]) + pre + rev_ids[v] for i, pre, v in jobs]
        new_ids, _ = ctx.generate(gen)  # every process calls it, even with no probe
        kinds = []
        for (i, pre, v), cont in zip(jobs, new_ids):
            cont = list(cont)[: ctx.max_completion_length - len(pre) - len(rev_ids[v])]
            rollouts.discarded_tokens.append(len(rollouts.completion_ids[i]))
            rollouts.completion_ids[i] = pre + rev_ids[v] + cont
            kinds.append([FAILED] * len(pre) + [REVISION] * len(rev_ids[v]) + [CONTINUATION] * len(cont))
        dev = ok.device
        n_probes = float(ctx.gather(torch.tensor([len(jobs)], device=dev)).sum())
        alpha = n_probes / max(ok.numel(), 1)
        error = max(1.0 - float(ok.float().mean()), 1e-6) if ok.numel() else 1.0
        rows = [i for i, _, _ in jobs]
        pi_old = ctx.behaviour_logps([list(rollouts.prompt_ids[i]) for i in rows], [rollouts.completion_ids[i] for i in rows])
        for (i, pre, v), k, lp in zip(jobs, kinds, pi_old):
            mu = revision_mu(rev_ids, rev_ids[v])
            rollouts.token_source[i] = [PROBE] * len(k)
            rollouts.behaviour_logp[i] = probe_behaviour(list(lp), k, mu, alpha=alpha, error=error)
            rollouts.guided[i] = 1
            if rollouts.logprobs is not None:  # sampled after the revision prompt: no engine correction against pi_old(. | x)
                rollouts.logprobs[i] = [None] * len(k)
        self._log(ctx, ok, jobs, alpha, error)
        return rollouts

    def _ok(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        return torch.nan_to_num(rewards_per_func[:, 0], nan=0.0) >= self.success - 1e-6

    def _log(self, ctx: InjectContext, ok: torch.Tensor, jobs: list, alpha: float, error: float) -> None:
        """probe/alpha (probes / rows, all processes), probe/first_pass_error (e = 1 - batch success before the probes)."""
        self.metrics = {"probe/alpha": alpha, "probe/first_pass_error": error}
        if ctx.log is not None:
            for k, v in self.metrics.items():
                ctx.log(k, v)
