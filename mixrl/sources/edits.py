"""``algo.inject.name=edit``: EditGRPO's post-rollout edits, sentence-level corrections put into rollouts.

"EditGRPO: Reinforcement Learning with Post-Rollout Edits for Clinically Accurate Chest X-Ray Report
Generation" (arXiv 2509.22812). As the authors' code (taokz/EditGRPO @
5decc57a61bec99fc907489fcdc735fd9a71ba66):

* per prompt, G/2 rollouts (at least 1) are drawn as sources and G/2 of the others as targets
  (verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py:655-682, ``extractor_num_para=-1``);
* each source is edited by up to ``ops`` operations (``process_text_with_server_analysis``,
  verl/utils/RaTEscore_extractor.py:255-340: replace a false-positive sentence by the most similar
  reference sentence, else delete it, else add a missing one), and the edited text replaces the
  *target's* rollout (vllm_rollout_spmd.py:704-706; a source left unchanged changes nothing), so the
  group keeps the unedited source beside its edited copy;
* the edited row is scored by the reward and joins the group's GRPO advantage
  (verl/trainer/core_algos.py:129-180, std-normalised: ``norm_adv_by_std_in_grpo: true`` in
  examples/editgrpo_mimic_cxr_2_5.yaml), and its old log-probs are the actor's, recomputed after the
  edit (verl/trainer/ray_trainer.py:696-699): the PPO ratio of the edited tokens starts at 1.

Here the editor reads the data's worked solution instead of RaTE-NER entities: the rollout and the
reference are cut into steps (``separator``), a step that differs from the reference's step at the same
place is a false positive and is replaced by that step (their "most similar sentence" is, for step-by-step
solutions, the one at the same place: our reading), a step past the reference's last one is deleted;
"add" is not done. The tokens before the first edit stay ``on_policy`` (sampled by the policy under the
same context); from the first edit on the row is ``edited`` (behaviour ``stored``: the policy's log-probs of
the edited row, recorded when it is placed, as their recomputed old log-probs).
"""

from __future__ import annotations

import random

import torch

from mixrl.core import provenance as prov
from mixrl.core.process_rewards import step_spans
from mixrl.errors import ConfigError
from mixrl.sources.base import INJECTIONS, InjectContext, Injection, Rollouts
from mixrl.sources.step_rectify import kept_tokens

EDITED = prov.register_provenance(
    "edited", behaviour="stored",
    description="a rollout from its first edit on: the editor's sentences and the policy's tokens after them "
                "(EditGRPO; behaviour: the policy's log-probs of the edited row when it was placed)",
).code


def edit_steps(text: str, reference: str, separator: str, ops: int, regex: bool = False) -> tuple[str, int, int]:
    """(edited text, character where the first edit starts, operations done) of ``text`` against
    ``reference``: up to ``ops`` steps, in order, each either replaced by the reference's step at the
    same place (a step that differs from it) or deleted (a step past the reference's last one). No edit:
    (text, len(text), 0).

    Formula: y'_j = ref_j for the first {ops} j with strip(y_j) != strip(ref_j); y_j deleted for j >= |ref|"""
    spans = step_spans(text, separator, regex=regex)
    ref_spans = step_spans(reference, separator, regex=regex)
    pieces, first, done = [], len(text), 0
    for j, (a, b) in enumerate(spans):
        step = text[a:b]
        if done < ops and j >= len(ref_spans):
            step, done, first = "", done + 1, min(first, a)
        elif done < ops and step.strip() != reference[ref_spans[j][0]:ref_spans[j][1]].strip():
            step, done, first = reference[ref_spans[j][0]:ref_spans[j][1]], done + 1, min(first, a)
        pieces.append(step)
    return "".join(pieces), first, done


