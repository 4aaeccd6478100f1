"""What the trainer offers injections: the :class:`mixrl.sources.base.InjectContext`.

An injection (:mod:`mixrl.sources`) sees the trainer only through this context: the tokenizer,
the process layout, the step counters, and callables to generate with the policy (TRL's own
generation path, so vLLM, sampling settings and EOS handling are the rollouts'), to score
completions with the run's reward functions, to compute the policy's behaviour log-probs, to
log a metric, and the teacher service's callables (:mod:`mixrl.trainer.teacher_service`).
This mixin of :class:`mixrl.trainer.grpo.MixrlGRPOTrainer` builds it; the ``super()`` calls
below reach TRL's own ``_generate_single_turn`` and ``_calculate_rewards`` (not mixrl's
overrides), as they did when these methods lived on the trainer class.
"""

from __future__ import annotations

import torch
from trl.data_utils import is_conversational
from trl.trainer.grpo_trainer import use_adapter

from mixrl.sources.base import InjectContext
from mixrl.trainer.teacher_service import _SELF


class InjectionServices:
    """The injections' context (mixin; must come before TRL's ``GRPOTrainer`` in the MRO)."""

    def _inject_context(self) -> InjectContext:
        return InjectContext(
            tokenizer=self.processing_class,
            process_index=self.accelerator.process_index,
            num_processes=self.accelerator.num_processes,
            num_generations=self.num_generations,
            max_completion_length=self.max_completion_length,
            global_step=self.state.global_step,
            micro_step=self._step,
            device=self.accelerator.device,
            tokenize_prompts=lambda prompts: self._tokenize_prompts(prompts)[0],
            gather=self.accelerator.gather,
            generate=self._mixrl_generate,
            score=self._mixrl_score,
            behaviour_logps=self._mixrl_behaviour_logps,
            ref_logps=self._mixrl_ref_logps if self.beta != 0.0 else None,
            log=lambda key, value: self._metrics["train"][key].append(float(value)),
            teachers=[m for m in self._teacher_models if m is not _SELF],
            policy=self.model,
            rewards=self._local_rewards,
            generate_with=self._sample,
            score_tokens=self._score_token_lists,
            prompt_hard=self._sampler_hard if self.sampler is not None else None,
        )

    def _mixrl_generate(self, prompt_ids: list[list[int]]):
        """One completion per prompt, sampled by the policy (TRL's own generation path, so
        vLLM, sampling settings and EOS handling are the rollouts'). A process with no
        prompt skips the call unless vLLM server mode gathers prompts over processes, or the
        policy is sharded (:meth:`_forwards_collective`): then it generates from a one-token
        dummy prompt and drops the result, so that it joins every forward of the others."""
        if not prompt_ids and not (self.use_vllm and getattr(self.args, "vllm_mode", "") == "server"):
            if self._forwards_collective():
                super()._generate_single_turn([[self._dummy_token()]], None, {}, 1)
            return [], None
        return super()._generate_single_turn([list(p) for p in prompt_ids], None, {}, 1)

    def _mixrl_score(self, inputs: list[dict], completion_ids: list[list[int]]) -> torch.Tensor:
        """The reward functions on local (row, completion) pairs, gathered over processes: [N_global, F]."""
        texts = self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        prompts = [x["prompt"] for x in inputs]
        if prompts and is_conversational({"prompt": prompts[0]}):
            completions = [[{"role": "assistant", "content": t}] for t in texts]
        else:
            completions = texts
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids)

    def _mixrl_behaviour_logps(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """Per-token log-probs of ``completion_ids[i]`` after ``prompt_ids[i]`` under the policy
        as it is now (the behaviour of a completion sampled in another context than the one
        it is trained in). No gradient."""
        return self._score_token_lists(_SELF, prompt_ids, completion_ids)

    def _mixrl_ref_logps(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """Per-token log-probs of ``completion_ids[i]`` after ``prompt_ids[i]`` under the reference
        model, as TRL computes them for rollouts: its ``ref_model``, or with a PEFT adapter the
        base model (the adapter disabled; an initial copy named "ref" when re-training one). No gradient."""
        if self.ref_model is not None:
            return self._score_token_lists(self.ref_model, prompt_ids, completion_ids)

        model = self.accelerator.unwrap_model(self.model)
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            return self._score_token_lists(_SELF, prompt_ids, completion_ids)

    def _injecting(self) -> bool:
        return bool(self.injections) and self.model.training and self._mixrl_batch_inputs is not None
