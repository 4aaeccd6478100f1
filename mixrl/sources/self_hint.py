"""Self-hints: the policy writes the hint of a failed group itself (SAGE).

SAGE ("Self-Hinting Language Models Enhance Reinforcement Learning", arXiv 2602.03143): when a
group's rollouts all fail, the policy is asked, with the problem and its reference solution in
context (privileged information), for a hint h that guides toward the solution without giving it;
the group is generated again from the prompt with the hint, y ~ pi(. | x, h), and scored by the
unchanged reward R(x, y). At test time h is empty. The hint is written by the same policy through
the same generation path as the rollouts (:class:`mixrl.trainer.parts.policy_calls.PolicyCalls`);
its tokens are not trained: they enter the regenerated rows' context only.

The authors' code (BaohaoLiao/SAGE @ 8722c1a3aa5bfe5578df8aaf302741a9715a56a2,
recipe/hint/hint_trainer.py) asks the policy once per unresolved prompt for a JSON of three hint
levels (``_generate_hints_batch``, lines 196-265, prompt in recipe/hint/prompt.py), tries level 1,
then 2, then 3 on the prompts still unresolved (lines 763-819), and trains the regenerated group
under the hinted prompt (``run_rollout`` re-tokenises it, lines 608-678). Here each level is its
own request (``{level}`` in the request template) rather than one JSON with three fields, so a
model too small to write JSON still gets a hint; one hint per group and per process (a group
whose rows are split over processes gets one hint on each).
"""

from __future__ import annotations

from mixrl.errors import ConfigError, UserFunctionError
from mixrl.sources.base import check_template, template_text

#: the hint request, after the authors' HINT_SYSTEM_PROMPT / HINT_USER_PROMPT_TEMPLATE (shortened, one level per request)
REQUEST = ("{prompt}\nSolution: {solution}\nWrite a level-{level} hint (1 minimal, 3 detailed) that guides a student "
           "toward this solution without revealing the final answer.\nHint:")


def in_last_user(prompt, template: str, **fields):
    """``template`` filled with ``prompt`` and ``fields``; for chat messages, in the content of the
    last user message (the system message stays)."""
    if isinstance(prompt, str):
        return template.format(prompt=prompt, **fields)
    msgs = [dict(m) for m in prompt]
    last = max((i for i, m in enumerate(msgs) if m.get("role") == "user"), default=len(msgs) - 1)
    msgs[last]["content"] = template.format(prompt=msgs[last]["content"], **fields)
    return msgs


class SelfHints:
    """The hints the policy writes for the failed groups of one generation batch.

    ``request``: the request template ({prompt}, {solution}, {level}); ``tokens``: the longest hint.
    """

    WHO = "algo.inject.hint='self'"

    def __init__(self, *, request: str = REQUEST, tokens: int = 64):
        check_template(request, ("prompt", "solution", "level"), "algo.inject.request", REQUEST)
        if "{prompt}" not in request:
            raise ConfigError("algo.inject.request must contain {prompt} (and may contain {solution}, {level}), e.g. "
                              "'{prompt}\\nSolution: {solution}\\nHint:'")
        if int(tokens) < 1:
            raise ConfigError(f"algo.inject.hint_tokens must be >= 1, got {tokens}")
        self.request, self.tokens = request, int(tokens)
        self.calls = None
        self.by_group: dict[int, tuple[str, list[int]] | None] = {}

    def texts(self) -> list[str]:
        return [template_text(self.request)]

    def begin(self, ctx) -> None:
        """A new round: the policy's handle for this hook, no hint written yet."""
        self.calls = ctx.policy_calls(self.WHO)
        self.by_group = {}

    def hint(self, row: dict, group: int, level: int, solution: str | None) -> tuple[str, list[int]] | None:
        """(text, ids) of the group's hint at ``level`` (written on its first row, then reused);
        None when the row has no solution to hint from or the policy wrote nothing."""
        if group not in self.by_group:
            self.by_group[group] = None
            if solution:
                w = self.calls.write(in_last_user(row["prompt"], self.request, solution=solution, level=level),
                                     max_new_tokens=self.tokens)
                text = w.text.strip()
                self.by_group[group] = (text, w.ids) if text else None
        return self.by_group[group]

    def end(self, ctx) -> None:
        """Every process joins the others' policy calls (:meth:`PolicyCalls.sync`)."""
        self.calls.sync(ctx.gather, device=ctx.device)

    def check_room(self, ctx, context_tokens: int) -> None:
        """The hinted prompt must leave ``max_completion_length`` positions free (one line when not)."""
        if not ctx.max_positions or context_tokens + ctx.max_completion_length <= ctx.max_positions:
            return
        raise UserFunctionError(
            f"{self.WHO}: the prompt with the policy's hint is {context_tokens} tokens, and with "
            f"trainer.max_completion_length={ctx.max_completion_length} it exceeds the model's {ctx.max_positions} "
            f"positions; lower algo.inject.hint_tokens={self.tokens}, shorten algo.inject.template, or lower "
            "trainer.max_completion_length")
