"""A toy off-policy source (bare final answers) and term (focal NLL): docs/extending.md."""

from __future__ import annotations

import random

from mixrl.core.provenance import register_provenance
from mixrl.core.terms import TERMS, TermInputs, TermOutput
from mixrl.errors import DataError
from mixrl.sources import SOURCES, Source

register_provenance("answer", behaviour="unknown", description="a bare final answer written as a demonstration")


@SOURCES.register("answers")
class AnswerSource(Source):
    """Final answers of the training problems as one-line demonstrations.

    Formula: y = "#### " + answer(x)

    Parameters:
        prefix (####): what precedes the answer.
    """

    provenances = ("answer",)

    def __init__(self, *, prefix: str = "####"):
        self.prefix = prefix
        self.pool: list[tuple] = []

    def prepare(self, train_ds, data_cfg):
        self.pool = [(r["prompt"], f"{self.prefix} {r['answer']}") for r in train_ds if r.get("answer")]
        if not self.pool:
            raise DataError("the answers source found no answer column values; set data.answer_column")
        return train_ds

    def for_prompt(self, row: dict) -> list[str]:  # for group_replace
        return [f"{self.prefix} {row['answer']}"] if row.get("answer") else []

    def sample(self, rng: random.Random, n: int) -> list[tuple]:  # for append_rows
        return [self.pool[rng.randrange(len(self.pool))] for _ in range(n)]


@TERMS.register("focal_nll")
def focal_nll(x: TermInputs, *, gamma: float = 2.0) -> TermOutput:
    """Focal negative log-likelihood on written tokens.

    Formula: l_t = -sg((1 - p_t)^{gamma}) log p_t
    Paper: Focal loss (Lin et al. 2017, "Focal Loss for Dense Object Detection").

    Parameters:
        gamma (2.0): focusing exponent; 0 gives plain NLL.
    """
    weight = (1.0 - x.logp.detach().exp()).clamp(min=0.0) ** gamma
    return TermOutput(-weight * x.logp)
