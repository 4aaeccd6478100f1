"""Preference pairs in the RL batch: a source of (prompt, chosen, rejected) rows, and the
injections that append pairs beside the rollouts, on-policy (the best and the worst rollout of a
GRPO group), off-policy (the source's pairs) or both in a stated ratio.

A pair enters the batch as two appended rows (its chosen and its rejected completion of the same
prompt, in no group, advantage 0), linked by the per-row fields the preference terms read
(:mod:`mixrl.core.preference`): ``pair_index``, ``pair_side`` (1 chosen, 0 rejected) and the
partner's sequence log-probs under the policy (now: the policy that trains on the pair this step)
and the reference model, with its length, and both sides' rewards (``pair_reward``,
``pair_partner_reward``; NaN for an off-policy side). The rows are written by
:func:`mixrl.sources.pair_rows.append_sides`. Every pair row gets reference log-probs
(``ref_per_token_logps``) from the reference model, which the run loads because the preference
terms read ``ref_logp``.

Provenance of the two sides:

* ``pair_on_policy``: rows copied from this batch's own rollouts; behaviour ``stored``, with the
  rollout's behaviour log-probs (TRL's ``old_per_token_logps`` when it computed them, else the
  policy's log-probs now, which is the policy that sampled them: appended rows are built after
  the previous optimizer step and before this one);
* ``pair_off_policy``: rows of the source; behaviour ``unknown`` (nobody recorded how they were
  sampled), so no ratio may be taken on them.

Pairs are appended per process; a pair's rows are each other's partner whichever micro-batch
TRL's shuffle puts them in. The rows appended per process are a multiple of the gradient
accumulation, so TRL's split into micro-batches drops none (surplus on-policy pairs are dropped).
"""

from __future__ import annotations

import math
import random


from mixrl.core import provenance as prov
from mixrl.data.cells import _RowError, expert_completions, texts_of
from mixrl.errors import ConfigError, DataError
from mixrl.sources.base import INJECTIONS, SOURCES, InjectContext, Injection, Source
from mixrl.sources.pair_rows import Side, append_sides, row_side
from mixrl.tasks import arith

PAIR_ON_POLICY = prov.register_provenance(
    "pair_on_policy", behaviour="stored",
    description="a side of a pair built from the policy's own rollouts (best vs worst of a group); behaviour: the rollout's log-probs",
).code
PAIR_OFF_POLICY = prov.register_provenance(
    "pair_off_policy", behaviour="unknown",
    description="a side of an off-policy preference pair (from a file or the task's data); behaviour probability unknown",
).code

#: ``rejected_from`` values: where a training row's rejected completion comes from
REJECTED_FROM = ("auto", "column", "arith_careless")


