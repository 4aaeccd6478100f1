"""ILF: several refinements of a failed attempt from language feedback, the best one imitated under the original prompt.

ILF ("Training Language Models with Language Feedback at Scale", arXiv 2303.16755, Imitation
learning from Language Feedback): (1) the LM, conditioned on the input x, an initial output y and
feedback f, writes refinements r_1..r_N; (2) the refinement that incorporates the feedback best is
selected; (3) the LM is fine-tuned to maximise log p(r* | x), the likelihood of the chosen
refinement given the input alone. The steps are applied iteratively.

The authors' code (JeremyAlain/imitation_learning_from_language_feedback @
4dc2094cb8779c5b693663af56ee6e8c5426aee4): ``experiments/generate_refinements.py`` samples 5
refinements per (input, summary, feedback) (``--number_of_generations_per_prompt`` default 5, line
30; temperature 1.0, top_p 0.95, lines 105-106; 48 tokens, line 147) after the instruction "Write an
excellent summary that incorporates the feedback on the given summary and is better than the given
summary." (line 60); ``reward_model/score_refinements.py`` scores every candidate with the reward
model's "Yes" probability and takes ``np.argmax`` (line 198: the first of equal scores); the chosen
refinements are the fine-tuning targets under the post alone (the released finetuning datasets).

Here, on each step: up to ``attempts`` failed on-policy rollouts (first reward below ``success``)
get feedback from a feedback builder (the verifier's message by default; ``self``: the policy's own
critique; ``module:function``: a human's or judge's feedback); the policy writes ``refinements``
refinements of each in the context ``template(x, y, f)`` (the rollouts' generation path and
sampling settings); each is scored by the run's (rule-based) reward against the row, the first
best one is kept (``min_score``: only if it scores at least that), and it is appended as a row of
the ORIGINAL prompt x with provenance ``selected_refinement`` (behaviour unknown: it was sampled
under the feedback context, not under x), for an SFT term (``nll``). Differences: feedback and
refinements come from the policy being trained within the RL step, not from humans and a separate
GPT-3; the scorer is the run's reward, not a reward model trained on comparisons.
"""

from __future__ import annotations

import torch

from mixrl.core import provenance as prov
from mixrl.sources.base import INJECTIONS, InjectContext, Injection, template_text
from mixrl.sources.failed_attempts import feedback_contexts, local_primary, pick_failed, score_written, whole_units
from mixrl.sources.feedback import build_feedback
from mixrl.sources.fission import check_budget, check_context_template
from mixrl.sources.rows import append_rows

SELECTED = prov.register_provenance(
    "selected_refinement", behaviour="unknown",
    description="the best of several refinements the policy wrote from feedback on a failed attempt (ILF), trained under "
                "the ORIGINAL prompt (sampled under the feedback context: no behaviour probability under the prompt)",
).code

#: the refinement context, after ILF's instruction (generate_refinements.py:60), for a solution
TEMPLATE = ("{prompt}\nAttempt: {attempt}\nFeedback: {feedback}\nWrite a solution that incorporates the feedback on "
            "the attempt and is better than it.\nSolution:\n")


