"""``mixrl explain``'s rows for the sampler (``cfg.sampler``): which prompts, which groups, which
rows train, with each component's declared formula (``mixrl.sampler`` registries). A config
without an active sampler (mixrl.config.sampler.sampler_active) gets no row, so it explains as
it did before the sampler axis existed."""

from __future__ import annotations

from omegaconf import DictConfig

from mixrl.config.sampler import sampler_active
from mixrl.core.schedules import describe_schedule
from mixrl.explain.schedules import component
from mixrl.sampler import GROUP_FILTERS, PICKERS, ROW_FILTERS


def sampler_rows(cfg: DictConfig) -> list[tuple[str, str]]:
    """``(label, text)`` rows; ``""`` continues the row above. Empty without a sampler."""

    if not sampler_active(cfg):
        return []
    s = cfg.sampler
    pick, pick_params = component(s.pick)
    keep, keep_params = component(s.keep)
    rows = [("sampler", f"{s.name}: prompts: {pick}: {PICKERS.formula(pick, pick_params)}")]
    routed = cfg.algo.inject.get("prompts") == "hard"
    if pick != "data" or routed:
        rows.append(("", f"per-prompt history: Beta(1 + s_i, 1 + f_i) of its accuracy, counts decayed by {s.decay} "
                         "per update; saved in checkpoints" + (f"; bandit arms: data column {s.arms_column}" if s.arms_column else "")))
    if routed:
        rows.append(("", f"routing: the guided injection (algo.inject.prompts=hard) guides only prompts the history marks "
                         f"hard: seen, accuracy estimate (unguided rollouts) < {s.hard_below} (sampler.hard_below)"))
    text = f"groups kept: {keep}: {GROUP_FILTERS.formula(keep, keep_params)}"
    if int(s.max_rounds) > 1:
        text += (f"; up to {s.max_rounds} generation rounds per step until every group of the step is kept "
                 "(then topped up with dropped groups, their advantages set to 0); metric sampler/generated_per_trained")
    rows.append(("", text))
    for label in s.rows or {}:
        name, params = component(s.rows[label])
        rows.append(("", f"rows ({label}): {name}: {ROW_FILTERS.formula(name, params)}; a dropped row's advantage is 0"))
    if s.get("length") is not None:
        rows.append(("", f"max completion length at step t: {describe_schedule(s.length)} (at most trainer.max_completion_length)"))
    return rows