@SOURCES.register("pairs", bounds={"flip": ("[0, 0.5)", "a label-flip rate; at 0.5 or more the labels carry no preference or the reverse one")})
class PairSource(Source):
    """Off-policy preference pairs (prompt, chosen, rejected): rows of a dataset with a column
    mapping (``dataset`` + ``prompt_column`` / ``chosen_column`` / ``rejected_column``), or, with
    ``dataset: null``, the training rows: chosen = the row's expert completion (``data.expert_column``),
    rejected = its ``rejected_column``, or on the built-in task (``rejected_from: arith_careless``) the
    careless demonstrator's solution, which forgets the last term (a wrong answer,
    :func:`mixrl.tasks.arith.careless_solution`; ``auto``, the default: that on the built-in task,
    the column otherwise).

    Formula: (x, y_w, y_l): y_w preferred to y_l; provenance pair_off_policy, no behaviour probability
    Paper: the off-policy preference data of DPO (arXiv 2305.18290) and SimpleMix (arXiv 2505.02363).

    Parameters:
        dataset (None): a file, folder or hub id of preference rows; null: pairs from the training rows.
        prompt_column (prompt): the dataset's prompt column.
        chosen_column (chosen): the dataset's preferred completion (text, or a conversation whose last reply is used).
        rejected_column (rejected): the dispreferred completion (same forms); with dataset null, a column of the training data.
        rejected_from (auto): auto | column | arith_careless (dataset null only: the built-in task's careless solution; auto: that on data=arith, else column).
        flip (0.0): each drawn pair's chosen and rejected sides swapped with this probability (synthetic label noise, for robust DPO's setting; 0: none).
    """

    provenances = ("pair_off_policy",)

    def __init__(self, *, dataset: str | None = None, prompt_column: str = "prompt", chosen_column: str = "chosen",
                 rejected_column: str = "rejected", rejected_from: str = "auto", flip: float = 0.0):
        if rejected_from not in REJECTED_FROM:
            raise ValueError(f"rejected_from must be one of {', '.join(REJECTED_FROM)}, got {rejected_from!r}")
        if dataset and rejected_from == "arith_careless":
            raise ValueError(f"rejected_from={rejected_from} builds rejected completions from the training rows; "
                             "with a dataset, rejected completions come from its rejected_column (rejected_from=column)")
        self.dataset, self.rejected_from = dataset, rejected_from
        self.prompt_column, self.chosen_column, self.rejected_column = prompt_column, chosen_column, rejected_column
        self.pool: list[tuple] = []
        self.flip = float(flip)
        self.reads_expert_column = not dataset

    def prepare(self, train_ds, data_cfg):
        """Build the pool of (prompt, chosen, rejected) once; the training rows are unchanged."""
        if self.rejected_from == "auto":
            builtin = str(getattr(data_cfg, "source", "")).startswith("builtin:arith") if data_cfg is not None else False
            self.rejected_from = "arith_careless" if builtin and not self.dataset else "column"
        triples = self._from_dataset(data_cfg) if self.dataset else self._from_training_rows(train_ds)
        where = self.dataset or "the training data"
        usable = [(p, c, r) for p, c, r in triples if c and r]
        self.pool = [(p, c, r) for p, c, r in usable if c.strip() != r.strip()]  # a zero margin teaches nothing
        equal = len(usable) - len(self.pool)
        if not self.pool:
            if equal:
                raise DataError(f"no preference pair in {where}: every pair's chosen and rejected completions are the same "
                                "text, so the preference terms would train on zero margins; fix the pairs or check "
                                "offpolicy.source.chosen_column / rejected_column")
            raise DataError(f"no preference pair in {where}: every row lacks a chosen or a rejected completion; "
                            "check offpolicy.source.chosen_column / rejected_column")
        notes = []
        if len(triples) - len(usable):
            notes.append(f"{len(triples) - len(usable)} row(s) without a chosen or a rejected completion")
        if equal:
            notes.append(f"{equal} pair(s) whose chosen and rejected completions are the same text (a zero margin)")
        if notes:
            self.notes = (f"pairs source: {len(self.pool)} pair(s) from {where}; dropped {' and '.join(notes)}",)
        return train_ds

    def texts(self) -> list[str]:
        """The pairs' prompts (their text, or messages' contents), chosen and rejected completions."""

        return [t for p, c, r in self.pool for t in (*texts_of(p), c, r)]

    def _from_training_rows(self, train_ds) -> list[tuple]:
        if "expert" not in train_ds.column_names:
            raise DataError("the pairs source takes chosen completions from the training data's expert column, which it has "
                            "none of; set data.expert_column=<column> or offpolicy.source.dataset=<file of pairs>")
        if self.rejected_from == "arith_careless":
            if "solution" not in train_ds.column_names or "level" not in train_ds.column_names:
                raise DataError("offpolicy.source.rejected_from=arith_careless needs the built-in task (data=arith); "
                                "for other data set rejected_from=column and offpolicy.source.rejected_column")
            rejected = [arith.careless_solution(r) for r in train_ds]
        else:
            if self.rejected_column not in train_ds.column_names:
                raise DataError(f"column {self.rejected_column!r} not found in the training data; columns present: "
                                f"{', '.join(train_ds.column_names)}; set offpolicy.source.rejected_column "
                                "(or offpolicy.source.dataset=<file of pairs>)")
            rejected = [_completion(v, i, self.rejected_column, "the training data", "rejected_column", first=True)
                        for i, v in enumerate(train_ds[self.rejected_column])]
        return [(row["prompt"], (row.get("expert") or [None])[0], rej) for row, rej in zip(train_ds, rejected)]

    def _from_dataset(self, data_cfg) -> list[tuple]:
        from mixrl.data.columns import _column_getter  # deferred: mixrl.data's readers load `datasets`; config paths import sources
        from mixrl.data.loading import standardize_rows  # deferred: as above
        from mixrl.data.reading import _load_raw  # deferred: as above

        try:
            raw, where = _load_raw(self.dataset, split="train", subset=None, config_prefix="offpolicy.source")
        except DataError as e:  # the loader names its key <prefix>.source; here it is offpolicy.source.dataset
            raise DataError(str(e).replace("offpolicy.source.source", "offpolicy.source.dataset")) from None
        if len(raw) == 0:
            raise DataError(f"{where} has no rows; point offpolicy.source.dataset at a file of preference pairs")
        prefix = "offpolicy.source"
        get_c = _column_getter(raw, self.chosen_column, "chosen_column", where, prefix, {self.prompt_column})
        get_r = _column_getter(raw, self.rejected_column, "rejected_column", where, prefix, {self.prompt_column, self.chosen_column})
        chosen = [_completion(get_c(r), i, self.chosen_column, where, "chosen_column") for i, r in enumerate(raw)]
        rejected = [_completion(get_r(r), i, self.rejected_column, where, "rejected_column") for i, r in enumerate(raw)]
        ds = standardize_rows(raw, where=where, prompt_column=self.prompt_column, answer_column=None,
                              system_prompt=data_cfg.system_prompt, config_prefix=prefix)
        if len(ds) != len(raw):  # rows with an empty prompt were dropped: keep the columns aligned
            keep = [i for i in range(len(raw)) if raw[i][self.prompt_column]]
            chosen, rejected = [chosen[i] for i in keep], [rejected[i] for i in keep]
        return list(zip(ds["prompt"], chosen, rejected))

    def sample(self, rng: random.Random, n: int) -> list[tuple]:
        """``n`` (prompt, chosen, rejected) drawn from the pool with ``rng``; with ``flip`` > 0, each one's
        sides swapped with that probability (one more draw per pair, so flip 0 keeps the draws as they were)."""
        picks = [self.pool[rng.randrange(len(self.pool))] for _ in range(n)]
        if not self.flip:
            return picks
        return [(p, r, c) if rng.random() < self.flip else (p, c, r) for p, c, r in picks]