@INJECTIONS.register("edit", bounds={"per_group": (">= 1", "edited copies per group (sources = targets)")})
class SentenceEdit(Injection):
    """EditGRPO: in each group, ``per_group`` rollouts are edited (up to ``ops`` step replacements against
    the reference solution) and each edited copy replaces another rollout of the group; the edited rows
    are scored and share the group's advantage.

    Sources and targets are drawn per group (G/2 each by default, the authors' rule); an edit that
    changes nothing leaves the target as it was; an edited text longer than the completion budget is cut
    to it (it then counts as truncated). Tokens before the first edit: ``on_policy``; from it on:
    ``edited`` with the policy's log-probs recorded at placement (the PPO ratio starts at 1, as their
    recomputed old log-probs).

    Formula: group(x) = {y_i} with y_t(s) <- edit(y_s, ref) for k = {per_group} source/target pairs; edit: up to {ops} steps replaced by the reference's; edited tokens: provenance edited
    Paper: EditGRPO, "EditGRPO: Reinforcement Learning with Post-Rollout Edits for Clinically Accurate Chest X-Ray Report Generation" (arXiv 2509.22812).

    Parameters:
        ops (1): edit operations per rollout (their extractor_num_ops_per_para).
        per_group (None): edited copies per group, at most num_generations // 2; null = max(1, G // 2) as theirs.
        separator (\\n\\n): a step (sentence) ends after each occurrence (the built-in task's running sums: a space).
        regex (False): separator is a regular expression.
    """

    provenances = ("edited",)

    def __init__(self, *, ops: int = 1, per_group: int | None = None, separator: str = "\n\n", regex: bool = False,
                 source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        G = geometry.num_generations if geometry is not None else None
        if int(ops) < 1:
            raise ConfigError(f"algo.inject.ops must be >= 1 (edit operations per rollout), got {ops}")
        if G is not None and G < 2:
            raise ConfigError(f"algo.inject.name=edit needs algo.num_generations >= 2 (an edited copy replaces another "
                              f"rollout of its group), got {G}")
        if per_group is not None and (int(per_group) < 1 or (G is not None and 2 * int(per_group) > G)):
            raise ConfigError(f"algo.inject.per_group={per_group} must be between 1 and num_generations // 2 = "
                              f"{G // 2 if G else '?'} (each edited copy takes another rollout's slot), or null")
        if not separator:
            raise ConfigError("algo.inject.separator is empty; set it (e.g. '\\n\\n', or ' ' for the built-in task)")
        self.ops, self.per_group, self.separator, self.regex = int(ops), per_group, separator, bool(regex)
        if source is not None:
            source.requires_expert_column = True
        self.metrics: dict[str, float] = {}
        self._rows: list[int] | None = None  # local rows edited in the last batch (for edit/reward)

    def pairs(self, step: int, micro: int, group: int, G: int) -> list[tuple[int, int]]:
        """(source slot, target slot) pairs of one group: a seeded shuffle of the slots, the first k
        sources, the next k targets (the same draw on every process)."""
        k = int(self.per_group) if self.per_group is not None else max(1, G // 2)
        slots = list(range(G))
        random.Random(hash((self.seed, step, micro, group))).shuffle(slots)
        return list(zip(slots[:k], slots[k:2 * k]))

    def edited(self, ctx: InjectContext, row: dict, ids: list[int]) -> tuple[list[int], int, int] | None:
        """(edited ids, tokens kept before the first edit, operations) of one source row, or None."""
        refs = self.source.for_prompt(row) if self.source is not None else []
        if not refs:
            return None
        text = ctx.tokenizer.decode(ids, skip_special_tokens=True)
        new, first, done = edit_steps(text, refs[0], self.separator, self.ops, self.regex)
        if not done or new == text:
            return None
        k, e = kept_tokens(ctx.tokenizer, ids, first)
        rest = list(ctx.tokenizer(text=new[e:], add_special_tokens=False)["input_ids"]) + [ctx.tokenizer.eos_token_id]
        return (list(ids[:k]) + rest)[: ctx.max_completion_length], k, done

    def after_generation(self, ctx: InjectContext, inputs: list[dict], rollouts: Rollouts) -> Rollouts:
        n, G, L, dev = len(rollouts.completion_ids), ctx.num_generations, ctx.max_completion_length, ctx.device
        start = ctx.process_index * n
        plan = {}  # global target row -> global source row
        for g in range(start // G, (start + n - 1) // G + 1):
            for s, t in self.pairs(ctx.global_step, ctx.micro_step, g, G):
                plan[g * G + t] = g * G + s
        ids = torch.full((n, L), -1, dtype=torch.long, device=dev)  # each local source's edited row, for the gather
        meta = torch.zeros((n, 2), dtype=torch.long, device=dev)  # (kept tokens, operations)
        for i in range(n):
            if start + i in plan.values() and rollouts.row_source[i] == prov.ON_POLICY:
                out = self.edited(ctx, inputs[i], list(rollouts.completion_ids[i]))
                if out is not None:
                    ids[i, :len(out[0])] = torch.tensor(out[0], dtype=torch.long, device=dev)
                    meta[i] = torch.tensor(out[1:], dtype=torch.long, device=dev)
        ids, meta = ctx.gather(ids), ctx.gather(meta)
        targets = [i for i in range(n) if start + i in plan and int(meta[plan[start + i], 1]) > 0
                   and rollouts.row_source[i] == prov.ON_POLICY]
        new = [ids[plan[start + i]][ids[plan[start + i]] >= 0].tolist() for i in targets]
        lps = ctx.behaviour_logps([list(rollouts.prompt_ids[i]) for i in targets], new)  # every process joins
        for i, row, lp in zip(targets, new, lps):
            k = int(meta[plan[start + i], 0])
            rollouts.discarded_tokens.append(len(rollouts.completion_ids[i]))
            rollouts.completion_ids[i] = row
            rollouts.token_source[i] = [prov.ON_POLICY] * k + [EDITED] * (len(row) - k)
            rollouts.behaviour_logp[i] = [float(v) for v in lp]
            if rollouts.logprobs is not None:  # sampled under the source's engine, edited after: no engine correction
                rollouts.logprobs[i] = [None] * len(row)
            rollouts.guided[i] = 1  # not the policy's own output: held out of the unguided accuracy
        counts = ctx.gather(torch.tensor([[len(targets), sum(int(meta[plan[start + i], 1]) for i in targets)]],
                                         dtype=torch.float32, device=dev)).sum(0).tolist()
        self.metrics = {"edit/rows": counts[0], "edit/ops": counts[1] / counts[0] if counts[0] else 0.0}
        if ctx.log is not None:
            for key, value in self.metrics.items():
                ctx.log(key, value)
        self._rows = targets
        return rollouts

    def after_rewards(self, ctx: InjectContext, inputs: list[dict], rewards: torch.Tensor) -> torch.Tensor:
        """Logs ``edit/reward``: the mean first reward of this batch's edited rows."""
        rows, self._rows = self._rows, None
        if rows is None or ctx.log is None or ctx.primary_rewards is None:
            return rewards
        mask = torch.zeros(len(inputs), dtype=torch.bool, device=rewards.device)
        mask[rows] = True
        mask = ctx.gather(mask)
        if bool(mask.any()):
            ctx.log("edit/reward", float(torch.nan_to_num(ctx.primary_rewards.to(mask.device), nan=0.0)[mask].mean()))
        return rewards
