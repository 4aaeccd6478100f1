"""``reward=process``: step-level scores mapped onto each step's tokens as a dense reward (CAPO-style).

Each completion is cut into steps (``separator``, ``regex``: :func:`mixrl.core.process_rewards.step_spans`).
A scorer gives each step a score ``s_j``: ``scorer=judge`` asks a generative judge (:mod:`mixrl.rewards.judge`,
``scorer_params`` are its params; its default question shows the solution so far and the next step and
asks for ``Verdict: correct`` or ``incorrect``), ``scorer=model`` reads a reward model's score of the prompt
plus the steps up to and including ``j`` (:mod:`mixrl.rewards.reward_model`, a PRM-style prefix score),
``scorer=genprm`` asks a judge ``votes`` times for the wrong steps of the whole numbered solution and votes
(CAPO's generative PRM, :mod:`mixrl.rewards.genprm`: ``s_j = 1 - penalty_j``).
The step's reward ``step_weight (s_j - baseline)`` is put on its tokens (``placement``:
:func:`mixrl.core.process_rewards.step_token_rewards`); ``outcome_weight`` times the verifier's outcome
(``verifier``, ``exact`` by default) is added on the last token. The reward is a list of one float per
completion token. What reaches the advantage depends on the estimator:

* group advantages (``grpo``, the default, and the other row estimators): the list is **summed** into
  one reward per row, so a step judged wrong lowers every token of the row alike;
* ``algo.advantage.name=capo`` (:mod:`mixrl.core.process_advantages`, critic-free, per token): the
  row's outcome on every token plus each token's step reward (``last_credit``: the list without the
  outcome), normalised over the group's tokens: the tokens of a wrong step get their own, lower advantage;
* a critic (``algo=ppo``, ``algo.advantage.name=gae``): the list enters GAE token by token
  (:mod:`mixrl.rewards.registry`, dense rewards).

Token boundaries come from the policy's tokenizer (given at construction, :class:`~mixrl.rewards.protocol.RewardContext`):
token ``k`` ends where the decoded text of tokens ``0..k`` ends.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from mixrl.core.process_rewards import PLACEMENTS, reference_step_scores, step_spans, step_token_rewards, token_char_ends
from mixrl.errors import ConfigError
from mixrl.rewards.components import register_model_reward
from mixrl.rewards.extract import completion_text
from mixrl.rewards.genprm import genprm_param_names, genprm_scorer
from mixrl.rewards.judge import _prompt_text, judge_reward
from mixrl.rewards.protocol import RewardContext
from mixrl.rewards.registry import REWARDS, build_reward, reward_params
from mixrl.rewards.reward_model import reward_model

STEP_TEMPLATE = ("Check one step of a solution.\nProblem: {prompt}\nSolution so far: {previous}\nNext step: {step}\n"
                 "Reference answer: {answer}\nIs the next step correct? Reply 'Verdict: correct' or 'Verdict: incorrect'.")
STEP_PATTERN = r"(?i)verdict\s*:\s*(correct|incorrect)"
SCORERS = ("judge", "model", "genprm")  # the scorers with params of their own (scorer_params)
STEP_SCORERS = (*SCORERS, "reference")  # and the reference solution read step by step (no params)


class ProcessReward:
    """The picklable reward function of ``reward=process``."""

    def __init__(self, *, scorer: Any, scorer_name: str, separator: str, regex: bool, placement: str, step_weight: float,
                 baseline: float, outcome_weight: float, verifier: str, answer_column: str, reference_column: str = "expert",
                 tokenizer: Any = None):
        self.__name__ = "process"
        self.scorer, self.scorer_name = scorer, scorer_name
        self.separator, self.regex, self.placement = separator, regex, placement
        self.step_weight, self.baseline, self.outcome_weight = step_weight, baseline, outcome_weight
        self.answer_column, self.reference_column = answer_column, reference_column
        self.verifier = None if verifier == "none" else build_reward(verifier, answer_column=answer_column)
        self.tokenizer = tokenizer  # the policy's tokenizer (the run's RewardContext): where each completion token ends in the text
        self.last_credit: dict[int, list[float]] = {}  # the last call's step rewards per token (no outcome): row -> list

    def step_scores(self, prompts: Sequence[Any], texts: Sequence[str], spans: list[list[tuple[int, int]]], answers: Sequence[Any],
                    log: Any) -> list[list[float]]:
        """``s_j`` for every step of every completion (one batched call to the scorer). With
        ``scorer=reference`` the ``answers`` are the worked reference solutions."""
        if self.scorer_name == "genprm":  # CAPO: one critique of the whole solution per vote (mixrl.rewards.genprm)
            return self.scorer.step_scores(prompts, texts, spans, answers, log)
        if self.scorer_name == "reference":
            return [reference_step_scores(t, sp, _first(a), self.separator, regex=self.regex)
                    for t, sp, a in zip(texts, spans, answers)]
        flat_prompts, questions, where = [], [], []
        for i, (p, text, sp) in enumerate(zip(prompts, texts, spans)):
            for j, (a, b) in enumerate(sp):
                where.append((i, j))
                flat_prompts.append(p)
                if self.scorer_name == "judge":
                    questions.append(self.scorer.template.format_map(_Fields(
                        prompt=_prompt_text(p), previous=text[:a], step=text[a:b], completion=text[:b], answer=answers[i] or "")))
                else:
                    questions.append(text[:b])
        if not where:
            return [[] for _ in texts]
        if self.scorer_name == "judge":
            raw = self.scorer.score_texts(questions, log, prefix="process")
        else:
            raw = self.scorer.scores(flat_prompts, questions)
        out: list[list[float]] = [[0.0] * len(sp) for sp in spans]
        for (i, j), s in zip(where, raw):
            out[i][j] = 0.0 if s is None else float(s)
        return out

    def __call__(self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None, **kwargs: Any):
        completions = list(completions or [])
        prompts = list(prompts or [""] * len(completions))
        answers = kwargs.get(self.reference_column if self.scorer_name == "reference" else self.answer_column)
        if answers is None or isinstance(answers, str):
            answers = [answers or ""] * len(completions)
        texts = [completion_text(c) for c in completions]
        spans = [step_spans(t, self.separator, regex=self.regex) for t in texts]
        scores = self.step_scores(prompts, texts, spans, answers, kwargs.get("log_metric"))
        step_r = [[self.step_weight * (s - self.baseline) for s in row] for row in scores]
        outcome = [0.0] * len(texts)
        if self.verifier is not None and self.outcome_weight:
            outcome = [self.outcome_weight * (v or 0.0) for v in self.verifier(prompts=prompts, completions=completions, **kwargs)]
        ids = kwargs.get("completion_ids")
        self.last_credit = {}
        if ids is None or self.tokenizer is None:  # no tokens to put them on (a check, an evaluation): the row's sum
            return [sum(r) + o for r, o in zip(step_r, outcome)]
        out = []
        for i, (row_ids, sp, r, o) in enumerate(zip(ids, spans, step_r, outcome)):
            row_ids = list(row_ids)
            ends = token_char_ends([self.tokenizer.decode(row_ids[:k + 1], skip_special_tokens=True) for k in range(len(row_ids))])
            dense = step_token_rewards([b for _, b in sp], ends, r, self.placement) if sp else [0.0] * len(row_ids)
            self.last_credit[i] = list(dense)  # the steps' part alone: algo.advantage.name=capo puts the outcome on every token
            if dense:
                dense[-1] += o
            out.append(dense)
        return out


def scorer_param_names(scorer: str) -> set[str] | None:
    """The keys ``reward.params.scorer_params`` may hold for ``scorer`` (None: not a known scorer): the judge's
    or the reward model's parameters, or genprm's own and its judge's."""
    if scorer == "genprm":
        return genprm_param_names()
    if scorer == "reference":  # the reference solution: no params
        return set()
    return set(reward_params(REWARDS[scorer])) if scorer in SCORERS and scorer in REWARDS else None


