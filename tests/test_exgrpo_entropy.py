"""ExGRPO's entropy bonus covers every response token of the batch, the replayed rows' too
(ElliottYan/LUFFY ExGRPO/ at commit 01f4ae066249e6965ce0d5512ccdf99a12895c74,
exgrpo/verl/verl/mix_src/mix_actor.py:107 ``response_mask = attention_mask[:, -response_length:]`` and
:184 ``entropy_loss = masked_mean(entropy, response_mask)``, :208 ``pg_loss - entropy_loss * entropy_coeff``
with entropy_coeff=0.001, exp_scripts/run_exgrpo.sh:68). Expected values by hand."""

from __future__ import annotations

import pytest
import torch

from mixrl.config.builders import build_objective
from mixrl.config.compose import compose_config
from mixrl.core import provenance as prov
from mixrl.core.objective import compute_objective
from mixrl.sources.replay import REPLAY


def _batch():
    """Row 0: a rollout, 2 tokens of entropy 1 and 2 (a padded third, entropy 100); row 1: a replayed
    success, 3 tokens of entropy 4."""
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    src = torch.tensor([[prov.ON_POLICY] * 3, [REPLAY] * 3])
    ent = torch.tensor([[1.0, 2.0, 100.0], [4.0, 4.0, 4.0]])
    logp = torch.full((2, 3), -0.5, requires_grad=True)
    return dict(logp=logp, mask=mask, token_source=src, advantages=torch.tensor([0.0, 0.0]),
                old_logp=torch.full((2, 3), -0.5), behaviour_logp=torch.tensor([[float("nan")] * 3, [-0.5] * 3])), ent


@pytest.mark.parametrize("overrides,mean", [
    ([], (1 + 2 + 4 + 4 + 4) / 5),                                    # the authors: every response token (3.0)
    (["algo.entropy_tokens=[on_policy]"], (1 + 2) / 2),               # the earlier reading: rollout tokens (1.5)
])
def test_the_entropy_bonus_averages_the_tokens_the_authors_do(overrides, mean):
    cfg = compose_config(["algo=exgrpo", *overrides])
    obj = build_objective(cfg)
    kw, ent = _batch()
    with_ent, metrics = compute_objective(obj, entropies=ent, **kw)
    without, _ = compute_objective(obj, entropies=torch.zeros_like(ent), **kw)
    assert metrics["loss/entropy_bonus"] == pytest.approx(mean)
    # advantages 0: the policy terms add 0, the loss is -0.001 times the mean entropy
    assert float((with_ent - without).detach()) == pytest.approx(-0.001 * mean)


def test_other_presets_keep_the_bonus_on_rollout_tokens():
    obj = build_objective(compose_config(["algo=grpo", "algo.entropy_coef=0.01"]))
    assert [t.tokens for t in obj.terms if t.kind == "entropy"] == [("on_policy",)]
