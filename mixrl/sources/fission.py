"""Fission-GRPO: each failed rollout plus feedback on its error becomes a new training instance.

Fission-GRPO ("Robust Tool Use via Fission-GRPO: Learning to Recover from Execution Errors", arXiv
2601.15625): a failed trajectory tau_err of prompt x is augmented with diagnostic feedback f from an
Error Simulator; the corrective context x_corr = [x; tau_err; f] is a new prompt, from which G'
recovery rollouts tau'_j ~ pi_theta(. | x_corr) are sampled on-policy, rewarded, and given the
group-normalised advantage within their fission group; they train the policy under x_corr (a new
instance with its own prompt, group, reward and advantage, not a row under x).

No code of the authors exists yet: their repository (zxzadm/Fission-GRPO @
a969d2fe9d3b74c2146b568768d1c241d2427295) holds only a README ("the codebase and training data are
currently under internal review"). Read from the paper's abstract and that README; ours:

* the fission instances are appended to the same step's batch, beside the rollouts (the paper
  interleaves the fission update with standard GRPO through a LIFO buffer of corrective contexts);
* at most ``errors`` failed rollouts per step are fissioned (drawn at random when more failed);
* the Error Simulator (a fine-tuned Qwen3-32B that writes non-leaking runtime diagnostics) is a
  feedback builder: the verifier's message (default), the policy's own critique (``feedback:
  self``), or ``module:function`` (a user's simulator); the advantage is GRPO's (r - mean) /
  (std + 1e-6) over the G' recoveries of one context; the reward is the run's (rule-based)
  reward of the recovery against the original row (the paper's time-varying composite tool-call
  reward is a reward option, not part of this injection).
"""

from __future__ import annotations

import torch

from mixrl.core import provenance as prov
from mixrl.errors import ConfigError
from mixrl.sources.base import INJECTIONS, InjectContext, Injection, check_template, template_text
from mixrl.sources.failed_attempts import feedback_contexts, local_primary, pick_failed, score_written, whole_units
from mixrl.sources.feedback import build_feedback
from mixrl.sources.rows import append_rows
from mixrl.sources.with_verification import group_advantages

RECOVERY = prov.register_provenance(
    "recovery", behaviour="stored",
    description="a recovery rollout (Fission-GRPO): sampled by the policy in the context of a failed attempt and feedback "
                "on it, trained under that context as a group of its own (behaviour log-prob recorded when written)",
).code

#: the corrective context x_corr = [x; tau_err; f]
TEMPLATE = "{prompt}\nFailed attempt: {attempt}\nError: {feedback}\nRecovery:\n"
#: the algo.inject keys the feedback builders read
FEEDBACK_KEYS = ("marker", "wrong", "missing", "text", "request", "critique_tokens")


def check_context_template(template: str, default: str) -> str:
    """The corrective context must hold the prompt, the attempt and the feedback (ConfigError otherwise)."""
    check_template(template, ("prompt", "attempt", "feedback"), "algo.inject.template", default)
    missing = [f for f in ("prompt", "attempt", "feedback") if "{" + f + "}" not in template]
    if missing:
        raise ConfigError(f"algo.inject.template must contain {{prompt}}, {{attempt}} and {{feedback}} (it lacks "
                          f"{', '.join('{' + m + '}' for m in missing)}), e.g. {default!r}")
    return template


