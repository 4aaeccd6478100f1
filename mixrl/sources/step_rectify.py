"""``algo.inject.name=step_rectify``: SCOPE's step-wise rectification of a failed rollout.

"Recycling Failures: Salvaging Exploration in RLVR via Fine-Grained Off-Policy Guidance" (SCOPE,
arXiv 2602.24110): a process reward model locates the first wrong step of a suboptimal rollout; the
correct prefix (the policy's own tokens) is kept, the wrong step is rectified off-policy, and the
trajectory goes on from there. The row that is trained mixes provenances:

* the kept prefix ``y_<k``: ``on_policy`` (sampled by the policy, under the same context as in the row);
* the rectified step ``c``: ``rectified`` (written, behaviour unknown: no ratio may be taken on it);
* the continuation ``z ~ pi_old(. | x, y_<k, c)``: ``on_policy`` again (a forward of the row sees exactly
  the context it was sampled in).

The row replaces the failed rollout in its slot before the rewards are computed, so it is scored by the
run's reward and shares its group's advantage. The step scorer is ``reward=process``'s
(:func:`mixrl.rewards.process.process_reward`: ``reference``, ``judge`` or ``model``, with the same
``separator``); the rectified step is the reference solution's step at the same place (the data's worked
solution, the expert column).

No code of the authors was found (searched: the code and issues corpora, GitHub repositories named
SCOPE; szu-tera/SCOPE is another method). Our reading of the abstract: which failed rollouts are
rectified (``per_group``, the first failing slots of a group), the corrector (the reference's step; the
paper's teacher is not named in what is readable here) and the terms that train each part (the preset).
"""

from __future__ import annotations

import torch

from mixrl.core import provenance as prov
from mixrl.core.process_rewards import first_wrong_step, step_spans, token_char_ends
from mixrl.errors import ConfigError
from mixrl.rewards.process import STEP_SCORERS, process_reward
from mixrl.sources.base import INJECTIONS, InjectContext, Injection, Rollouts, check_template, template_text

RECTIFIED = prov.register_provenance(
    "rectified", behaviour="unknown",
    description="a step written in place of a rollout's first wrong step (SCOPE; written, no behaviour probability)",
).code


CORRECTORS = ("reference", "self")
#: what the policy is asked when it rewrites the wrong step itself (corrector=self)
REWRITE = ("Problem: {prompt}\nSolution so far: {previous}\nThis next step is wrong: {step}\n"
           "Write the correct next step only:\n")


def _text(prompt) -> str:
    """A prompt (text or chat messages) as text: the last user message's content."""
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content", "") for m in prompt if m.get("role") == "user"]
    return str(users[-1] if users else "")


def kept_tokens(tokenizer, ids: list[int], char: int) -> tuple[int, int]:
    """(k, e): the first ``k`` tokens of ``ids`` decode to text that ends at character ``e <= char``
    (the tokens wholly before ``char``; a token that straddles it is not kept)."""
    ends = token_char_ends([tokenizer.decode(ids[:t + 1], skip_special_tokens=True) for t in range(len(ids))])
    k = 0
    while k < len(ends) and ends[k] <= char:
        k += 1
    return k, (ends[k - 1] if k else 0)


def check_step_scorer(scorer, where: str = "algo.inject.scorer") -> str:
    """``scorer`` must be one of ``reward=process``'s step scorers (one line otherwise)."""
    if scorer not in STEP_SCORERS:
        raise ConfigError(f"{where}={scorer!r} is not a step scorer (an outcome verifier or an unknown name scores "
                          f"whole completions); use one of {', '.join(STEP_SCORERS)} (reward=process's step scorers)")
    return scorer


