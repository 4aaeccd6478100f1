"""OSP's self-judged pairs: the policy being trained judges the preference strength of its own pairs.

OSP ("Online Self-Preferring Language Models", Zhai et al. 2024, arXiv 2405.14103) learns from
self-generated response pairs and self-judged preference strengths with the soft-preference
cross-entropy (the ``osp`` term, :mod:`mixrl.core.preference_losses`). Here the pairs are
``group_pairs``' (each group's best and worst rollout by the run's reward, appended as a
chosen/rejected pair), and the strength of each pair is the policy's own judgement, read from its
next-token probabilities under a comparison request (no text is generated, nothing of it is trained):

    p_1 = sigmoid(log pi("1" | q(x, y_w, y_l)) - log pi("2" | q(x, y_w, y_l)))      (y_w shown first)
    p_2 = sigmoid(log pi("2" | q(x, y_l, y_w)) - log pi("1" | q(x, y_l, y_w)))      (y_w shown second)
    p   = (p_1 + p_2) / 2   (``both_orders``; else p_1)

``pi`` is the policy now (the weights this step trains, no grad: ``InjectContext.behaviour_logps``),
not a frozen copy and not the run's reward; ``q`` is ``request`` in the prompt's last user message
with the chat template applied as for prompts; a label's log-prob is the sum over its tokens. Both
orders cancel a judge's preference for a position (mixrl's choice). The strength is written into
both rows of the pair as ``pair_strength``, which ``osp`` reads with ``strength: self``.

Sources: the paper's abstract (the authors' code was not found); the comparison request, the
two-label probability and the averaging of the two orders are mixrl's reading. A request longer than
the policy's context is a one-line UserFunctionError.
"""

from __future__ import annotations

import math

import torch

from mixrl.errors import ConfigError, UserFunctionError
from mixrl.sources.base import INJECTIONS, InjectContext, check_template, template_text
from mixrl.sources.pair_rows import row_side
from mixrl.sources.pairs import PAIR_ON_POLICY, GroupPairs
from mixrl.sources.self_hint import in_last_user

REQUEST = ("Which response to the problem is better?\nProblem: {prompt}\nResponse 1: {first}\nResponse 2: {second}\n"
           "Reply 1 or 2. The better response is")


def strength(lp: list[float], both_orders: bool) -> float:
    """The self-judged strength from the label log-probs ``lp`` = [l1, l2] (y_w first) or
    [l1, l2, l1', l2'] (then y_w second).

    Formula: p = sigmoid(l1 - l2), or with both orders (sigmoid(l1 - l2) + sigmoid(l2' - l1')) / 2"""
    first = 1.0 / (1.0 + math.exp(-(lp[0] - lp[1])))
    if not both_orders:
        return first
    return (first + 1.0 / (1.0 + math.exp(-(lp[3] - lp[2])))) / 2.0


