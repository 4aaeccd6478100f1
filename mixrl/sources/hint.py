"""Hints when a group fails: generate its rollouts again with a hint in the context.

When every rollout of a group fails (or its success rate is at most ``max_success``), the
rollouts of that group are generated again, by the same policy, with a hint: the
beginning of the expert solution or the final answer, placed by a template in the prompt
(Guide, GHPO) or as a prefix of the completion (POPE's guided rollouts, decided online).
The regenerated completions replace the failed ones before the group's rewards and
advantages are computed; the discarded ones still count toward the rollout budget.

How a hinted completion y (sampled from pi_old(. | x, h)) is trained:

* ``train_under: unhinted`` (Guide): under the prompt x without the hint, with the ratio
  pi_theta(y | x) / pi_old(y | x, h). Its tokens have provenance ``hinted`` (behaviour
  ``stored``: the log-probs of the hinted generation, recorded by a forward of x + h + y
  when it is generated), so the policy term must select ``hinted`` tokens too;
* ``train_under: hinted`` (GHPO, "plain hinted training"): under the hinted prompt x + h,
  an ordinary rollout of that prompt (ratio pi_theta(y | x, h) / pi_old(y | x, h));
* ``placement: prefix``: the hint is a prefix of the completion (provenance ``prefix``,
  see :mod:`mixrl.sources.prefix`); the policy samples only what follows it.

``hint: self`` (SAGE): the policy writes the hint itself, from the problem and its reference
solution, one per failed group and level (:mod:`mixrl.sources.self_hint`); its tokens are context,
never trained.
"""

from __future__ import annotations

import torch

from mixrl.core import provenance as prov
from mixrl.errors import ConfigError
from mixrl.sources.base import INJECTIONS, InjectContext, Injection, Rollouts, check_template, template_text
from mixrl.sources.prefix import PREFIX, global_rows, solution_ids
from mixrl.sources.self_hint import REQUEST, SelfHints
from mixrl.sources.rows import splice_prefixes

HINTED = prov.register_provenance(
    "hinted", behaviour="stored",
    description="sampled by the policy with a hint in its context, trained without it (behaviour log-prob recorded under the hint)",
).code

#: GHPO's hint template (the authors' code): the prompt, then the beginning of the reference solution
GHPO_TEMPLATE = "{prompt}\n The following text is the beginning part of the answer, which you can refer to for solving the problem:\n{hint}"


def with_hint(prompt, hint: str, template: str):
    """The prompt with ``hint`` placed by ``template`` (``{prompt}``, ``{hint}``); for chat
    messages, in the content of the last user message."""
    if isinstance(prompt, str):
        return template.format(prompt=prompt, hint=hint)
    msgs = [dict(m) for m in prompt]
    last = max((i for i, m in enumerate(msgs) if m.get("role") == "user"), default=len(msgs) - 1)
    msgs[last]["content"] = template.format(prompt=msgs[last]["content"], hint=hint)
    return msgs


def text_boundary(tokenizer, ids: list[int], n: int, text: str) -> int:
    """The largest cut ``m <= n`` of a solution's token ids whose decoded text is a prefix of the
    solution ``text`` (``n`` when none is within 3 tokens). A byte-level BPE token may hold
    part of a character (``"3×4"`` is ``3``, two byte tokens of ``×``, ``4``): cut between
    them, the decoded hint would end in U+FFFD instead of the solution's character. A
    character is at most 4 bytes, so at most 3 tokens are given back."""
    for m in range(n, max(n - 4, 0), -1):
        if text.startswith(tokenizer.decode(ids[:m], skip_special_tokens=True)):
            return m
    return n