def select_best(scores: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per consecutive group of ``n`` candidates: the index of the first highest score, and that score."""
    best, idx = scores.view(-1, n).max(dim=1)  # torch.max: the first maximal index, as np.argmax
    return idx, best


@INJECTIONS.register("select_refinement", bounds={
    "attempts": (">= 1", "failed rollouts refined per step, all processes"),
    "refinements": (">= 1", "refinements written per attempt"),
    "success": ("> 0", "a rollout with first reward below it has failed"),
})
class SelectRefinement(Injection):
    """ILF: the best of several feedback-conditioned refinements of a failed attempt, imitated under the original prompt.

    After the advantages, up to ``attempts`` failed on-policy rollouts per step get feedback
    (``feedback``); the policy writes ``refinements`` refinements of each in the context
    ``template(x, y, f)``; the first with the highest reward is appended as a row of the original
    prompt x (provenance ``selected_refinement``, no behaviour probability, advantage 0) for an SFT term.

    Formula: for failed y of x (r < {success}, at most {attempts} a step): f = {feedback}(x, y); r_k ~ pi_old(. | T(x, y, f)), k = 1..{refinements}; r* = r_(argmax_k R(x, r_k)) (the first best), kept when R(x, r*) >= {min_score} (unset: always); row (x, r*) trained by an SFT term, -log pi(r* | x)
    Paper: ILF, "Training Language Models with Language Feedback at Scale" (arXiv 2303.16755).

    Parameters:
        attempts (8): failed rollouts refined per step, all processes (drawn at random when more failed).
        refinements (5): refinements written per attempt (the authors' 5).
        feedback (verifier): verifier (the answer given and the expected one) | indicative | self (the policy critiques its own attempt) | module:function (Attempt -> Feedback | str | None; a human's or judge's feedback).
        template (TEMPLATE): the refinement context ({prompt}, {attempt}, {feedback}, all three); the default: the prompt, "Attempt:", "Feedback:", ILF's instruction for a solution, "Solution:", one per line.
        success (1.0): a rollout fails when its first reward function gives less.
        min_score (None): keep the selected refinement only when its reward is at least this (null: always, as ILF).
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
    provenances = ("selected_refinement",)

    def __init__(self, *, attempts: int = 8, refinements: int = 5, feedback: str = "verifier", template: str = TEMPLATE,
                 success: float = 1.0, min_score: float | None = None, marker: str = "####", wrong: str | None = None,
                 missing: str | None = None, text: str | None = None, request: str | None = None,
                 critique_tokens: int | None = None, source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        self.template = check_context_template(template, TEMPLATE)
        self.attempts, self.refinements, self.success = int(attempts), int(refinements), float(success)
        self.min_score = None if min_score is None else float(min_score)
        check_budget("attempts", self.attempts, 1, geometry)
        params = {"marker": marker, "wrong": wrong, "missing": missing, "text": text, "request": request,
                  "critique_tokens": critique_tokens}
        self.builder, self.feedback_name = build_feedback(feedback, params), feedback
        self._primary: torch.Tensor | None = None
        self.metrics: dict[str, float] = {}

    def texts(self) -> list[str]:
        own = getattr(self.builder, "texts", None)
        return [template_text(self.template), *(own() if callable(own) else [])]

    def extra_rows_per_step(self, rollouts_per_step: int, unit: int) -> int:
        return self.attempts

    def after_rewards(self, ctx: InjectContext, inputs: list[dict], rewards: torch.Tensor) -> torch.Tensor:
        self._primary = ctx.primary_rewards  # the first reward of every rollout (global rows): which ones failed
        return rewards

    def after_advantages(self, ctx: InjectContext, inputs: list[dict], out: dict) -> dict:
        rewards = local_primary(ctx, self._primary, len(inputs))
        picks = pick_failed(ctx, out, rewards, self.success, self.attempts // ctx.num_processes, self.seed)
        critics = ctx.policy_calls(f"algo.inject.feedback={self.feedback_name!r}")
        jobs = feedback_contexts(ctx, inputs, out, picks, rewards, builder=self.builder, feedback_name=self.feedback_name,
                                 template=self.template, calls=critics)
        critics.sync(ctx.gather, device=ctx.device)  # every process joins the others' self-critiques
        N = self.refinements
        calls = ctx.policy_calls("algo.inject.template (ILF's refinement context)")
        written = calls.write_all([c for _, c in jobs for _ in range(N)], max_new_tokens=ctx.max_completion_length)
        calls.sync(ctx.gather, device=ctx.device)
        scores = score_written(ctx, [inputs[i] for i, _ in jobs for _ in range(N)], written, "algo.inject=select_refinement")
        kept = []  # (row, selected refinement's ids, its score)
        if jobs:
            idx, best = select_best(scores, N)
            kept = [(i, written[j * N + int(idx[j])].ids, float(best[j])) for j, (i, _) in enumerate(jobs)
                    if self.min_score is None or float(best[j]) >= self.min_score]
        unit = self.geometry.grad_accum if self.geometry is not None else 1
        kept = kept[: whole_units(len(kept), 1, unit)]
        self._log(len(picks), scores, kept)
        if not kept:
            return out
        prompts = [out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist() for i, _, _ in kept]
        return append_rows(out, prompts, [ids for _, ids, _ in kept], pad_id=ctx.tokenizer.pad_token_id,
                           row_source=torch.full((len(kept),), SELECTED, dtype=torch.long))

    def _log(self, picked: int, scores: torch.Tensor, kept: list) -> None:
        """ilf/picked (failed rollouts picked), ilf/refinement_reward (mean over all refinements),
        ilf/selected (rows appended), ilf/selected_reward (their mean reward), this process."""
        self.metrics = {"ilf/picked": float(picked), "ilf/selected": float(len(kept))}
        if len(scores):
            self.metrics["ilf/refinement_reward"] = float(scores.mean())
        if kept:
            self.metrics["ilf/selected_reward"] = sum(s for *_, s in kept) / len(kept)
