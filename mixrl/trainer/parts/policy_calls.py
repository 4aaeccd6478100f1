"""PolicyCalls: the policy, as a feedback or hint builder may call it inside the step.

A builder that writes the context of a regeneration (a hint before solving, a critique of a
failed attempt) may ask the policy itself to write it: SAGE's self-hint h ~ pi(. | x, s), a
self-critique c ~ pi(. | x, y). :meth:`PolicyCalls.write` generates through the same path as the
rollouts (``InjectContext.generate``: TRL's generation, vLLM where the rollouts use it, the run's
sampling settings), then records the behaviour log-probs of what was written (a no-grad forward of
the context and the written tokens, ``InjectContext.behaviour_logps``), and keeps every call in
:attr:`PolicyCalls.written`. What is written enters a rollout's context (its prompt), never its
completion: no term trains it (SAGE's hint tokens are not trained; the authors' code decodes the
hint to text and never puts it in the training batch).

The sharding rule (:mod:`mixrl.trainer.parts.forwards`): under FSDP / ZeRO-3 every process must
join every generation and forward of the policy, but a builder is called per attempt, so processes
may call the policy a different number of times. :meth:`PolicyCalls.sync` (the injection calls it
once its builders are done, on every process) gathers the call counts and lets a process that
called less join the others' remaining calls with empty ones (``generate([])`` joins with a dummy
prompt where the policy is sharded).

Owns: the calls of one injection hook (made per hook by :meth:`Injections.policy_calls`; nothing to
checkpoint, ``state_dict() == {}``). Receives the context's callables. Returns :class:`Written`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mixrl.errors import UserFunctionError

@dataclass
class Written:
    """What the policy wrote for one request: ``text`` (decoded, special tokens skipped), the
    request's token ids ``context_ids``, the written ``ids`` (cut to ``max_new_tokens``), the
    per-token ``behaviour_logp`` recorded under the request (pi_old(h_t | request, h_<t), what a
    term that trained the written tokens would need as their stored behaviour)."""

    text: str
    context_ids: list[int]
    ids: list[int]
    behaviour_logp: list[float]


class PolicyCalls:
    """The policy's generation, offered to the builders of one injection hook.

    Args:
        who: where the builder was configured (``algo.inject.feedback='self'``), for error messages.
        tokenizer: the run's tokenizer (decodes what was written).
        tokenize_prompts: ``InjectContext.tokenize_prompts`` (a text or chat-message request -> ids, chat template applied).
        generate: ``InjectContext.generate`` (prompt ids -> (completion ids, logprobs)).
        behaviour_logps: ``InjectContext.behaviour_logps`` (prompt ids, completion ids -> per-token log-probs).
        max_new_tokens: the default length of what is written (tokens).
        max_positions: the policy's context length (None: unknown, unchecked).
        limit: ``n -> context`` in which generation stops after n new tokens (None: cut afterwards only).
    """

    def __init__(self, *, who: str, tokenizer, tokenize_prompts: Callable, generate: Callable,
                 behaviour_logps: Callable, max_new_tokens: int, max_positions: int | None = None,
                 limit: Callable[[int], contextlib.AbstractContextManager] | None = None):
        self.who, self.tokenizer = who, tokenizer
        self.tokenize_prompts, self.sample, self.behaviour_logps = tokenize_prompts, generate, behaviour_logps
        self.default_tokens, self.max_positions = int(max_new_tokens), max_positions
        self.limit = limit or (lambda n: contextlib.nullcontext())
        self.written: list[Written] = []  # everything written in this hook, in order
        self.calls = 0  # generations this process ran for builders in this hook

    def write(self, request, *, max_new_tokens: int | None = None) -> Written:
        """The policy's answer to ``request`` (a text, or chat messages: the chat template is
        applied as for prompts), at most ``max_new_tokens`` tokens, sampled as the rollouts are.
        A request that leaves no room for them in the model's context is a one-line
        UserFunctionError naming the builder."""
        return self.write_all([request], max_new_tokens=max_new_tokens)[0]

    def write_all(self, requests: list, *, max_new_tokens: int | None = None) -> list[Written]:
        """:meth:`write` for several requests in one generation and one forward (one call)."""
        n = int(max_new_tokens or self.default_tokens)
        contexts = self.tokenize_prompts(list(requests)) if requests else []
        for context in contexts:
            if self.max_positions and len(context) + n > self.max_positions:
                raise UserFunctionError(
                    f"{self.who} asked the policy to write {n} tokens after a request of {len(context)} tokens: "
                    f"together they exceed the model's {self.max_positions} positions; shorten the request "
                    f"(its template) or the length asked for")
        with self.limit(n):
            ids, _ = self.sample([list(c) for c in contexts])
        outs = [list(x)[:n] for x in ids]
        lps = self.behaviour_logps([list(c) for c in contexts], outs)
        written = [Written(text=self.tokenizer.decode(o, skip_special_tokens=True), context_ids=list(c), ids=o,
                           behaviour_logp=[float(x) for x in lp]) for c, o, lp in zip(contexts, outs, lps)]
        self.written += written
        self.calls += 1
        return written

    def sync(self, gather: Callable[[torch.Tensor], torch.Tensor], device=None) -> None:
        """Every process joins as many generations and forwards as the process that called the
        policy most in this hook (an empty call where this one has nothing to write). Call it on
        every process, after the builders."""
        counts = gather(torch.tensor([self.calls], device=device))
        for _ in range(int(counts.max()) - self.calls):
            self.sample([])
            self.behaviour_logps([], [])

    def metrics(self, prefix: str) -> dict[str, float]:
        """``{prefix}/self_written_calls`` and ``{prefix}/self_written_tokens`` of this process."""
        return {f"{prefix}/self_written_calls": float(self.calls),
                f"{prefix}/self_written_tokens": float(sum(len(w.ids) for w in self.written))}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
