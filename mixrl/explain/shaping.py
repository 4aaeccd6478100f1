"""The ``shaping`` row of ``mixrl explain``: the post-advantage stage (``algo.shaping``), when there is one."""

from __future__ import annotations

from omegaconf import DictConfig

from mixrl.config.shaping import shaping_spec
from mixrl.core.advantage_shaping import SHAPINGS, shaping_needs

#: what each runtime input is, as the row names it
_READS = {
    "token_logp": "the rollouts' log-probs under the policy at rollout time",
    "ref_logp": "the reference model's log-probs of the rollouts",
    "prompt_logp": "the policy's log-probs of the prompts (one no-grad forward per batch)",
    "primary_rewards": "the first reward function's rewards",
    "lengths": "the completion lengths",
    "row_values": "each row's value of a data column",
    "token_entropy": "the policy's next-token entropies over the rollouts (one no-grad forward per batch)",
    "tool_position": "each rollout's first tool-result position (env=tools)",
}


def shaping_row(cfg: DictConfig) -> str | None:
    """``NAME: formula; reads ...; rows shaped: ...``, or None without a shaping."""
    spec = shaping_spec(cfg)
    if spec is None:
        return None
    name, params, offpolicy = spec
    reads = [text for key, text in _READS.items() if key in shaping_needs(SHAPINGS.get(name))]
    rows = ("every row, off-policy ones too (algo.shaping.offpolicy=true)" if offpolicy
            else "the rows the policy sampled; off-policy rows keep the estimator's advantage (algo.shaping.offpolicy=false)")
    text = f"{name}: {SHAPINGS.formula(name, params)}; after the advantage estimator, on {rows}"
    return text + (f"; reads {', '.join(reads)}" if reads else "")
