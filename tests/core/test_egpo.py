"""FunRL / EGPO (mixrl.core.egpo): A' = A + min(alpha H, |A| / kappa) by hand, the gradient it gives
the policy loss, the stage computing the entropies, and the config's one-line refusals."""

from __future__ import annotations

import math

import pytest
import torch

from mixrl.core import provenance as prov
from mixrl.core.advantage_shaping import SHAPINGS
from mixrl.core.objective import Objective, TermSpec, compute_objective
from mixrl.trainer.parts.advantage_shaping import AdvantageShaping


def _case():
    # row 0: H = (1.0 + 0.5) / 2 = 0.75; row 1: H = 0.2 (its second token is padding); row 2: H = 2.0
    ent = torch.tensor([[1.0, 0.5], [0.2, 9.0], [2.0, 2.0], [0.3, 0.3]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]])
    return ent, mask


def test_the_bonus_is_alpha_h_capped_at_a_share_of_abs_a():
    ent, mask = _case()
    a = torch.tensor([1.0, -1.0, -0.4, 0.0])
    out = SHAPINGS.get("egpo")(a, token_entropy=ent, mask=mask, alpha=0.4, kappa=2.0)
    # row 0: min(0.3, 0.5) = 0.3; row 1: min(0.08, 0.5) = 0.08; row 2: min(0.8, 0.2) = 0.2 (capped);
    # row 3: A = 0 -> cap 0: no bonus
    assert out.tolist() == pytest.approx([1.3, -0.92, -0.2, 0.0])


def test_a_negative_advantage_never_turns_positive_with_kappa_above_one():
    ent = torch.full((3, 4), 50.0)
    a = torch.tensor([-0.1, -1.0, -5.0])
    out = SHAPINGS.get("egpo")(a, token_entropy=ent, mask=torch.ones(3, 4), alpha=1.0, kappa=2.0)
    assert out.tolist() == pytest.approx((a / 2).tolist()) and bool((out < 0).all())


def test_the_shaped_advantage_is_what_the_policy_gradient_carries():
    """REINFORCE-style on one row of 2 tokens at ratio 1: d loss / d logp_t = -A' / 2 (token-mean)."""
    ent, mask = _case()
    shaped = SHAPINGS.get("egpo")(torch.tensor([1.0]), token_entropy=ent[:1], mask=mask[:1], alpha=0.4, kappa=2.0)
    obj = Objective([TermSpec("policy", "policy", ("on_policy",), ("on_policy",), params={"loss": {"name": "ppo_clip"}})])
    logp0 = torch.tensor([[math.log(0.5), math.log(0.25)]])
    logp = logp0.clone().requires_grad_(True)
    loss, _ = compute_objective(obj, logp=logp, mask=torch.ones(1, 2, dtype=torch.bool), advantages=shaped, old_logp=logp0)
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-1.3 / 2, -1.3 / 2])


class _Forwards:
    """Entropies from a table (the forward), as TRL's per-token function returns them."""

    batch_size = 4

    def __init__(self, entropies):
        self.table = entropies

    def logps(self, model, ids, att, logits_to_keep, batch_size=None, compute_entropy=False):
        assert compute_entropy and logits_to_keep == self.table.shape[1]
        return torch.zeros_like(self.table), self.table, None

    def no_checkpointing(self, model):
        import contextlib

        return contextlib.nullcontext()


def test_the_stage_reads_the_entropies_and_leaves_the_expert_row():
    ent, mask = _case()
    out = {"completion_mask": mask, "prompt_ids": torch.ones(4, 3, dtype=torch.long), "prompt_mask": torch.ones(4, 3, dtype=torch.long),
           "completion_ids": torch.ones(4, 2, dtype=torch.long), "row_source": torch.tensor([prov.ON_POLICY] * 3 + [prov.EXPERT])}
    part = AdvantageShaping("egpo", {"alpha": 0.4, "kappa": 2.0}, offpolicy=False, forwards=_Forwards(ent), gather=lambda t: t)
    a = torch.tensor([1.0, -1.0, -0.4, 1.0])
    shaped, metrics = part.shape(None, out, advantages=a, rewards=torch.zeros(4), group_ids=torch.zeros(4, dtype=torch.long),
                                 sources=out["row_source"], include=None, rewards_per_func=None)
    assert shaped.tolist() == pytest.approx([1.3, -0.92, -0.2, 1.0])  # the expert row keeps its A (offpolicy: false)
    assert metrics["shaping/rows"] == pytest.approx(0.75)


# ----------------------------------------------------------------------------- config
def _cfg(overrides):
    from mixrl.config.compose import compose_config

    return compose_config(overrides)


@pytest.mark.parametrize("override, words", [("algo.shaping.alpha=-0.1", "alpha"), ("algo.shaping.kappa=0", "kappa")])
def test_egpo_refusals_are_one_line(override, words):
    from mixrl.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        _cfg(["algo=egpo", override])
    assert words in str(e.value) and "\n" not in str(e.value)


def test_explain_names_the_entropy_forward():
    from mixrl.explain.render import explain_lines

    rows = dict(explain_lines(_cfg(["algo=egpo"])))
    assert rows["shaping"].startswith("egpo: A'_i = A_i + min(0.4 H_i, |A_i| / 2") and "next-token entropies" in rows["shaping"]
