"""ReMax's baseline at rollout time: one greedy completion per prompt, scored by the run's rewards.

An advantage that lists ``baseline_rewards`` in its ``needs`` (``remax``) gets, per row, the
reward of the greedy (argmax) completion of the row's prompt. This mixin of
:class:`mixrl.trainer.grpo.MixrlGRPOTrainer` generates it with the policy through
``transformers.generate`` (``do_sample=False``, the run's max completion length) once per
prompt group on each process, scores it with TRL's reward functions and weights (gathered like
the rollouts' rewards), and hands back one value per global row. It costs one extra generation
of ``1/num_generations`` of the batch per step; with vLLM it still generates with the trainer's
model (slower). Logged: ``remax/greedy_reward``.
"""

from __future__ import annotations

import copy

import torch
from trl.data_utils import is_conversational
from trl.models import unwrap_model_for_generation


class RemaxBaseline:
    """Greedy-completion rewards (mixin; reads the trainer's ``model_wrapped``, ``accelerator``,
    ``generation_config``, ``processing_class``, ``eos_token_ids``, ``reward_weights``)."""

    def _greedy_baseline_rewards(self, out: dict, inputs: list[dict], group_ids: torch.Tensor, mode: str) -> torch.Tensor:
        """Float [N_global]: the weighted reward of the greedy completion of each row's prompt.
        ``group_ids`` are the global rows' groups; every process calls this (it gathers)."""
        device = self.accelerator.device
        n_local = out["prompt_ids"].shape[0]
        start = self.accelerator.process_index * n_local
        local_groups = group_ids[start : start + n_local]
        firsts = [i for i in range(n_local) if i == 0 or int(local_groups[i]) != int(local_groups[i - 1])]
        ids, mask = out["prompt_ids"][firsts], out["prompt_mask"][firsts]
        config = copy.deepcopy(self.generation_config)
        config.do_sample = False
        for k in ("temperature", "top_p", "top_k", "min_p"):  # sampling knobs: transformers warns on them under greedy
            if hasattr(config, k):
                setattr(config, k, None)
        with unwrap_model_for_generation(self.model_wrapped, self.accelerator) as model, torch.no_grad():
            seq = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        completion = seq[:, ids.shape[1] :]
        is_eos = torch.isin(completion, torch.tensor(self.eos_token_ids, device=completion.device))
        ends = torch.where(is_eos.any(1), is_eos.int().argmax(1), torch.full_like(is_eos[:, 0], completion.shape[1], dtype=torch.long))
        completion_ids = [c[: int(e) + 1].tolist() for c, e in zip(completion.cpu(), ends.cpu())]
        texts = self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        # one entry per local row (the rows of a group share their greedy completion): the reward
        # functions see rows exactly as the rollouts' and the gather lines them up with the batch
        owner = torch.cumsum(torch.tensor([1 if i in firsts else 0 for i in range(n_local)]), 0) - 1
        rows_text = [texts[int(o)] for o in owner]
        rows_ids = [completion_ids[int(o)] for o in owner]
        prompts = [x["prompt"] for x in inputs]
        if is_conversational(inputs[0]):
            completions = [[{"role": "assistant", "content": t}] for t in rows_text]
        else:
            completions = rows_text
        rpf = super()._calculate_rewards(inputs, prompts, completions, rows_ids)  # TRL's, gathered: [N_global, F]
        baseline = (rpf * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)
        self._metrics[mode]["remax/greedy_reward"].append(float(baseline.mean()))
        return baseline