def check_budget(key: str, count: int, rows_each: int, geometry) -> None:
    """``count`` attempts per step (all processes), ``rows_each`` appended rows each: every process
    gets the same whole number, every micro-batch the same number of rows, and no more attempts than rollouts."""
    if geometry is None:
        return
    W, ga = geometry.world_size, geometry.grad_accum
    if count % W or (count // W * rows_each) % ga:
        raise ConfigError(f"algo.inject.{key}={count} must give every process the same whole number and every micro-batch "
                          f"the same number of appended rows ({W} process(es) x {ga} micro-batch(es), {rows_each} row(s) "
                          f"each); e.g. algo.inject.{key}={W * ga}")
    if count > geometry.rollouts_per_step:
        raise ConfigError(f"algo.inject.{key}={count} is more than the {geometry.rollouts_per_step} rollouts per step; lower it")


@INJECTIONS.register("fission", bounds={
    "errors": (">= 1", "failed rollouts fissioned per step, all processes"),
    "recoveries": (">= 2", "a fission group of one recovery has advantage 0"),
    "success": ("> 0", "a rollout with first reward below it has failed"),
})
class Fission(Injection):
    """Fission-GRPO: a failed rollout plus feedback on its error becomes a new instance with its own group.

    After the advantages, up to ``errors`` failed on-policy rollouts per step (first reward below
    ``success``) each get feedback (``feedback``); the context ``template(x, y_err, f)`` is a new
    prompt from which the policy samples ``recoveries`` recovery rollouts, scored by the run's
    reward against the original row; they are appended as rows of that context (provenance
    ``recovery``, behaviour log-probs recorded) with the GRPO advantage over their group.

    Formula: for failed y_err of x (r < {success}, at most {errors} a step): f = {feedback}(x, y_err); x_corr = T(x, y_err, f); y'_j ~ pi_old(. | x_corr), j = 1..{recoveries}; A_j = (r(y'_j) - mean_j r) / (std_j r + 1e-6); rows (x_corr, y'_j) trained beside the rollouts
    Paper: Fission-GRPO, "Robust Tool Use via Fission-GRPO: Learning to Recover from Execution Errors" (arXiv 2601.15625).

    Parameters:
        errors (8): failed rollouts fissioned per step, all processes (drawn at random when more failed).
        recoveries (8): recovery rollouts sampled per corrective context (the paper's G').
        feedback (verifier): the Error Simulator: verifier (the answer given and the expected one) | indicative | self (the policy critiques its own attempt) | module:function (Attempt -> Feedback | str | None).
        template (TEMPLATE): the corrective context x_corr ({prompt}, {attempt}, {feedback}, all three); the default: the prompt, "Failed attempt:" and the attempt, "Error:" and the feedback, "Recovery:", one per line.
        success (1.0): a rollout fails when its first reward function gives less.
        marker ("####"): verifier feedback: the answer marker.
        wrong (None): verifier feedback for a wrong answer ({given}, {expected}); null: the built-in sentence.
        missing (None): verifier feedback when no answer is found ({expected}); null: the built-in sentence.
        text (None): indicative feedback's sentence; null: the built-in one.
        request (None): self feedback: what the policy is asked ({prompt}, {attempt}, {expected}); null: the built-in request.
        critique_tokens (None): self feedback: the longest critique the policy writes (null: 64 tokens).
    """

    needs_source = False
    appends_rows_after_advantages = True
    may_generate_more = True
    provenances = ("recovery",)

    def __init__(self, *, errors: int = 8, recoveries: int = 8, feedback: str = "verifier", template: str = TEMPLATE,
                 success: float = 1.0, marker: str = "####", wrong: str | None = None, missing: str | None = None,
                 text: str | None = None, request: str | None = None, critique_tokens: int | None = None,
                 source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        self.template = check_context_template(template, TEMPLATE)
        self.errors, self.recoveries, self.success = int(errors), int(recoveries), float(success)
        check_budget("errors", self.errors, self.recoveries, geometry)
        params = {"marker": marker, "wrong": wrong, "missing": missing, "text": text, "request": request,
                  "critique_tokens": critique_tokens}
        self.builder, self.feedback_name = build_feedback(feedback, params), feedback
        self._primary: torch.Tensor | None = None
        self.metrics: dict[str, float] = {}

    def texts(self) -> list[str]:
        own = getattr(self.builder, "texts", None)
        return [template_text(self.template), *(own() if callable(own) else [])]

    def extra_rows_per_step(self, rollouts_per_step: int, unit: int) -> int:
        return self.errors * self.recoveries

    def after_rewards(self, ctx: InjectContext, inputs: list[dict], rewards: torch.Tensor) -> torch.Tensor:
        self._primary = ctx.primary_rewards  # the first reward of every rollout (global rows): which ones failed
        return rewards

    def after_advantages(self, ctx: InjectContext, inputs: list[dict], out: dict) -> dict:
        rewards = local_primary(ctx, self._primary, len(inputs))
        unit = self.geometry.grad_accum if self.geometry is not None else 1
        picks = pick_failed(ctx, out, rewards, self.success, self.errors // ctx.num_processes, self.seed)
        critics = ctx.policy_calls(f"algo.inject.feedback={self.feedback_name!r}")
        jobs = feedback_contexts(ctx, inputs, out, picks, rewards, builder=self.builder, feedback_name=self.feedback_name,
                                 template=self.template, calls=critics)
        critics.sync(ctx.gather, device=ctx.device)  # every process joins the others' self-critiques
        jobs = jobs[: whole_units(len(jobs), self.recoveries, unit)]
        R = self.recoveries
        calls = ctx.policy_calls("algo.inject.template (fission's corrective context)")
        written = calls.write_all([c for _, c in jobs for _ in range(R)], max_new_tokens=ctx.max_completion_length)
        calls.sync(ctx.gather, device=ctx.device)
        r = score_written(ctx, [inputs[i] for i, _ in jobs for _ in range(R)], written, "algo.inject=fission")
        self._log(len(picks), len(jobs), r)
        if not written:
            return out
        return append_rows(out, [w.context_ids for w in written], [w.ids for w in written],
                           pad_id=ctx.tokenizer.pad_token_id,
                           row_source=torch.full((len(written),), RECOVERY, dtype=torch.long),
                           behaviour_logp=[w.behaviour_logp for w in written],
                           advantages=group_advantages(r, R).to(out["advantages"].dtype))

    def _log(self, failed: int, fissioned: int, rewards: torch.Tensor) -> None:
        """fission/picked (failed rollouts picked), fission/instances (fissioned with feedback),
        fission/recovery_reward (mean), fission/recovered (share of recoveries at success), this process."""
        self.metrics = {"fission/picked": float(failed), "fission/instances": float(fissioned)}
        if len(rewards):
            self.metrics.update({"fission/recovery_reward": float(rewards.mean()),
                                 "fission/recovered": float((rewards >= self.success - 1e-6).float().mean())})
