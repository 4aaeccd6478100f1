"""``math_after_think``: math-verify on the answer after the reasoning, 0 without a closed reasoning.

LUFFY, RL-PLUS and ExGRPO train with ``data.reward_impl_version=3`` (their reward manager puts
``<think>\\n`` before each decoded response, then ``reward_fn_math_verify``): a response scores 1
only when it closes its reasoning with ``</think>`` and the text after it verifies against the
gold answer; everything else scores 0. Read in ElliottYan/LUFFY at commit
01f4ae066249e6965ce0d5512ccdf99a12895c74: ``luffy/verl/verl/mix_src/main_mix_ppo.py`` lines 44-45
(version 3 selects ``reward_fn_math_verify``) and 90-96 (``<think>\\n`` is put before the
response), ``luffy/verl/verl/mix_src/math_verify_reward.py`` lines 14-18 (math-verify ``parse``
with its default extraction on the answer, the gold answer parsed as ``$gold$``, ``verify(gold,
answer)``), 36-41 (the answer is the text between the first ``</think>`` and the next one, or the
end; no ``</think>``: not correct) and 52-57 (the reward is ``is_correct``: 1 or 0, never the
config's -1). ExGRPO's copy (``ExGRPO/exgrpo/verl/verl/mix_src/math_verify_reward.py`` lines
14-25) also scores 0 when parsing raises; mixrl's rewards never raise on model output either.

The prediction is read with math-verify's default extraction (LaTeX, ``\\boxed{}`` at the
library's priority, then plain expressions), as the authors' ``parse(answer)``; this is not
``reward=math``'s ``extract`` order (``\\boxed{}`` first, a ``####`` marker).
"""

from __future__ import annotations

from mixrl.errors import ConfigError
from mixrl.rewards.builtin import AnswerReward, MathVerifier, check_verifier_settings
from mixrl.rewards.registry import register_reward

__all__ = ["ThinkMathVerifier", "math_after_think_reward", "answer_after_reasoning"]


def answer_after_reasoning(text: str, delimiter: str = "</think>") -> str | None:
    """The text after the first ``delimiter`` up to the next one (or the end); None without it."""
    i = text.find(delimiter)
    if i < 0:
        return None
    rest = text[i + len(delimiter):]
    j = rest.find(delimiter)
    return rest if j < 0 else rest[:j]


class ThinkMathVerifier(MathVerifier):
    """:class:`MathVerifier` gated on the closed reasoning, with the authors' parsing: the answer
    after ``delimiter`` read by math-verify's default extraction, the gold answer as ``$gold$``."""

    def __init__(self, delimiter: str, float_rounding: int, numeric_precision: int, strict: bool,
                 timeout_seconds: int | None):
        super().__init__(("latex", "expr"), "####", float_rounding, numeric_precision, strict, timeout_seconds)
        self.delimiter = delimiter

    def _configs(self):
        if getattr(self, "_cfg_pred", None) is None:
            from math_verify import ExprExtractionConfig, LatexExtractionConfig  # deferred: math_verify, 0.5 s

            self._cfg_pred = [LatexExtractionConfig(), ExprExtractionConfig()]  # the library's default, as parse(x)
            self._cfg_gold = self._cfg_pred
        return self._cfg_pred, self._cfg_gold

    def gold(self, gold) -> list:
        from math_verify import parse  # deferred: math_verify, 0.5 s

        return parse("$" + str(gold) + "$", extraction_config=self._configs()[1], parsing_timeout=self._timeout())

    def prediction(self, text: str) -> list:
        from math_verify import parse  # deferred: math_verify, 0.5 s

        answer = answer_after_reasoning(text, self.delimiter)
        if answer is None:
            return []
        return parse(answer, extraction_config=self._configs()[0], parsing_timeout=self._timeout())


@register_reward("math_after_think")
def math_after_think_reward(
    *,
    delimiter: str = "</think>",
    float_rounding: int = 6,
    numeric_precision: int = 15,
    strict: bool = True,
    timeout_seconds: int | None = 5,
    answer_column: str = "answer",
) -> AnswerReward:
    """LUFFY / RL-PLUS / ExGRPO's reward (their ``reward_impl_version=3``): 1.0 when the completion
    closes its reasoning with ``delimiter`` and the text after it (up to a second ``delimiter``)
    verifies against the gold answer with ``math-verify``; 0.0 otherwise, including every
    completion without ``delimiter``. The answer is read with math-verify's default extraction,
    the gold answer as ``$gold$``. The other parameters are ``reward=math``'s.
    """
    if not isinstance(delimiter, str) or not delimiter:
        raise ConfigError(f"reward 'math_after_think': delimiter must be a non-empty string, got {delimiter!r}; fix reward.params.delimiter")
    check_verifier_settings("math_after_think", float_rounding, numeric_precision, timeout_seconds)
    score = ThinkMathVerifier(delimiter, int(float_rounding), int(numeric_precision), bool(strict), timeout_seconds)
    return AnswerReward("math_after_think", score, answer_column)
