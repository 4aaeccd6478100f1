"""Where expert rows enter a batch: the injections of CHORD, LUFFY and SFT."""

from __future__ import annotations

import random

import torch

from mixrl.core import provenance as prov
from mixrl.core.turns import written_spans
from mixrl.errors import ConfigError
from mixrl.sources.base import INJECTIONS, InjectContext, Injection, Rollouts
from mixrl.sources.rows import append_rows


def _code(source) -> int:
    """Provenance code of the rows a source's material fills (its first declared provenance)."""
    return prov.code(source.provenances[0])


def _global_slots(ctx: InjectContext, n_local: int) -> list[int]:
    """Slot within its group of each local row, from the *global* row index: TRL lays a
    group's rows out consecutively across processes, so a group that straddles two
    processes is still handled as one."""
    start = ctx.process_index * n_local
    return [(start + i) % ctx.num_generations for i in range(n_local)]


@INJECTIONS.register("group_replace", bounds={"per_group": (">= 1", "slots of each group that hold an expert completion")})
class GroupReplace(Injection):
    """LUFFY's mixed groups: the last ``per_group`` rollouts of each group are replaced by
    the source's completions of the same prompt (``source.for_prompt(row)``) before rewards
    are computed, so they share the group's reward statistics. Prompts without one keep
    their rollouts.

    Formula: group(x) = {y_1..y_(G-k) ~ pi_old(.|x)} + {k expert completions of x}, k = {per_group}
    Paper: LUFFY, "Learning to Reason under Off-Policy Guidance" (arXiv 2504.14945).

    Parameters:
        per_group (1): expert completions per group (k), between 1 and num_generations - 1.
    """

    #: its rows replace rollouts before TRL scores the batch, so they get reference log-probs too (A-LoL reads them)
    rows_scored_with_rollouts = True

    def __init__(self, *, per_group: int = 1, source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        if geometry is not None and not 1 <= per_group < geometry.num_generations:
            raise ConfigError(
                f"algo.inject.per_group={per_group} must be between 1 and num_generations-1={geometry.num_generations - 1}"
            )
        self.per_group = per_group
        if source is not None:
            source.requires_expert_column = True

    def _replaced(self, slot: int, num_generations: int) -> int | None:
        j = slot - (num_generations - self.per_group)
        return j if j >= 0 else None

    def after_generation(self, ctx: InjectContext, inputs: list[dict], rollouts: Rollouts) -> Rollouts:
        for i, slot in enumerate(_global_slots(ctx, len(rollouts.completion_ids))):
            experts = self.source.for_prompt(inputs[i])
            j = self._replaced(slot, ctx.num_generations)
            if j is None or not experts:
                continue
            rollouts.completion_ids[i] = ctx.completion_ids(experts[j % len(experts)])
            if rollouts.logprobs is not None:
                rollouts.logprobs[i] = [None] * len(rollouts.completion_ids[i])  # behaviour probability unknown
            rollouts.row_source[i] = _code(self.source)
        return rollouts


@INJECTIONS.register("replace_all")
class ReplaceAll(GroupReplace):
    """Supervised fine-tuning as an injection: every slot of every group holds the prompt's
    expert completion; nothing is generated. Prompts without one are dropped.

    Formula: group(x) = G copies of x's expert completions (no rollouts)
    Paper: SFT (the baseline of CHORD, LUFFY and every method that mixes demonstrations).
    """

    skips_generation = True

    def __init__(self, *, source=None, geometry=None, seed: int = 0):
        Injection.__init__(self, source=source, geometry=geometry, seed=seed)
        self.per_group = geometry.num_generations if geometry is not None else 1
        if source is not None:
            source.requires_expert_column = True
            source.missing = "skip"  # SFT trains on expert rows only


@INJECTIONS.register("append_rows", bounds={
    "ratio": ("(0, 1)", "the share of appended rows among all rows of a step"),
    "rows": (">= 1", "appended rows per step"),
})
class AppendRows(Injection):
    """CHORD's auxiliary rows: after advantages are computed, append rows of the source's
    material (other prompts, ``source.sample(rng, n)`` with a seeded generator; advantage 0)
    that enter no group and are trained by their own term.

    Formula: batch = {rollouts} + {E expert rows}, E = ratio / (1 - ratio) * rollouts (or rows)
    Paper: CHORD, "On-Policy RL Meets Off-Policy Experts" (arXiv 2508.11408): 256 rollouts + 64 expert rows.

    Parameters:
        ratio (0.2): fraction of all rows per step that are expert rows.
        rows (None): expert rows per step instead of the ratio (wins when set).
    """

    appends_rows_after_advantages = True

    def __init__(self, *, ratio: float = 0.2, rows: int | None = None, source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        if rows is None and not 0.0 < ratio < 1.0:
            raise ConfigError(f"algo.inject.ratio must be in (0, 1), got {ratio}")
        self.ratio, self.rows = ratio, rows

    def extra_rows_per_step(self, rollouts_per_step: int, unit: int) -> int:
        return appended_rows_per_step(self.ratio, self.rows, rollouts_per_step, unit)

    def sample(self, ctx: InjectContext) -> list[tuple]:
        rng = random.Random(hash((self.seed, ctx.process_index, ctx.global_step, ctx.micro_step)))
        n = self.geometry.expert_rows_per_process
        return self.source.sample(rng, n)

    def after_advantages(self, ctx: InjectContext, inputs: list[dict], out: dict) -> dict:
        if self.geometry.expert_rows_per_process == 0:
            return out
        picks = self.sample(ctx)
        prompt_ids = ctx.tokenize_prompts([p for p, _ in picks])
        completion_ids = [ctx.completion_ids(text) for _, text in picks]
        n = len(picks)
        code = _code(self.source)
        return append_rows(
            out, prompt_ids, completion_ids, pad_id=ctx.tokenizer.pad_token_id,
            row_source=torch.full((n,), code, dtype=torch.long),
            token_source=None if ctx.turn_marks is None else [marked_turns(c, code, ctx.turn_marks) for c in completion_ids],
        )


def marked_turns(completion_ids: list[int], code: int, turn_marks: tuple[int, list[int]]) -> list[int]:
    """Per token of one multi-turn expert completion: ``code`` where the expert wrote it,
    provenance ``environment`` where a tool did (:func:`mixrl.core.turns.written_spans` with the
    chat template's ``turn_marks``), so that no term trains the tool's tokens."""
    written = written_spans(list(completion_ids), *turn_marks)
    return [prov.ENVIRONMENT if w else code for w in written]


def appended_rows_per_step(ratio: float, rows: int | None, rollouts_per_step: int, unit: int) -> int:
    """Rows an appending injection adds per step (``rows``, else ``ratio`` of all rows): a
    multiple of ``unit`` = processes x micro-batches, so every micro-batch of every process
    holds the same number (0.2 with 256 rollouts gives 64, as in CHORD)."""
    if rows is not None:
        if int(rows) < 1 or int(rows) % unit:
            raise ConfigError(
                f"algo.inject.rows={rows} must be a positive multiple of {unit} "
                f"(processes x micro-batches per step), e.g. {max(unit, round(int(rows) / unit) * unit)}"
            )
        return int(rows)
    return max(unit, round(ratio * rollouts_per_step / (1.0 - ratio) / unit) * unit)
