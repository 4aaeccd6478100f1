"""``--lengths variable`` inside the generation engine: each row stops at its drawn length.

The engine generates every row with eos suppressed (``min_new_tokens``) and ends row ``i`` after
``lengths[i]`` tokens, as a completion that emitted eos there would end, so an engine that stops
computing finished rows gains what it would gain in training (bench.varlen then makes the last
kept token eos). Both of transformers' engines are covered, on the model they generate with:

* ``generate`` (padded rows, TRL's default and the floor's): a ``StoppingCriteria`` that marks row
  ``i`` done after ``lengths[i]`` new tokens; the batch runs until its longest row is done, the
  finished rows computed on (padded) until then, as in training.
* ``generate_batch`` (continuous batching, ``trainer.generation=continuous``): the same requests
  with a ``max_new_tokens`` each and no eos, in the order given (the continuous engine's own loop,
  ``transformers.generation.continuous_batching.continuous_api.generate_batch``, with per-request
  lengths, which its ``generate_batch`` does not take).

Outside a :meth:`RowStops.lengths` block the engines run unchanged.
"""

from __future__ import annotations

import contextlib

import torch
from transformers import StoppingCriteria, StoppingCriteriaList


class RowLengths(StoppingCriteria):
    """Row ``i`` is done once it has ``lengths[i]`` tokens after the prompt width ``width``."""

    def __init__(self, lengths: list[int], width: int):
        self.lengths, self.width = torch.as_tensor(lengths), int(width)

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        return (input_ids.shape[1] - self.width) >= self.lengths.to(input_ids.device)


class RowStops:
    """Installs the per-row stops on ``model`` (its ``generate`` and ``generate_batch``)."""

    def __init__(self, model):
        self.model, self.pending = model, None
        self._generate, self._generate_batch = model.generate, model.generate_batch
        model.generate, model.generate_batch = self.generate, self.generate_batch

    @contextlib.contextmanager
    def lengths(self, lengths: list[int]):
        """Within: the next generation's rows stop at ``lengths`` (one per row, in order)."""
        self.pending = list(lengths)
        try:
            yield
        finally:
            self.pending = None

    def generate(self, *args, **kwargs):
        if self.pending is None:
            return self._generate(*args, **kwargs)
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        if len(self.pending) != ids.shape[0]:
            raise ValueError(f"{len(self.pending)} drawn lengths for {ids.shape[0]} rows")
        stops = StoppingCriteriaList(kwargs.pop("stopping_criteria", None) or [])
        stops.append(RowLengths(self.pending, ids.shape[1]))
        return self._generate(*args, stopping_criteria=stops, **kwargs)

    def generate_batch(self, inputs, generation_config=None, continuous_batching_config=None, progress_bar=False, **kwargs):
        if self.pending is None:
            return self._generate_batch(inputs, generation_config=generation_config,
                                        continuous_batching_config=continuous_batching_config, progress_bar=progress_bar, **kwargs)
        from transformers.generation.continuous_batching.utils import WorkloadHints  # deferred: transformers' internals

        if len(self.pending) != len(inputs):
            raise ValueError(f"{len(self.pending)} drawn lengths for {len(inputs)} rows")
        hints = WorkloadHints(max_prompt_length=max(map(len, inputs)), max_generated_length=max(self.pending),
                              num_requests=len(inputs))
        results = {}
        with self.model.continuous_batching_context_manager(
                generation_config=generation_config, continuous_batching_config=continuous_batching_config,
                block=True, timeout=5, workload_hints=hints) as manager:
            ids = [manager.add_request(list(x), max_new_tokens=int(n), eos_token_id=-1) for x, n in zip(inputs, self.pending)]
            while len(results) < len(ids):
                out = manager.get_result(timeout=1)
                if out is not None and out.is_finished():
                    results[out.request_id] = out
                elif out is None and not manager.is_running():
                    raise RuntimeError("transformers' continuous-batching engine stopped before every row was generated")
        return {i: results[i] for i in ids}