def _completion(value, row: int, column: str, where: str, key: str, *, first: bool = False) -> str | None:
    """One side of a pair from a cell (text, a list of texts, or a conversation: its last reply;
    ``first``: the first of a list), or None when empty; DataError naming the row for a cell of
    another type (a number, a list of numbers)."""
    try:
        texts = expert_completions(value)
    except _RowError as e:
        raise DataError(f"row {row} of {where}: {column!r} {e}; fix the data or set offpolicy.source.{key}") from None
    return (texts[0] if first else texts[-1]) if texts else None


@INJECTIONS.register("group_pairs", bounds={"pairs": (">= 1", "pairs appended per step, all processes")})
class GroupPairs(Injection):
    """On-policy preference pairs: after advantages, for up to ``pairs`` groups per step whose
    rewards differ, the best and the worst rollout of the group (by the run's weighted reward;
    the first of tied ones) are appended again as a (chosen, rejected) pair. Groups whose rollouts
    all got the same reward give no pair.

    Formula: y_w = argmax_i r(y_i), y_l = argmin_i r(y_i) over a group {y_1..y_G ~ pi_old(.|x)}, kept iff r(y_w) > r(y_l); up to {pairs} pairs per step
    Paper: on-policy pairs as in SimpleMix (arXiv 2505.02363) and "Iterative Reasoning Preference Optimization" (arXiv 2404.19733): correct vs incorrect samples of the policy.

    Parameters:
        pairs (8): pairs per optimizer step, all processes (a multiple of the processes).
    """

    needs_source = False
    provenances = ("pair_on_policy",)
    #: provenances whose rows get reference log-probs (config validation lets ref_logp terms select them)
    ref_provenances = ("pair_on_policy", "pair_off_policy")
    on_policy_share = 1.0

    def __init__(self, *, pairs: int = 8, source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        self.pairs = int(pairs)
        if geometry is not None and self.pairs % geometry.world_size:
            raise ConfigError(f"algo.inject.pairs={pairs} must be a multiple of the {geometry.world_size} processes")
        self.metrics: dict[str, float] = {}

    def extra_rows_per_step(self, rollouts_per_step: int, unit: int) -> int:
        """At most two rows per pair (fewer when groups tie)."""
        return 2 * self.pairs

    # ---------------------------------------------------------------- counts
    def _targets(self, ctx: InjectContext) -> tuple[int, int]:
        """(on-policy, off-policy) pairs this process appends at most."""
        per_process = self.pairs // max(ctx.num_processes, 1)
        n_on = round(self.on_policy_share * per_process)
        return n_on, per_process - n_on

    def _rng(self, ctx: InjectContext) -> random.Random:
        # a str seed is hashed with SHA-512 by random.Random: the same in every process; hash() of a
        # tuple holding a str is salted per process (PYTHONHASHSEED), and made runs irreproducible
        return random.Random(f"pairs:{self.seed}:{ctx.process_index}:{ctx.global_step}:{ctx.micro_step}")

    # ---------------------------------------------------------------- on-policy pairs
    def _group_pairs(self, ctx: InjectContext, out: dict, rng: random.Random, n: int) -> list[tuple[int, int]]:
        """(chosen row, rejected row) local indices of up to ``n`` groups whose rows are all local
        rollouts and whose rewards differ."""
        if n <= 0 or "mixrl_reward" not in out:
            return []
        reward, group = out["mixrl_reward"].tolist(), out["group_id"].tolist()
        source = out["row_source"].tolist()
        rows: dict[int, list[int]] = {}
        for i, g in enumerate(group):
            if g >= 0:
                rows.setdefault(g, []).append(i)
        found, tied = [], 0
        for g, members in rows.items():
            if len(members) != ctx.num_generations or any(source[i] != prov.ON_POLICY for i in members):
                continue  # a group split over processes, or holding other rows: not a pair of rollouts
            best = max(members, key=lambda i: reward[i])
            worst = min(members, key=lambda i: reward[i])
            if not reward[best] > reward[worst]:
                tied += 1
                continue
            found.append((best, worst))
        self.metrics["pairs/tied_groups"] = float(tied)
        if len(found) > n:
            found = sorted(rng.sample(found, n))
        return found

    # ---------------------------------------------------------------- the hook
    def after_advantages(self, ctx: InjectContext, inputs: list[dict], out: dict) -> dict:
        rng = self._rng(ctx)
        n_on, n_off = self._targets(ctx)
        on = self._group_pairs(ctx, out, rng, n_on)
        off = self.source.sample(rng, n_off) if n_off and self.source is not None else []
        ga = self.geometry.grad_accum if self.geometry is not None else 1
        unit = ga // math.gcd(2, ga)  # pairs whose 2 rows per pair split evenly into ga micro-batches
        surplus = (len(on) + len(off)) % unit
        drop_on = min(surplus, len(on))  # every micro-batch split must keep all rows: drop on-policy pairs first
        on, off = on[: len(on) - drop_on], off[: len(off) - (surplus - drop_on)]
        self.metrics["pairs/on_policy"] = float(len(on))
        self.metrics["pairs/off_policy"] = float(len(off))
        if not on and not off:
            return out
        return self._append(ctx, out, on, off)

    def _append(self, ctx: InjectContext, out: dict, on: list[tuple[int, int]], off: list[tuple]) -> dict:
        sides = [row_side(out, i, PAIR_ON_POLICY) for pair in on for i in pair]
        if off:
            off_prompts = ctx.tokenize_prompts([p for p, _, _ in off])
            sides += [Side(prompt=list(p), completion=ctx.completion_ids(text), code=PAIR_OFF_POLICY)
                      for p, (_, chosen, rejected) in zip(off_prompts, off) for text in (chosen, rejected)]
        return append_sides(ctx, out, sides)


@INJECTIONS.register("pairs", bounds={
    "pairs": (">= 1", "pairs appended per step, all processes"),
    "on_policy": ("[0, 1]", "the share of on-policy pairs among the appended pairs"),
})
class MixedPairs(GroupPairs):
    """Preference pairs mixed in a stated ratio: per step, ``on_policy`` x ``pairs`` on-policy pairs
    (best vs worst rollout of a group, as ``group_pairs``) and the rest off-policy pairs drawn from
    the source (a seeded generator per step). When fewer groups have a reward spread, fewer
    on-policy pairs enter (``pairs/on_policy`` logs how many did).

    Formula: batch = {rollouts} + {round({on_policy} P) pairs (best, worst) of groups} + {P - round({on_policy} P) source pairs}, P = {pairs}
    Paper: SimpleMix, "SIMPLEMIX: Frustratingly Simple Mixing of Off- and On-policy Data in Language Model Preference Learning" (arXiv 2505.02363): the union of on- and off-policy pairs.

    Parameters:
        pairs (8): pairs per optimizer step, all processes (a multiple of the processes).
        on_policy (0.5): share of on-policy pairs, in [0, 1] (0: off-policy pairs only; 1: on-policy only).
    """

    needs_source = True
    sources = ("pairs",)
    may_leave_untrained = ()

    def __init__(self, *, pairs: int = 8, on_policy: float = 0.5, source=None, geometry=None, seed: int = 0):
        super().__init__(pairs=pairs, source=source, geometry=geometry, seed=seed)
        if not 0.0 <= float(on_policy) <= 1.0:
            raise ConfigError(f"algo.inject.on_policy={on_policy} must be in [0, 1]")
        self.on_policy_share = float(on_policy)

    @property
    def provenances(self) -> tuple[str, ...]:
        return tuple(p for p, share in (("pair_on_policy", self.on_policy_share), ("pair_off_policy", 1.0 - self.on_policy_share))
                     if round(share * self.pairs) > 0 or share == 1.0)