@INJECTIONS.register("hint", bounds={
    "max_success": ("[0, 1)", "a group success rate at or below it is hinted; 1 would hint every group"),
    "per_group": (">= 1", "slots of a group generated again"),
})
class HintOnFailure(Injection):
    """Failed groups generated again with a hint (Guide, GHPO; POPE with ``placement: prefix``).

    A group whose success rate is at most ``max_success`` has its first ``per_group``
    rollouts (all when null) generated again with a hint. ``fraction`` lists the hint
    lengths tried in turn while the group still fails (GHPO: 0.25, 0.5, 0.75 of the
    solution); ``hint: answer`` hints the final answer instead.

    Formula: if mean_i 1[r_i >= {success}] <= {max_success}: y_i ~ pi_old(. | x, h), h = {hint} x {fraction} in the {placement} (hint self: h ~ pi_old(. | request(x, s, k)) for level k = 1..{levels}, one per group, context only: never trained); in the prompt, trained {train_under} (unhinted: r = pi_theta(y|x) / pi_old(y|x,h); hinted: r = pi_theta(y|x,h) / pi_old(y|x,h))
    Paper: Guide, "Adaptive Guidance Accelerates Reinforcement Learning of Reasoning Models" (arXiv 2506.13923); GHPO, "GHPO: Adaptive Guidance for Stable and Efficient LLM Reinforcement Learning" (arXiv 2507.10628); SAGE, "Self-Hinting Language Models Enhance Reinforcement Learning" (arXiv 2602.03143) with hint: self (h ~ pi(. | request(x, s, level)), not trained).

    Parameters:
        hint (solution): solution (the beginning of the source's solution) | answer (the row's final answer) | self (written by the policy from the problem and its solution, SAGE).
        fraction (0.5): share of the solution's tokens in the hint; a list is tried in turn while the group fails (hint: self: unused).
        levels (1): hint: self: rounds while the group fails, the k-th asking for a level-k hint (SAGE: 3).
        request (REQUEST): hint: self: what the policy is asked ({prompt}, {solution}, {level}); the default: the problem, "Solution:" and the solution, a request for a level-{level} hint that does not reveal the answer, "Hint:".
        hint_tokens (64): hint: self: the longest hint the policy writes (tokens).
        template ("{prompt}{hint}"): where the hint goes in the prompt ({prompt}, {hint}); GHPO's text in its recipes.
        placement (prompt): prompt (the hint in the context) | prefix (the hint starts the completion).
        train_under (unhinted): unhinted (Guide's ratio re-targeting) | hinted (plain hinted training, GHPO).
        max_success (0.0): a group is regenerated when its success rate is at most this (0: every rollout failed).
        per_group (None): rollouts regenerated per failed group (the first k slots); null = all.
        success (1.0): a rollout succeeds when its first reward function gives at least this.
    """

    may_generate_more = True

    def __init__(self, *, hint: str = "solution", fraction=0.5, template: str = "{prompt}{hint}", placement: str = "prompt",
                 train_under: str = "unhinted", max_success: float = 0.0, per_group: int | None = None, success: float = 1.0,
                 levels: int = 1, request: str = REQUEST, hint_tokens: int = 64,
                 source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        if hint not in ("solution", "answer", "self"):
            raise ConfigError(f"algo.inject.hint must be solution, answer or self, got {hint!r}")
        if hint == "self" and placement != "prompt":
            raise ConfigError("algo.inject.hint=self needs algo.inject.placement=prompt (the policy's hint is context)")
        if int(levels) < 1:
            raise ConfigError(f"algo.inject.levels must be >= 1, got {levels}")
        self.self_hints = SelfHints(request=request, tokens=hint_tokens) if hint == "self" else None
        if placement not in ("prompt", "prefix"):
            raise ConfigError(f"algo.inject.placement must be prompt or prefix, got {placement!r}")
        if train_under not in ("unhinted", "hinted"):
            raise ConfigError(f"algo.inject.train_under must be unhinted or hinted, got {train_under!r}")
        fractions = list(fraction) if isinstance(fraction, (list, tuple)) else [fraction]
        if not fractions or any(not 0.0 < float(f) <= 1.0 for f in fractions):
            raise ConfigError(f"algo.inject.fraction must be in (0, 1] (or a list of such), got {fraction!r}")
        check_template(template, ("prompt", "hint"), "algo.inject.template", "{prompt}\nHint: {hint}")
        if "{hint}" not in template or (placement == "prompt" and "{prompt}" not in template):
            raise ConfigError("algo.inject.template must contain {prompt} and {hint}, e.g. '{prompt}\\nHint: {hint}'")
        if not 0.0 <= float(max_success) < 1.0:
            raise ConfigError(f"algo.inject.max_success must be in [0, 1), got {max_success}")
        G = geometry.num_generations if geometry is not None else None
        if per_group is not None and (int(per_group) < 1 or (G is not None and int(per_group) > G)):
            raise ConfigError(f"algo.inject.per_group={per_group} must be between 1 and num_generations={G} (or null: all)")
        self.hint, self.fractions, self.template, self.placement = hint, [float(f) for f in fractions], template, placement
        if hint == "self":  # one round per level: 1, 2, ... (the fraction is not read)
            self.fractions = [float(k) for k in range(1, int(levels) + 1)]
        self.train_under, self.max_success, self.per_group, self.success = train_under, float(max_success), per_group, float(success)
        if source is not None and hint in ("solution", "self"):
            source.requires_expert_column = True

    def texts(self) -> list[str]:
        """The template's literal text: it enters hinted prompts (placement: prompt)."""
        own = self.self_hints.texts() if self.self_hints is not None else []
        return [template_text(self.template), *own] if self.placement == "prompt" else []

    @property
    def provenances(self) -> tuple[str, ...]:
        if self.placement == "prefix":
            return ("prefix",)
        return ("hinted",) if self.train_under == "unhinted" else ()

    @property
    def may_leave_untrained(self) -> tuple[str, ...]:
        return ("prefix",)

    # ----------------------------------------------------------------- the hint of a row
    def hint_text(self, ctx: InjectContext, row: dict, fraction: float, slot: int, group: int = 0) -> tuple[str, list[int]] | None:
        """(text, token ids) of the hint for ``row``, or None when it has none (``hint: self``:
        ``fraction`` is the level, ``group`` the row's group, whose rows share the policy's hint)."""
        if self.hint == "self":
            sols = self.source.for_prompt(row) if self.source is not None else []
            ans = row.get("answer")
            solution = str(sols[0]) if sols else (str(ans) if ans is not None and str(ans).strip() else None)
            return self.self_hints.hint(row, group, int(fraction), solution)
        if self.hint == "answer":
            ans = row.get("answer")
            if ans is None or not str(ans).strip():
                return None
            return str(ans), solution_ids(ctx, str(ans))
        sols = self.source.for_prompt(row) if self.source is not None else []
        if not sols:
            return None
        text = sols[slot % len(sols)]
        ids = solution_ids(ctx, text)
        n = max(1, min(round(fraction * len(ids)), len(ids), ctx.max_completion_length - 1))
        if self.placement == "prompt":  # the hint is text in the prompt: end it where a character ends
            n = text_boundary(ctx.tokenizer, ids, n, text)
        ids = ids[:n]
        return ctx.tokenizer.decode(ids, skip_special_tokens=True), ids

    # ----------------------------------------------------------------- regeneration
    def _failed_groups(self, ok: torch.Tensor, G: int) -> set[int]:
        rate = ok.float().view(-1, G).mean(dim=1)
        return {int(g) for g in torch.nonzero(rate <= self.max_success + 1e-9).flatten()}

    def after_generation(self, ctx: InjectContext, inputs: list[dict], rollouts: Rollouts) -> Rollouts:
        n, G = len(rollouts.completion_ids), ctx.num_generations
        gidx = global_rows(ctx, n)
        k = G if self.per_group is None else int(self.per_group)
        eligible = [i for i in range(n) if rollouts.row_source[i] == prov.ON_POLICY and not rollouts.guided[i] and gidx[i] % G < k]
        ok = self._ok(ctx.score(inputs, rollouts.completion_ids))
        first_ok = ok.float().mean() if ok.numel() else ok.new_zeros((), dtype=torch.float32)
        failed = self._failed_groups(ok, G)
        n_groups = ok.numel() // G
        first_failed = set(failed)
        hinted: dict[int, tuple[list[int], list[int]]] = {}  # local row -> (generation prompt ids, hint ids)
        rounds, self_written = 0, 0
        for fraction in self.fractions:
            if not failed:
                break
            rounds += 1
            targets, gen_prompts, hints = [], [], []
            if self.self_hints is not None:
                self.self_hints.begin(ctx)
            for i in eligible:
                if gidx[i] // G not in failed:
                    continue
                h = self.hint_text(ctx, inputs[i], fraction, gidx[i] % G, gidx[i] // G)
                if h is None:
                    continue
                targets.append(i)
                hints.append(h[1])
                if self.placement == "prompt":
                    gen_prompts.append(ctx.tokenize_prompts([with_hint(inputs[i]["prompt"], h[0], self.template)])[0])
                    if self.self_hints is not None:
                        self.self_hints.check_room(ctx, len(gen_prompts[-1]))
                else:
                    gen_prompts.append(list(rollouts.prompt_ids[i]) + h[1])
            if self.self_hints is not None:  # every process joins the others' hint writing, even with no target
                self.self_hints.end(ctx)
                self_written += sum(len(w.ids) for w in self.self_hints.calls.written)
            new_ids, new_lp = ctx.generate(gen_prompts)  # every process calls it, even with no target
            spliced_sources = [None] * len(new_ids)
            if self.placement == "prefix":  # on token ids: the hint's ids, then exactly what the policy sampled
                new_ids, new_lp, spliced_sources = splice_prefixes(new_ids, new_lp, hints, max_len=ctx.max_completion_length,
                                                                   prefix_code=PREFIX, continuation_code=prov.ON_POLICY)
            for j, i in enumerate(targets):
                rollouts.discarded_tokens.append(self._sampled_len(rollouts, i))
                rollouts.completion_ids[i] = list(new_ids[j])
                if rollouts.logprobs is not None:
                    rollouts.logprobs[i] = list(new_lp[j]) if new_lp is not None else [None] * len(new_ids[j])
                hinted[i] = (gen_prompts[j], hints[j])
                rollouts.token_source[i] = spliced_sources[j]  # prefix codes as spliced (a hint cut to max length too)
            ok = self._ok(ctx.score(inputs, rollouts.completion_ids))
            failed = self._failed_groups(ok, G) & first_failed
        self._finish(ctx, rollouts, hinted)
        if ctx.log is not None:
            dev = ok.device
            rows = ctx.gather(torch.tensor([i in hinted for i in range(n)], dtype=torch.bool, device=dev))
            ctx.log("hint/groups", len(first_failed) / max(n_groups, 1))
            ctx.log("hint/regenerated", float(ctx.gather(torch.tensor([len(rollouts.discarded_tokens)], device=dev)).sum()))
            ctx.log("hint/rounds", float(rounds))
            ctx.log("hint/first_pass_success", float(first_ok))  # the policy alone, on every group
            if self.self_hints is not None:  # the tokens the policy wrote as hints (all processes)
                ctx.log("hint/self_written_tokens", float(ctx.gather(torch.tensor([self_written], device=dev)).sum()))
            if bool(rows.any()):
                ctx.log("hint/success", float(ok[rows].float().mean()))
                rescued = [g for g in first_failed if bool(ok[g * G:(g + 1) * G].any())]
                ctx.log("hint/rescued", len(rescued) / max(len(first_failed), 1))
            if bool((~rows).any()):
                ctx.log("hint/free_success", float(ok[~rows].float().mean()))
        return rollouts

    def _ok(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        primary = torch.nan_to_num(rewards_per_func[:, 0], nan=0.0)
        return primary >= self.success - 1e-6

    @staticmethod
    def _sampled_len(rollouts: Rollouts, i: int) -> int:
        ts = rollouts.token_source[i]
        if ts is None:
            return len(rollouts.completion_ids[i])
        return sum(1 for t in ts if t != PREFIX)

    def _finish(self, ctx: InjectContext, rollouts: Rollouts, hinted: dict) -> None:
        """Provenance of the final hinted rows: behaviour log-probs under the hint (Guide), the
        hinted prompt (plain hinted training) or the prefix (placement: prefix)."""
        rows = sorted(hinted)
        for i in rows:
            rollouts.guided[i] = 1 if self.placement == "prefix" else 2
        if self.placement == "prefix":
            return
        if self.train_under == "hinted":
            for i in rows:
                rollouts.prompt_ids[i] = hinted[i][0]
            return
        behaviour = ctx.behaviour_logps([hinted[i][0] for i in rows], [rollouts.completion_ids[i] for i in rows])
        for i, b in zip(rows, behaviour):
            rollouts.token_source[i] = [HINTED] * len(rollouts.completion_ids[i])
            rollouts.behaviour_logp[i] = b
            if rollouts.logprobs is not None:  # sampled under x + h: no correction against pi_old(. | x)
                rollouts.logprobs[i] = [None] * len(rollouts.completion_ids[i])