def _first(reference) -> str:
    """A reference cell as text: the first of a list of solutions (the ``expert`` column), else the text."""
    if isinstance(reference, (list, tuple)):
        return str(reference[0]) if reference else ""
    return "" if reference is None else str(reference)


class _Fields(dict):
    def __missing__(self, key: str) -> str:
        return ""


@register_model_reward("process")
def process_reward(*, scorer: str = "judge", scorer_params: dict | None = None, separator: str = "\n\n", regex: bool = False,
                   placement: str = "each", step_weight: float = 1.0, baseline: float = 1.0, outcome_weight: float = 1.0,
                   verifier: str = "exact", answer_column: str = "answer", reference_column: str = "expert",
                   context: RewardContext | None = None) -> ProcessReward:
    """Step-level scores (a judge per step, or a reward model on each prefix) put on each step's tokens as a dense reward, plus the verifier's outcome on the last token.

    With the defaults (a judge's correct/incorrect verdict per step, ``baseline=1``, ``placement=each``)
    a step judged right adds 0 and every token of a step judged wrong gets ``-step_weight``: CAPO's
    token-level penalty on top of the rule-based outcome reward. Steps end after each ``separator``.
    With group advantages (``grpo``, the default) the list is summed into one reward per row;
    ``algo.advantage.name=capo`` keeps it per token (critic-free), a critic (``algo=ppo``) feeds it to GAE.

    Formula: r_t = {step_weight} (s_j(t) - {baseline}) placed by {placement} over step j(t)'s tokens, + {outcome_weight} v on the last token; steps split after {separator}

    Paper: "CAPO: Towards Enhancing LLM Reasoning through Generative Credit Assignment" (Xie et al. 2025, arXiv 2508.02298): an LLM as a generative process reward model judges every step in one pass; tokens of wrong steps are penalised on top of the verifiable reward.

    Parameters:
        scorer (str): judge (a verdict per step), genprm (CAPO: critiques of the whole solution listing its wrong steps, voted; mixrl.rewards.genprm), model (a reward model's score of the prompt plus the steps so far) or reference (1 when the step equals the reference solution's step at the same place, else 0).
        scorer_params (dict | None): the params of the judge (reward=judge) or reward model (reward=model); the judge's default template asks about one step.
        separator (str): a step ends after each occurrence (default a blank line; the built-in task's sums: a space).
        regex (bool): separator is a regular expression (a zero-width match cuts before it).
        placement (str): each (every token of the step), last (its last token) or spread (divided over its tokens).
        step_weight (float): the weight of the step scores.
        baseline (float): subtracted from each step score (1: a step judged right adds 0).
        outcome_weight (float): the weight of the verifier's outcome, on the last token.
        verifier (str): exact, math or none; also judges held-out accuracy.
        answer_column (str): the gold answer column.
        reference_column (str): the worked reference solutions scorer=reference reads (the data's expert column).
    """
    if scorer not in STEP_SCORERS:
        raise ConfigError(f"reward 'process': scorer={scorer!r} is not one of {', '.join(STEP_SCORERS)}; fix reward.params.scorer")
    if placement not in PLACEMENTS:
        raise ConfigError(f"reward 'process': placement={placement!r} is not one of {', '.join(PLACEMENTS)}; "
                          "fix reward.params.placement")
    if not separator:
        raise ConfigError("reward 'process': separator is empty; set reward.params.separator (e.g. '\\n\\n')")
    if regex:
        try:
            re.compile(separator)
        except re.error as e:
            raise ConfigError(f"reward 'process': separator {separator!r} is not a regular expression ({e}); "
                              "fix reward.params.separator or set reward.params.regex=false") from None
    params = dict(scorer_params or {})
    if scorer == "reference" and params:
        raise ConfigError(f"reward 'process': scorer=reference takes no scorer_params, got {sorted(params)}; "
                          "remove reward.params.scorer_params")
    try:
        if scorer == "genprm":
            inner = genprm_scorer(**params, context=context)
        elif scorer == "reference":
            inner = None
        elif scorer == "judge":
            inner = judge_reward(**{"template": STEP_TEMPLATE, "pattern": STEP_PATTERN, "scale": 1.0, "verifier": "none", **params},
                                 context=context)
        else:
            inner = reward_model(**{"verifier": "none", **params}, context=context)
    except ConfigError as e:  # the scorer's params live under reward.params.scorer_params
        raise ConfigError(str(e).replace(f"reward '{scorer}'", f"reward 'process' (scorer={scorer})")
                          .replace("reward.params.", "reward.params.scorer_params.")) from None
    except TypeError as e:
        raise ConfigError(f"reward 'process': scorer_params has a key the {scorer} scorer does not take ({e}); "
                          f"see the params of reward={scorer} in docs/components.md") from None
    if verifier != "none" and verifier not in ("exact", "math"):
        raise ConfigError(f"reward 'process': verifier={verifier!r} is not one of exact, math, none; fix reward.params.verifier")
    return ProcessReward(scorer=inner, scorer_name=scorer, separator=separator, regex=bool(regex), placement=placement,
                         step_weight=float(step_weight), baseline=float(baseline), outcome_weight=float(outcome_weight),
                         verifier=verifier, answer_column=answer_column, reference_column=reference_column,
                         tokenizer=context.tokenizer if context is not None else None)