@INJECTIONS.register("self_judged_pairs", bounds={"pairs": (">= 1", "pairs appended per step, all processes")})
class SelfJudgedPairs(GroupPairs):
    """OSP's self-judged pairs: ``group_pairs``' best-vs-worst rollout pairs, each with the preference
    strength the policy being trained gives it (``pair_strength``, read by ``osp`` with ``strength: self``).

    Formula: p = [sigmoid(log pi(1|q(x,y_w,y_l)) - log pi(2|q(x,y_w,y_l))) + sigmoid(log pi(2|q(x,y_l,y_w)) - log pi(1|q(x,y_l,y_w)))] / 2 under the policy now (both_orders; else the first term); pairs as group_pairs: up to {pairs} per step
    Paper: OSP, "Online Self-Preferring Language Models" (arXiv 2405.14103): self-generated pairs and self-judged preference strengths.

    Parameters:
        pairs (8): pairs per optimizer step, all processes (a multiple of the processes).
        request (str): the comparison request; {prompt}, {first}, {second} are filled.
        labels (list): the two answers the judgement reads (the first response's, the second's).
        both_orders (True): judge each pair in both orders and average (cancels a preference for a position).
    """

    judges_pairs = True  # config validation: writes pair_strength (osp's strength: self)

    def __init__(self, *, pairs: int = 8, request: str = REQUEST, labels=("1", "2"), both_orders: bool = True,
                 source=None, geometry=None, seed: int = 0):
        super().__init__(pairs=pairs, source=source, geometry=geometry, seed=seed)
        check_template(request, ("prompt", "first", "second"), "algo.inject.request", REQUEST)
        if "{first}" not in request or "{second}" not in request:
            raise ConfigError("algo.inject.request must contain {first} and {second} (the two responses compared), "
                              "e.g. '{prompt}\\n1: {first}\\n2: {second}\\nBetter:'")
        labels = [str(x) for x in labels]
        if len(labels) != 2 or labels[0] == labels[1] or not all(labels):
            raise ConfigError(f"algo.inject.labels={labels} must be two different non-empty answers, e.g. ['1', '2']")
        self.request, self.labels, self.both_orders = request, labels, bool(both_orders)
        self._inputs: list[dict] = []

    def texts(self) -> list[str]:
        return [template_text(self.request), *self.labels]

    def after_advantages(self, ctx: InjectContext, inputs: list[dict], out: dict) -> dict:
        self._inputs = inputs  # the local rows' prompts, for the judgement request
        self.metrics.pop("pairs/self_strength", None)  # set again when this step has pairs
        return super().after_advantages(ctx, inputs, out)

    def _append(self, ctx: InjectContext, out: dict, on: list[tuple[int, int]], off: list[tuple]) -> dict:
        p = self.judge(ctx, out, on, self._inputs)
        new = super()._append(ctx, out, on, off)
        n_old, e = out["prompt_ids"].shape[0], 2 * (len(on) + len(off))
        values = [p[k // 2] if k // 2 < len(p) else math.nan for k in range(e)]  # an off-policy pair: not judged
        head = out["pair_strength"] if "pair_strength" in out else torch.full((n_old,), math.nan)
        dev = new["prompt_ids"].device
        new["pair_strength"] = torch.cat([head.to(dev, torch.float32), torch.tensor(values, dtype=torch.float32, device=dev)])
        if p:
            self.metrics["pairs/self_strength"] = sum(p) / len(p)
        return new

    def judge(self, ctx: InjectContext, out: dict, on: list[tuple[int, int]], inputs: list[dict]) -> list[float]:
        """The policy's strength of each (chosen row, rejected row) pair of local rows (module docstring)."""
        if not on:
            return []
        requests = []
        for w, l in on:
            yw, yl = (self._text(ctx, row_side(out, i, PAIR_ON_POLICY)) for i in (w, l))
            prompt = inputs[w]["prompt"]
            orders = [(yw, yl), (yl, yw)] if self.both_orders else [(yw, yl)]
            requests += [in_last_user(prompt, self.request, first=a, second=b) for a, b in orders]
        contexts = ctx.tokenize_prompts(requests)
        label_ids = [list(ctx.tokenizer(x, add_special_tokens=False)["input_ids"]) for x in self.labels]
        longest = max(len(c) for c in contexts) + max(len(x) for x in label_ids)
        if ctx.max_positions and longest > ctx.max_positions:
            raise UserFunctionError(f"algo.inject.name='self_judged_pairs': a judgement request is {longest} tokens with its answer, "
                                    f"over the policy's {ctx.max_positions} positions; shorten algo.inject.request or "
                                    "trainer.max_completion_length")
        asked = [c for c in contexts for _ in self.labels]
        answers = [x for _ in contexts for x in label_ids]
        lps = [float(sum(lp)) for lp in ctx.behaviour_logps(asked, answers)]  # the policy now, no grad
        per = 4 if self.both_orders else 2
        return [strength(lps[k * per:(k + 1) * per], self.both_orders) for k in range(len(on))]

    @staticmethod
    def _text(ctx: InjectContext, side) -> str:
        return ctx.tokenizer.decode(side.completion, skip_special_tokens=True)
