"""ReMax's baseline at rollout time: one greedy completion per prompt, scored by the run's rewards.

An advantage that lists ``baseline_rewards`` in its ``needs`` (``remax``) gets, per row, the
reward of the greedy (argmax) completion of the row's prompt. :class:`RemaxBaseline` generates it
with the policy through ``transformers.generate`` (``do_sample=False``, the run's max completion
length) once per prompt group on each process, scores it with the run's reward functions and
weights (gathered like the rollouts' rewards, :class:`mixrl.trainer.parts.scoring.Scoring`), and
hands back one value per global row. It costs one extra generation of ``1/num_generations`` of
the batch per step; with vLLM it still generates with the trainer's model (slower).

Paper: ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning Large
Language Models (arXiv:2310.10505).

Owns: nothing that changes (``state_dict() == {}``). Receives at construction: the EOS ids, the
scoring and the generation wrapper (TRL's ``unwrap_model_for_generation``, as a callable);
per call: the policy, its generation config, the batch, its rows and group ids.
Returns: the baseline per global row and ``{"remax/greedy_reward": mean}``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch


class RemaxBaseline:
    """Greedy-completion rewards per prompt (ReMax's baseline)."""

    def __init__(self, *, eos_token_ids, scoring, for_generation: Callable, process_index: int):
        self.eos_token_ids = list(eos_token_ids)
        self.scoring = scoring
        self.for_generation = for_generation  # policy -> context yielding the model to call generate on
        self.process_index = int(process_index)

    def greedy_rewards(self, policy, generation_config, out: dict, inputs: list[dict],
                       group_ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Float [N_global]: the weighted reward of the greedy completion of each row's prompt.
        ``group_ids`` are the global rows' groups; every process calls this (it gathers)."""
        n_local = out["prompt_ids"].shape[0]
        start = self.process_index * n_local
        local_groups = group_ids[start : start + n_local]
        firsts = [i for i in range(n_local) if i == 0 or int(local_groups[i]) != int(local_groups[i - 1])]
        ids, mask = out["prompt_ids"][firsts], out["prompt_mask"][firsts]
        config = copy.deepcopy(generation_config)
        config.do_sample = False
        for k in ("temperature", "top_p", "top_k", "min_p"):  # sampling knobs: transformers warns on them under greedy
            if hasattr(config, k):
                setattr(config, k, None)
        with self.for_generation(policy) as model, torch.no_grad():
            seq = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        completion = seq[:, ids.shape[1] :]
        is_eos = torch.isin(completion, torch.tensor(self.eos_token_ids, device=completion.device))
        ends = torch.where(is_eos.any(1), is_eos.int().argmax(1), torch.full_like(is_eos[:, 0], completion.shape[1], dtype=torch.long))
        completion_ids = [c[: int(e) + 1].tolist() for c, e in zip(completion.cpu(), ends.cpu())]
        # one entry per local row (the rows of a group share their greedy completion): the reward
        # functions see rows exactly as the rollouts' and the gather lines them up with the batch
        owner = torch.cumsum(torch.tensor([1 if i in firsts else 0 for i in range(n_local)]), 0) - 1
        texts = self.scoring.decode(completion_ids)
        rows_text = [texts[int(o)] for o in owner]
        rows_ids = [completion_ids[int(o)] for o in owner]
        rpf = self.scoring.gathered_texts(inputs, rows_text, rows_ids, probe=inputs[0])  # [N_global, F]
        baseline = self.scoring.weighted(rpf)
        return baseline, {"remax/greedy_reward": float(baseline.mean())}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
