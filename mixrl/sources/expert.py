"""The ``expert`` source: written demonstrations, from the training data or a separate dataset."""

from __future__ import annotations

import random

from mixrl.errors import DataError
from mixrl.sources.base import SOURCES, Source


@SOURCES.register("expert")
class ExpertSource(Source):
    """Expert completions: the training data's expert column (``data.expert_column``), or a
    separate dataset (``dataset`` + ``column``). Tokens taken from it have provenance
    ``expert``: their behaviour probability is unknown.

    Formula: (x, y) with y a written demonstration of prompt x; provenance expert, no behaviour probability
    Paper: demonstrations as used by CHORD (arXiv 2508.11408) and LUFFY (arXiv 2504.14945).

    Parameters:
        dataset (None): a separate dataset of prompts with expert completions (file, folder or hub id).
        column (None): its expert column (default: data.expert_column).
        missing (on_policy): training prompts without an expert completion: on_policy | skip | error.
    """

    provenances = ("expert",)
    reads_expert_column = True

    def __init__(self, *, dataset: str | None = None, column: str | None = None, missing: str = "on_policy"):
        if missing not in ("on_policy", "skip", "error"):
            raise ValueError(f"missing must be on_policy, skip or error, got {missing!r}")
        self.dataset, self.column, self.missing = dataset, column, missing
        self.pool: list[dict] = []
        self.requires_expert_column = False  # set by an injection that reads completions per prompt

    # ----------------------------------------------------------------- setup
    def prepare(self, train_ds, data_cfg):
        """Apply ``missing`` to the training rows an injection reads per prompt, and build
        the pool of (prompt, completions) that injections sample from."""
        if self.requires_expert_column or not self.dataset:
            train_ds = self._apply_missing(train_ds)
        self.pool = self._pool(train_ds, data_cfg)
        return train_ds

    def _apply_missing(self, train_ds):
        if "expert" not in train_ds.column_names:
            raise DataError(
                "the expert source needs expert completions but the training data has none; "
                "set data.expert_column=<column with expert solutions> (or offpolicy.source.dataset)"
            )
        missing = sum(1 for e in train_ds["expert"] if not e)
        if missing == 0:
            return train_ds
        if self.missing == "error":
            raise DataError(
                f"{missing} of {len(train_ds)} training prompts have no expert completion; "
                "set offpolicy.source.missing=skip to drop them or on_policy to train them on rollouts only"
            )
        if self.missing == "skip":
            kept = train_ds.filter(lambda row: bool(row.get("expert")))
            if len(kept) == 0:
                raise DataError("no training prompt has an expert completion; check data.expert_column")
            return kept
        return train_ds  # on_policy: those prompts get rollouts only

    def _pool(self, train_ds, data_cfg) -> list[dict]:
        if self.dataset:
            from mixrl.data.loading import load_dataset_rows  # deferred: datasets, 1 s; config show/plan import this module

            ds = load_dataset_rows(
                self.dataset, prompt_column=data_cfg.prompt_column, answer_column=None,
                expert_column=self.column or data_cfg.expert_column, system_prompt=data_cfg.system_prompt,
                config_prefix="offpolicy",
            )
        else:
            ds = train_ds
        pool = [{"prompt": r["prompt"], "expert": r["expert"]} for r in ds if r.get("expert")]
        if not pool:
            raise DataError(
                "the expert pool is empty: no row has an expert completion; check data.expert_column / offpolicy.source.dataset"
            )
        return pool

    def texts(self) -> list[str]:
        """The prompts and completions of ``offpolicy.source.dataset`` (the training rows' own are checked with them)."""
        if not self.dataset:
            return []
        from mixrl.config.checks import texts_of  # deferred: config.checks imports this package's registries

        return [t for row in self.pool for t in (*texts_of(row["prompt"]), *row["expert"])]

    # ----------------------------------------------------------------- material
    @staticmethod
    def for_prompt(row: dict) -> list[str]:
        """The expert completions of one training row (empty if it has none)."""
        return list(row.get("expert") or [])

    def sample(self, rng: random.Random, n: int) -> list[tuple]:
        """``n`` (prompt, completion) pairs drawn from the pool with ``rng``."""
        picks = []
        for _ in range(n):
            row = self.pool[rng.randrange(len(self.pool))]
            picks.append((row["prompt"], row["expert"][rng.randrange(len(row["expert"]))]))
        return picks