@INJECTIONS.register("step_rectify", bounds={"per_group": (">= 1", "failed rollouts of each group that are rectified")})
class StepRectify(Injection):
    """A failed rollout's first wrong step, found by a step scorer, is replaced by a corrector's step;
    the policy's correct prefix is kept and the policy continues after the rectified step.

    In each group, the first ``per_group`` rollouts (slot order; all when null) whose first reward is
    below ``success`` are scored step by step; the first step scored below ``threshold`` (index j) is
    replaced by the reference solution's step j (``corrector=reference``; a prompt without one is left
    alone) or by the first step the policy writes when asked to rewrite it (``corrector=self``, through
    :class:`~mixrl.trainer.parts.policy_calls.PolicyCalls`; written under another context, so it is
    ``rectified`` too and its recorded log-probs are not used). The kept tokens are the
    policy's own (``on_policy``), the written step ``rectified``, and the continuation the policy samples
    after them ``on_policy``; the row takes the failed rollout's slot and is scored by the run's reward.

    Formula: y' = (y_<k, c_j, z), z ~ pi_old(. | x, y_<k, c_j); j = first step with s_j < {threshold}; c_j = {corrector}'s step j; y_<k, z: on_policy; c_j: provenance rectified
    Paper: SCOPE, "Recycling Failures: Salvaging Exploration in RLVR via Fine-Grained Off-Policy Guidance" (arXiv 2602.24110).

    Parameters:
        scorer (reference): the step scorer: reference, judge or model (reward=process's).
        scorer_params (None): the judge's or reward model's params (as reward.params.scorer_params).
        separator (\\n\\n): a step ends after each occurrence (the built-in task's running sums: a space).
        regex (False): separator is a regular expression.
        threshold (0.5): a step scored below it is wrong.
        per_group (None): rectified rollouts per group at most (the first failing slots); null = every failing one.
        success (1.0): a rollout failed when its first reward is below this.
        step_tokens (None): the rectified step's length cap in tokens, below trainer.max_completion_length; null: no cap (a row whose kept prefix and step leave no room for a continuation stays as it was).
        corrector (reference): who writes the step: reference (the reference solution's step j) or self (the policy, asked with request; its first step is kept).
        request (see REWRITE): corrector=self's request, with {prompt}, {previous} (the kept text) and {step} (the wrong step).
    """

    provenances = ("rectified",)
    may_generate_more = True

    def __init__(self, *, scorer: str = "reference", scorer_params: dict | None = None, separator: str = "\n\n",
                 regex: bool = False, threshold: float = 0.5, per_group: int | None = None, success: float = 1.0,
                 step_tokens: int | None = None, corrector: str = "reference", request: str = REWRITE,
                 source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        self.scorer_name = check_step_scorer(scorer)
        try:
            self.steps = process_reward(scorer=scorer, scorer_params=dict(scorer_params or {}), separator=separator,
                                        regex=regex, verifier="none")
        except ConfigError as e:
            raise ConfigError(str(e).replace("reward 'process'", "algo.inject (step_rectify)")
                              .replace("reward.params.", "algo.inject.")) from None
        G = geometry.num_generations if geometry is not None else None
        if per_group is not None and (int(per_group) < 1 or (G is not None and int(per_group) > G)):
            raise ConfigError(f"algo.inject.per_group={per_group} must be between 1 and num_generations={G} (or null: all)")
        if step_tokens is not None and int(step_tokens) < 1:
            raise ConfigError(f"algo.inject.step_tokens must be >= 1 (or null: what the budget leaves), got {step_tokens}")
        self.per_group, self.threshold, self.success = per_group, float(threshold), float(success)
        self.step_tokens = None if step_tokens is None else int(step_tokens)
        if corrector not in CORRECTORS:
            raise ConfigError(f"algo.inject.corrector={corrector!r} is not one of {', '.join(CORRECTORS)}; "
                              "reference: the reference solution's step, self: the policy rewrites the step")
        self.corrector = corrector
        self.request = check_template(request, ("prompt", "previous", "step"), "algo.inject.request",
                                      "{prompt} {previous}[wrong: {step}] ")
        if source is not None:
            source.requires_expert_column = True
        self.metrics: dict[str, float] = {}
        self._rows: list[int] | None = None  # local rows rectified in the last batch (for scope/success)

    def texts(self) -> list[str]:
        """corrector=self's request template (its literal text reaches the tokenizer)."""
        return [template_text(self.request)] if self.corrector == "self" else []

    def check_budget(self, max_completion_length: int) -> None:
        """The rectified step and at least one continuation token must fit the completion budget."""
        if self.step_tokens is not None and self.step_tokens >= max_completion_length:
            raise ConfigError(f"algo.inject.step_tokens={self.step_tokens} leaves no room for the policy's continuation in "
                              f"trainer.max_completion_length={max_completion_length}; lower algo.inject.step_tokens "
                              "below it or raise trainer.max_completion_length")

    def chosen(self, failing: list[bool], G: int) -> list[bool]:
        """Per global row: rectify it (among each group's failing rows, the first ``per_group``)."""
        out = [False] * len(failing)
        for g in range(len(failing) // G):
            rows = [g * G + s for s in range(G) if failing[g * G + s]]
            for r in rows[: self.per_group if self.per_group is not None else G]:
                out[r] = True
        return out

    def locate(self, ctx: InjectContext, rows: list[tuple[int, dict, list[int]]]) -> list[tuple[int, dict]]:
        """Where each failed rollout ``(local row, data row, ids)`` goes wrong, its steps scored in one call:
        ``k`` kept tokens, ``j`` the first wrong step, ``lead`` the kept text between the last kept token and
        the step, ``previous`` / ``step`` the text before and of the wrong step, ``ref`` the reference's step
        j (None without one). A rollout with no step found wrong, without the reference the scorer or the
        corrector reads, or (corrector=reference) with no reference step j is left out."""
        needs_ref = self.scorer_name == "reference" or self.corrector == "reference"
        todo = []  # (local row, data row, ids, text, spans, reference or None)
        for i, row, ids in rows:
            refs = self.source.for_prompt(row) if self.source is not None else []
            if needs_ref and not refs:
                continue
            text = ctx.tokenizer.decode(ids, skip_special_tokens=True)
            todo.append((i, row, ids, text, step_spans(text, self.steps.separator, regex=self.steps.regex),
                         refs[0] if refs else None))
        if not todo:
            return []
        judged = [ref if self.scorer_name == "reference" else row.get("answer") for _, row, _, _, _, ref in todo]
        scores = self.steps.step_scores([t[1]["prompt"] for t in todo], [t[3] for t in todo], [t[4] for t in todo], judged,
                                        ctx.log)
        found = []
        for (i, _, ids, text, spans, ref), sc in zip(todo, scores):
            j = first_wrong_step(sc, self.threshold)
            ref_spans = step_spans(ref, self.steps.separator, regex=self.steps.regex) if ref else []
            if j is None or (self.corrector == "reference" and j >= len(ref_spans)):
                continue
            a, b = spans[j]
            k, e = kept_tokens(ctx.tokenizer, ids, a)
            step_ref = ref[ref_spans[j][0]:ref_spans[j][1]] if j < len(ref_spans) else None
            found.append((i, {"k": k, "j": j, "lead": text[e:a], "previous": text[:a], "step": text[a:b], "ref": step_ref}))
        return found

    def first_step(self, text: str) -> str:
        """The first step of what the policy wrote (up to and with the separator)."""
        spans = step_spans(text, self.steps.separator, regex=self.steps.regex)
        return text[spans[0][0]:spans[0][1]] if spans else ""

    def written(self, ctx: InjectContext, inputs: list[dict], found: list[tuple[int, dict]], L: int) -> list[list[int]]:
        """The rectified step's ids of each located row: the reference's step (``corrector=reference``) or
        the first step the policy writes for the ``request`` (``corrector=self``; every process joins)."""
        if self.corrector == "reference":
            steps = [f["ref"] for _, f in found]
        else:
            calls = ctx.policy_calls("algo.inject.corrector='self'")
            requests = [self.request.format(prompt=_text(inputs[i]["prompt"]), previous=f["previous"], step=f["step"])
                        for i, f in found]
            wrote = calls.write_all(requests, max_new_tokens=self.step_tokens or L - 1) if requests else []
            calls.sync(ctx.gather, device=ctx.device)
            self.metrics.update(calls.metrics("scope"))  # this process's calls and tokens written
            steps = [self.first_step(w.text) for w in wrote]
        out = []
        for (_, f), step in zip(found, steps):
            ids = list(ctx.tokenizer(text=f["lead"] + step, add_special_tokens=False)["input_ids"]) if step else []
            out.append(ids[: self.step_tokens] if self.step_tokens is not None else ids)
        return out

    def after_generation(self, ctx: InjectContext, inputs: list[dict], rollouts: Rollouts) -> Rollouts:
        n, G, L, dev = len(rollouts.completion_ids), ctx.num_generations, ctx.max_completion_length, ctx.device
        self.check_budget(L)
        start = ctx.process_index * n
        primary = torch.nan_to_num(ctx.score(inputs, rollouts.completion_ids)[:, 0], nan=0.0)
        mine = [rollouts.row_source[i] == prov.ON_POLICY and not rollouts.guided[i] for i in range(n)]
        failing = ctx.gather(torch.tensor(mine, dtype=torch.bool, device=dev)).tolist()
        failing = [f and float(primary[r]) < self.success - 1e-6 for r, f in enumerate(failing)]
        chosen = self.chosen(failing, G)
        self.metrics = {}
        found = self.locate(ctx, [(i, inputs[i], list(rollouts.completion_ids[i])) for i in range(n) if chosen[start + i]])
        jobs, steps_at, no_room = [], [], 0  # jobs: (local row, kept tokens, written ids)
        for (i, f), written in zip(found, self.written(ctx, inputs, found, L)):
            if not written or f["k"] + len(written) >= L:  # nothing written, or no room left: the rollout stays
                no_room += 1
                continue
            jobs.append((i, f["k"], written))
            steps_at.append(f["j"])
        prompts = [list(rollouts.prompt_ids[i]) + list(rollouts.completion_ids[i][:k]) + w for i, k, w in jobs]
        new_ids, new_lp = ctx.generate(prompts)  # every process calls it, even with no job
        for (i, k, written), cont, lp in zip(jobs, new_ids, new_lp or [None] * len(jobs)):
            cont = list(cont)[: L - k - len(written)]
            old = list(rollouts.completion_ids[i])
            rollouts.discarded_tokens.append(len(old))  # generated, then replaced: counted in the rollout budget
            rollouts.completion_ids[i] = old[:k] + written + cont
            rollouts.token_source[i] = [prov.ON_POLICY] * k + [RECTIFIED] * len(written) + [prov.ON_POLICY] * len(cont)
            rollouts.behaviour_logp[i] = None  # on-policy tokens: the row's forward; the written step: none exists
            if rollouts.logprobs is not None:
                cont_lp = list(lp)[: len(cont)] if lp is not None else [None] * len(cont)
                rollouts.logprobs[i] = list(rollouts.logprobs[i])[:k] + [None] * len(written) + cont_lp
            rollouts.guided[i] = 1  # continued from a written step: not the policy's own accuracy
        self._rows = [i for i, _, _ in jobs]
        counts = ctx.gather(torch.tensor([[len(jobs), no_room, sum(steps_at)]], dtype=torch.float32, device=dev)).sum(0).tolist()
        self.metrics.update({"scope/candidates": float(sum(chosen)), "scope/rectified": counts[0], "scope/no_room": counts[1]})
        if counts[0]:  # the wrong step's index, averaged over the rectified rows of every process
            self.metrics["scope/first_wrong_step"] = counts[2] / counts[0]
        if ctx.log is not None:
            for key, value in self.metrics.items():
                ctx.log(key, value)
        return rollouts

    def after_rewards(self, ctx: InjectContext, inputs: list[dict], rewards: torch.Tensor) -> torch.Tensor:
        """Logs ``scope/success``: the share of this batch's rectified rows whose first reward reaches ``success``."""
        rows, self._rows = self._rows, None
        if rows is None or ctx.log is None or ctx.primary_rewards is None:
            return rewards
        n = len(inputs)
        mask = torch.zeros(n, dtype=torch.bool, device=rewards.device)
        mask[rows] = True
        mask = ctx.gather(mask)
        if bool(mask.any()):
            ok = torch.nan_to_num(ctx.primary_rewards.to(mask.device), nan=0.0) >= self.success - 1e-6
            ctx.log("scope/success", float(ok[mask].float().mean()))
        return rewards
