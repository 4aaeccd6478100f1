"""``reward=process`` with ``scorer=genprm``: CAPO's generative PRM, one critique of the whole
solution per vote, the votes combined per step.

CAPO ("CAPO: Towards Enhancing LLM Reasoning through Generative Credit Assignment", Xie et al. 2025,
arXiv 2508.02298) shows a general-purpose LLM the problem and the whole solution with its steps
numbered, and asks it in one pass which steps are wrong; it asks ``votes`` times (sampled) and votes
(:mod:`mixrl.core.step_votes`: majority, union, intersect, average). Step ``j``'s score is
``s_j = 1 - penalty_j``, so with ``reward=process``'s defaults (``baseline=1``, ``placement=each``)
every token of a step voted wrong gets ``-step_weight`` (``-step_weight x share`` for ``average``) on
top of the verifier's outcome: CAPO's R_t = W_whole v - W_process [t in a wrong step].

The judge is ``reward=judge``'s (``scorer_params``: ``backend``, ``path``, ``url``, ``max_tokens``...):
by default the run's starting model (``path=policy``, a frozen copy, as CAPO's PRM is a frozen
off-the-shelf LLM), or any local model folder, or an OpenAI-compatible endpoint. A critique with no
``Wrong steps: [...]`` / ``Wrong steps: none`` abstains (counted: ``process/unparsable``); a solution no
critique could judge gets no step penalty. Critiques are not cached: each vote is a new sample.
A local judge's question over its context is a one-line RewardError.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mixrl.core.step_votes import VOTES, WRONG_STEPS_PATTERN, numbered_steps, parse_wrong_steps, vote
from mixrl.errors import ConfigError
from mixrl.rewards.judge import _Fields, _prompt_text, judge_reward
from mixrl.rewards.protocol import RewardContext
from mixrl.rewards.registry import reward_params

CRITIQUE_TEMPLATE = ("Check every step of a solution to a problem.\nProblem: {prompt}\nReference answer: {answer}\n"
                     "Solution:\n{steps}\nList the numbers of the wrong steps as 'Wrong steps: [2, 4]', "
                     "or write 'Wrong steps: none'.")


class GenPRMScorer:
    """Asks the judge ``votes`` times per solution and votes per step (module docstring).

    ``ask``: texts -> critiques (default: the judge, sampled at ``temperature``); tests pass their own."""

    def __init__(self, *, judge: Any, template: str, pattern: str, votes: int, vote: str, temperature: float, ask=None):
        self.judge, self.template, self.pattern = judge, template, pattern
        self.votes, self.vote, self.temperature = int(votes), vote, float(temperature)
        self.ask = ask
        self.last_penalties: list[list[float]] = []  # the last call's voted penalty per step, per solution

    def __getstate__(self):
        return {**self.__dict__, "ask": None}

    def critiques(self, texts: list[str]) -> list[str]:
        if self.ask is not None:
            return list(self.ask(texts))
        j = self.judge
        if j.backend == "endpoint":  # the endpoint samples at the judge's own temperature (scorer_params.temperature)
            with ThreadPoolExecutor(max_workers=max(1, min(j.concurrency, len(texts)))) as pool:
                return list(pool.map(j.ask_endpoint, texts))
        return j.ask_hf(texts, temperature=self.temperature, strict_context=True)

    def step_scores(self, prompts: Sequence[Any], texts: Sequence[str], spans: list[list[tuple[int, int]]],
                    answers: Sequence[Any], log: Any = None) -> list[list[float]]:
        """``s_j = 1 - penalty_j`` for every step of every solution: one question per solution, asked ``votes`` times."""
        where = [i for i, sp in enumerate(spans) if sp]
        questions = [self.template.format_map(_Fields(prompt=_prompt_text(prompts[i]), answer=answers[i] or "",
                                                      steps=numbered_steps(texts[i], spans[i]), completion=texts[i]))
                     for i in where]
        asked = self.critiques([q for q in questions for _ in range(self.votes)]) if questions else []
        penalties: list[list[float]] = [[0.0] * len(sp) for sp in spans]
        unparsable = 0
        for k, i in enumerate(where):
            parsed = [parse_wrong_steps(c, len(spans[i]), self.pattern) for c in asked[k * self.votes:(k + 1) * self.votes]]
            unparsable += sum(p is None for p in parsed)
            penalties[i] = vote(parsed, len(spans[i]), self.vote)
        self.last_penalties = penalties
        if callable(log) and asked:
            log("process/unparsable", float(unparsable))
            log("process/unparsable_frac", unparsable / len(asked))
            steps = sum(len(p) for p in penalties)
            log("process/wrong_step_frac", sum(sum(p) for p in penalties) / max(steps, 1))
        return [[1.0 - x for x in row] for row in penalties]


def genprm_scorer(*, votes: int = 4, vote: str = "majority", temperature: float = 0.7, template: str = CRITIQUE_TEMPLATE,
                  pattern: str = WRONG_STEPS_PATTERN, context: RewardContext | None = None, **judge_params: Any) -> GenPRMScorer:
    """The scorer of ``reward.params.scorer=genprm``; the other ``scorer_params`` are the judge's (``reward=judge``)."""
    if int(votes) < 1:
        raise ConfigError(f"reward 'process' (scorer=genprm): votes={votes} must be >= 1 (critiques per solution); "
                          "fix reward.params.scorer_params.votes")
    if vote not in VOTES:
        raise ConfigError(f"reward 'process' (scorer=genprm): vote={vote!r} is not one of {', '.join(VOTES)}; "
                          "fix reward.params.scorer_params.vote")
    if int(votes) > 1 and not float(temperature) > 0 and judge_params.get("backend") != "endpoint" and not judge_params.get("url"):
        raise ConfigError(f"reward 'process' (scorer=genprm): votes={votes} at temperature={temperature} asks a greedy judge the "
                          "same question: the votes would be copies; set reward.params.scorer_params.temperature > 0 or votes=1")
    if "{steps}" not in template:
        raise ConfigError("reward 'process' (scorer=genprm): the template has no {steps} field, so the judge would never see "
                          "the numbered steps; add {steps} to reward.params.scorer_params.template")
    # the judge only asks: the question is built here from ``template`` (its own template is unused)
    judge = judge_reward(**{"verifier": "none", "max_tokens": 64, **judge_params, "template": "{completion}",
                            "pattern": pattern, "temperature": float(temperature)}, context=context)
    return GenPRMScorer(judge=judge, template=template, pattern=pattern, votes=int(votes), vote=vote, temperature=float(temperature))


def genprm_param_names() -> set[str]:
    """What ``reward.params.scorer_params`` may hold with ``scorer=genprm``: its own parameters and the judge's
    (the judge's template, pattern and temperature are the scorer's)."""
    own = {k for k in reward_params(genprm_scorer) if k != "judge_params"}
    return own | set(reward_params(judge_reward))
