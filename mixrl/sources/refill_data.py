"""``refill_from_data``: AMPO's guidance on demand from answers written in the data (the authors' way).

The AMPO authors (EnigmaYYYY/AMPO @ 647e2e4de7f0bdcd2787fa9941d4dbc317facb7e) do not generate
teacher answers during training: their training file (SII-Enigma/OpenR1-Math-4LongCoTs-8.5k, saved
as data/openr1_math_4longcots.parquet by data/prepare_train.py:4-13) holds, per prompt, a list
``target_lst`` of pre-generated long-CoT answers, each ``{content, source, quality_score}``
(ampo/verl/verl/adaptive_mix_src/rl_dataset_with_target.py:83, 186-207: sorted by quality_score,
cut to ``max_available_targets`` 4 by exp_scripts/train_ampo.sh:26, 108, each tokenized with eos
appended, 249-271). In a guided group (fewer than pass_num 4 of 8 rollouts correct) the row's
answers are ranked by the student's comprehension (off_policy_reward_manager 'prob', sorted:
mix_dapo_trainer.py:1500-1545), the top k = min(#answers, int(8 / 2 - #correct)) are taken
(1378, 1397-1401, 1558) and placed in k failed slots (1453-1457, 1586-1631), scored by the reward
function and injected whether right or wrong (1608-1613: a wrong one is only counted).

Here the same answers come from the data through the ``expert`` source (``offpolicy=expert``,
``data.expert_column`` naming the list column; a list of ``{content, ...}`` records is read as one
completion per record: :func:`mixrl.data.cells.expert_completions`), and :class:`RefillFailed`'s
plan, adaptive k and comprehension ranking place them. Their tokens have the source's provenance
(``expert``: the behaviour probability is unknown, as in the authors' off-policy rows).
"""

from __future__ import annotations

import torch

from mixrl.sources.base import INJECTIONS, InjectContext
from mixrl.sources.inject import _code
from mixrl.sources.refill_failed import RefillFailed


@INJECTIONS.register("refill_from_data", bounds={
    "per_group": (">= 1", "rollouts of a guided group replaced"),
    "guide_below": ("(0, 1]", "a group is guided when its success rate is below it"),
})
class RefillFromData(RefillFailed):
    """AMPO's guidance on demand with the answers the data holds per prompt (the authors' 4
    pre-generated long-CoT answers): when too few rollouts of a group succeed, the row's written
    answers that the student understands best (mean token probability) replace k failed rollouts;
    with ``verify: false`` (the authors') whether right or wrong, with ``verify: true`` only those
    whose reward reaches ``threshold``.

    Formula: if #{i: r(y_i) >= tau} / G < rho: k of the group's failed y_i are replaced by the top-k of x's written answers a (those with r(a) >= tau only if verify, here {verify}) by mean_t pi_theta(a_t | x, a_<t); k = min(#answers, int(G rho - #correct)) if adaptive_k ({adaptive_k}) else per_group ({per_group})
    Paper: AMPO, "More Than One Teacher: Adaptive Multi-Guidance Policy Optimization for Diverse Exploration" (arXiv 2510.02227).

    Parameters:
        per_group (2): written answers per guided group (k) without adaptive_k, between 1 and num_generations - 1.
        threshold (1.0): a rollout fails when its reward is below it (and, with verify, an answer is right at or above it).
        select (likelihood): likelihood (comprehension-based) | random | first (the data's order).
        guide_below (None): a group is guided when its success rate is below this; null: only when every rollout failed.
        adaptive_k (False): k = min(#answers of the row, int(G * guide_below - #correct)) instead of per_group (needs guide_below).
        verify (False): inject only answers whose reward reaches threshold (false: the authors', right or wrong).
    """

    needs_source = True  # the expert source: the data's answer column
    needs_teacher = False
    provenances = None  # its source's (expert)

    def __init__(self, *, per_group: int = 2, threshold: float = 1.0, select: str = "likelihood",
                 guide_below: float | None = None, adaptive_k: bool = False, verify: bool = False,
                 source=None, geometry=None, seed: int = 0):
        super().__init__(per_group=per_group, candidates=1, threshold=threshold, select=select, guide_below=guide_below,
                         adaptive_k=adaptive_k, source=source, geometry=geometry, seed=seed)
        self.verify = bool(verify)
        if source is not None:
            source.requires_expert_column = True  # rows without answers keep their rollouts (source.missing)
            self.row_code = _code(source)

    def writers(self, ctx: InjectContext, inputs: list[dict], n_global: int) -> list[int]:
        """Per global row, the number of answers its prompt has in the data (gathered: every
        process plans every group alike)."""
        local = torch.tensor([len(self.source.for_prompt(row)) for row in inputs], dtype=torch.long, device=ctx.device)
        return [int(v) for v in ctx.gather(local).tolist()]

    def _candidates(self, ctx: InjectContext, row: dict, stats: dict):
        """``(prompt ids, the row's answers as token ids)``, in the data's order; with ``verify`` only
        the right ones. No behaviour log-probs (written answers)."""
        prompt_ids = ctx.tokenize_prompts([row["prompt"]])[0]
        cands = [ctx.completion_ids(text) for text in self.source.for_prompt(row)]
        stats["candidates"] += len(cands)
        if not cands:
            return prompt_ids, []
        ok = (ctx.rewards([row] * len(cands), cands).float() >= self.threshold).tolist()
        stats["correct_candidates"] += sum(ok)
        return prompt_ids, [(c, None) for c, right in zip(cands, ok) if right or not self.verify]
