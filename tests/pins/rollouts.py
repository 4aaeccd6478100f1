"""Unsampled rollouts for prompts that carry a hint or a demonstration prefix.

``ddp_worker.fixed_completion`` (the rollouts of the first 21 trainer pins) accepts only a bare
arithmetic prompt (``"3+5="``) and raises on anything else; the hint algos (GHPO, GUIDE, POPE)
regenerate under ``prompt + hint`` and the prefix algos (Prefix-RFT, PrefixRL, UFT) continue
from ``prompt + expert prefix``, so their pins need rollouts of such prompts.
``tolerant_completion(text, slot)`` reads the arithmetic expression the text starts with and
answers as ``fixed_completion`` does (right on every other slot, shifted by the text's length;
wrong otherwise, lengths varying): on a bare prompt it IS ``fixed_completion``.
``patch_generation_with(fn)`` installs ``fn`` as ``trl.GRPOTrainer._generate_single_turn``
as ``ddp_worker.patch_generation`` installs ``fixed_completion``, with one difference: a call
with ``num_generations=1`` (mixrl's own regenerations: hinted rollouts, which lose their slot)
numbers its rows by a counter of such rows since the patch was installed, so a regenerated
group still mixes right and wrong completions instead of repeating slot 0.
"""

from __future__ import annotations

import re

_LEADING = re.compile(r"\s*([0-9+\-*]+)=")


def tolerant_completion(text: str, slot: int, batch: int = 0) -> str:
    m = _LEADING.match(text)
    if not m:
        raise ValueError(f"no arithmetic expression starts {text!r}")
    answer = eval(m.group(1))  # noqa: S307 - digits and + - * only
    if (slot + len(text)) % 2 == 1:
        return f"{answer} #### {answer}"
    return f"{slot}{'9' * slot} #### {answer + slot + 1}"


def collapsing_completion(text: str, slot: int, batch: int = 0) -> str:
    """``tolerant_completion`` in the first generation batch; from the second on, every rollout
    is wrong (as if the policy collapsed), so every group is uniform and all-failed: the groups
    ExGRPO (``fill: failed``) and RePO (``fill: same_reward``) refill from the replay buffer with
    the prompt's past rollouts of another reward, when the prompt was seen before."""
    if batch == 0:
        return tolerant_completion(text, slot)
    m = _LEADING.match(text)
    if not m:
        raise ValueError(f"no arithmetic expression starts {text!r}")
    answer = eval(m.group(1))  # noqa: S307 - digits and + - * only
    return f"{slot}{'9' * slot} #### {answer + slot + 1}"


def patch_generation_with(completion) -> None:
    """Replace TRL's single-turn generation by ``completion(decoded prompt, slot in group,
    generation batch)``; the batch counts calls with ``num_generations > 1`` (one per
    generation batch) from 0."""
    import trl

    single = [0]  # rows generated one by one (num_generations=1) so far
    batches = [-1]  # generation batches so far, minus one

    def generate(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        tok = self.processing_class
        start = self.accelerator.process_index * len(prompt_ids)
        if num_generations > 1:
            batches[0] += 1
        out = []
        for i, ids in enumerate(prompt_ids):
            prompt = tok.decode(ids, skip_special_tokens=True)
            if num_generations == 1:
                slot, single[0] = single[0], single[0] + 1
            else:
                slot = (start + i) % num_generations
            text = completion(prompt, slot, max(batches[0], 0))
            out.append(list(tok(text=text, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id])
        return out, None

    trl.GRPOTrainer._generate_single_turn = generate
