"""The trainer's side of ``hardware.vllm_async=true`` (``async_generation = k``).

The vLLM server generates the next batch while this one is trained on; the bookkeeping (the
request in flight, the weight versions, the lookahead of the data loader) is
:mod:`mixrl.trainer.async_generation`. This mixin of :class:`mixrl.trainer.grpo.MixrlGRPOTrainer`
routes TRL's vLLM calls through it: each row records the version of the weights that generated
it (``policy_version``) and its behaviour log-probs are computed under that version's weights;
transformers' ``get_batch_samples`` is wrapped so that the next batch's prompts can be read
ahead; ``staleness/*`` and ``async/*`` metrics are logged per generation batch.
"""

from __future__ import annotations

import contextlib

import torch

from mixrl.trainer.async_generation import AsyncGeneration, Lookahead, staleness_stats


class AsyncGenerationHooks:
    """Asynchronous vLLM generation (mixin; reads the trainer's ``vllm_generation``, ``state``,
    ``model``, ``accelerator``, ``async_generation``, ``_async``, ``_lookahead``, ``_metrics``
    and ``_trainable`` of :mod:`mixrl.trainer.staleness`)."""

    def _setup_async(self) -> None:
        """Route TRL's vLLM calls through :class:`AsyncGeneration` (server mode, one process)."""
        vg = self.vllm_generation
        generate, push = vg.generate, vg.sync_weights
        self._async = AsyncGeneration(
            generate=lambda ids, n: generate(prompts=ids, images=None, num_generations=n),
            push=push,
            snapshot=lambda: {n: p.detach().to("cpu", copy=True) for n, p in self._trainable().items()},
            max_staleness=self.async_generation,
        )
        vg.generate = self._async_engine_generate
        vg.sync_weights = lambda: self._async.sync(int(self.state.global_step), training=self.model.training)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """transformers' batch fetch, through a :class:`Lookahead` of the epoch iterator in async
        mode (the next generation batch's prompts are read ahead; the batches are the same)."""
        if self._async is not None:
            if self._lookahead is None or self._lookahead.source is not epoch_iterator:
                self._lookahead = Lookahead(epoch_iterator)
            epoch_iterator = self._lookahead
        return super().get_batch_samples(epoch_iterator, num_batches, device)

    def _async_engine_generate(self, prompts, images, num_generations, profiler=None):
        """``VLLMGeneration.generate`` in async mode: this batch (sent ahead when it could be),
        then, in training, the next batch's prompts sent to the server at once."""
        if images is not None and any(i is not None for i in images):
            raise RuntimeError("hardware.vllm_async=true generates text prompts only")
        training = self.model.training
        result, _ = self._async.generate([list(p) for p in prompts], num_generations, training=training)
        if training:
            nxt = self._async_next_prompts()
            if nxt is not None:
                self._async.submit(nxt, num_generations)
        return result

    def _async_next_prompts(self) -> list[list[int]] | None:
        """The token ids of the next generation batch's prompts (None: no further batch is trained
        in this epoch or run). The next batch is the data loader's next one (num_iterations=1)."""
        if self._lookahead is None or int(self.state.global_step) + 1 >= int(self.state.max_steps):
            return None
        batch = self._lookahead.peek(0)
        if batch is None:
            return None
        return self._tokenize_prompts([x["prompt"] for x in batch])[0]

    def _async_generate_and_score(self, inputs) -> tuple[dict, int]:
        """TRL's generation and scoring in async mode: push the weights first (when the step
        changed), then score under the weights of the version that generated the batch, so that
        ``old_per_token_logps`` (the behaviour log-probs) are that version's."""
        step = int(self.state.global_step)
        if step != self._last_loaded_step:
            self.vllm_generation.sync_weights()
            self._last_loaded_step = step
        expected = self._async.expected_version()
        with self._weights_of_version(expected):
            out = super()._generate_and_score_completions(inputs)
            version = self._async.last_version
            if version != expected:  # the batch in flight was for other prompts (dropped): TRL scored under other weights
                out["old_per_token_logps"] = None
        if out.get("old_per_token_logps") is None:
            with self._weights_of_version(version):
                out["old_per_token_logps"] = self._behaviour_logps(out)
        return out, version

    @contextlib.contextmanager
    def _weights_of_version(self, version: int):
        """The trainable weights of policy ``version`` swapped in (nothing to do for the current step)."""
        if version == int(self.state.global_step):
            yield
            return
        params = self._trainable()
        snapshot = self._async.weights_of(version)
        current = {n: p.detach().to("cpu", copy=True) for n, p in params.items()}
        try:
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(snapshot[n].to(p.device))
            yield
        finally:
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(current[n].to(p.device))

    def _log_async(self, out: dict, mode: str) -> None:
        """``staleness/mean``, ``/max`` over the rows the policy sampled; how long the trainer waited
        for the batch (``async/wait_s``), requests dropped so far (``async/dropped``)."""
        versions = self.accelerator.gather(out["policy_version"]).tolist()
        for key, value in staleness_stats(int(self.state.global_step), versions).items():
            self._metrics[mode][key].append(value)
        self._metrics[mode]["async/wait_s"].append(float(self._async.wait_s))
        self._metrics[mode]["async/dropped"].append(float(self._async.dropped))
