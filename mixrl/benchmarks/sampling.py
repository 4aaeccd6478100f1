"""Sampling seeded per (problem, sample) pair for HF ``generate``: a sample depends on the seed and
its pair alone, not on which process draws it, the rows beside it in the batch, or which samples a
resumed evaluation already has. Used by the periodic benchmark evaluation
(:func:`mixrl.benchmarks.live.evaluate`) and ``mixrl eval ... benchmarks=`` (:class:`mixrl.benchmarks.runner.HFGenerator`).
"""

from __future__ import annotations


class SeededSampling:
    """Sampling seeded per (problem, sample) pair, so a sample does not depend on which process
    draws it nor on the rows beside it in the batch: the Gumbel-max trick ("A* Sampling", Maddison
    et al., arXiv:1411.0030, §2) on the protocol's temperature and top-p scores.

    Formula: ``token = argmax_v (z_v / T + g_v)`` over the top-p nucleus of ``softmax(z / T)``
    (the other scores -inf), ``g_v = -log(-log u_v)``, ``u ~ U(0, 1)^V`` from a generator seeded by
    ``(seed, pair, position)``; the argmax is distributed as ``softmax`` of the nucleus, as
    transformers' ``do_sample`` draws (there with ``torch.multinomial`` on the batch's shared RNG).
    Decoded greedily (``do_sample=False``) with this processor last."""

    def __init__(self, seed: int, pairs: list[int], temperature: float, top_p: float | None):
        from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper  # deferred: heavy

        self.seed, self.pairs = int(seed), list(pairs)
        self.warpers = LogitsProcessorList([TemperatureLogitsWarper(float(temperature))]
                                           + ([TopPLogitsWarper(float(top_p))] if top_p is not None and top_p < 1.0 else []))

    def batch(self, start: int):
        """The ``LogitsProcessorList`` for the rows ``pairs[start:]`` of one ``generate`` call."""
        from transformers import LogitsProcessorList  # deferred: heavy

        outer, pairs = self, self.pairs[start:]

        class _Gumbel:
            position = 0

            def __call__(self, input_ids, scores):
                import torch  # deferred: imports torch

                scores = outer.warpers(input_ids, scores)
                noise = torch.empty_like(scores, dtype=torch.float32)
                for r in range(scores.shape[0]):
                    g = torch.Generator(device=scores.device)
                    g.manual_seed(((outer.seed * 1_000_003 + pairs[r]) * 100_003 + self.position) % (2**63 - 1))
                    noise[r] = torch.rand(scores.shape[1], generator=g, device=scores.device, dtype=torch.float32)
                self.position += 1
                gumbel = -torch.log(-torch.log(noise.clamp(1e-20, 1.0 - 1e-7)))
                return scores.float() + gumbel

        return LogitsProcessorList([_Gumbel()])
