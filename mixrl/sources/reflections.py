"""R³L's trained reflections: the policy's own reflection on an attempt, trained with reward 1 when it helped.

R³L ("R³L: Reflect-then-Retry Reinforcement Learning with Language-Guided Exploration, Pivotal
Credit, and Positive Amplification", arXiv 2601.03715). In the authors' math workflow
(shiweijiezero/R3L @ d503f6c6b0725a4e8a39311e6f9b71de6bb2f64b,
trinity/common/workflows/envs/R3L/dapo/R3L_workflow.py) the policy reflects on each first
attempt (``get_reflect``, lines 132-172: the reflection prompt prompts/reflection.j2 as system
message, the attempt's log as user message); the reflection is trained as its own experience
(its own group, task ``<id>_reflect_<i>``) with reward 1 when

* it rates a correct attempt perfect (``trajectory_outcome: success``; lines 284-291: "If first
  attempt reward is 1.0 and reflection gives perfect, record reflection exp"), or
* the retry it guided succeeds and beats the attempt (lines 362-375: ``second_reward > reward``
  and ``second_reward >= 1.0``),

and, being alone in its group, it gets the success advantage of ``opmd_reweight_adv``, A = 1.

Here (``refine`` injection, ``feedback: self``, ``train_reflections: k``): the reflections the
policy wrote on failed attempts whose retry succeeded, and, with ``reflect_correct``, its
reflections on correct attempts that contain ``perfect``, are appended after the advantages as
rows of the reflection request (provenance ``reflection``, behaviour log-probs recorded when
written) with advantage ``reflection_advantage`` (1), at most k per step. Not here: their
reflection is a JSON report, validated (utils.py:387-449) and turned into guidance
(self_correction.j2); here the reflection's text is the feedback as written, "perfect" is a
substring test; their retry with the guidance in context is also trained (``retry_exp``, reward
1), here only the retry under the original prompt (the ``refined`` row). The ``reflection``
provenance is registered in :mod:`mixrl.sources.with_feedback`, after ``refined`` (codes follow
registration order).
"""

from __future__ import annotations

import torch

from mixrl.core import provenance as prov
from mixrl.errors import ConfigError
from mixrl.sources.rows import append_rows

class Reflections:
    """The reflections to train this step (per process; nothing to checkpoint: emptied every step).

    ``cap``: at most this many rows per step, all processes (0: off); ``advantage``: theirs;
    ``perfect``: the text that marks a reflection rating its attempt perfect; ``correct``: reflect on
    correct attempts too."""

    def __init__(self, *, cap: int, advantage: float, perfect: str, correct: bool, feedback: str):
        if int(cap) < 0:
            raise ConfigError(f"algo.inject.train_reflections must be >= 0, got {cap}")
        if int(cap) and feedback != "self":
            raise ConfigError(f"algo.inject.train_reflections={cap} trains the policy's own reflections, but "
                              f"algo.inject.feedback={feedback!r} is not written by the policy; use algo.inject.feedback=self "
                              "or algo.inject.train_reflections=0")
        if correct and not int(cap):
            raise ConfigError("algo.inject.reflect_correct=true reflects on correct attempts to train the reflections; "
                              "set algo.inject.train_reflections > 0 too")
        if correct and not perfect:
            raise ConfigError("algo.inject.reflect_correct=true needs algo.inject.perfect, the text of a reflection "
                              "that rates its attempt perfect (e.g. 'success')")
        self.cap, self.advantage, self.perfect, self.correct = int(cap), float(advantage), perfect, bool(correct)
        self.pending: list = []  # Written reflections to append at this step's after_advantages

    def rates_perfect(self, text: str) -> bool:
        return bool(self.perfect) and self.perfect.lower() in text.lower()

    def keep(self, written) -> None:
        self.pending.append(written)

    def rows(self, ctx, out: dict, *, per_process: int, unit: int) -> tuple[dict, int]:
        """``out`` with the pending reflections appended (at most ``per_process``, a multiple of
        ``unit`` = micro-batches, so that every micro-batch holds the same number), and how many."""
        picks = self.pending[:per_process]
        picks = picks[: len(picks) // unit * unit]
        self.pending = []
        if not picks:
            return out, 0
        return append_rows(out, [w.context_ids for w in picks], [w.ids for w in picks], pad_id=ctx.tokenizer.pad_token_id,
                           row_source=torch.full((len(picks),), prov.code("reflection"), dtype=torch.long),
                           behaviour_logp=[w.behaviour_logp for w in picks],
                           advantages=torch.full((len(picks),), self.advantage, dtype=out["advantages"].dtype)), len(picks)
