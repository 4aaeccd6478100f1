"""What a new policy loss costs: its function with the formula in its docstring, its
registration, and its test. Nothing else in mixrl is edited.

The toy loss below lives in a module written into a temporary folder (as a user's plugin, or
as a new function in ``mixrl/core/policy_losses.py`` would be): place 1 is the function,
place 2 its ``@POLICY_LOSSES.register`` line with ``bounds=``, place 3 this test. With only
that, the loss composes (``algo.loss.name=``), its parameter is range-checked from its
``bounds`` at compose time, ``mixrl explain`` prints its formula with the value filled in, the
objective computes it, and a training step runs with it.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from mixrl.config.compose import compose_config
from mixrl.errors import ConfigError

PLUGIN = "toy_scaled_pg"
SOURCE = textwrap.dedent('''
    """A toy policy loss: the on-policy policy gradient, scaled."""
    from mixrl.core.policy_losses import POLICY_LOSSES, PolicyLossOutput

    CALLS = []  # (scale, number of selected tokens) per call: the training test reads it


    @POLICY_LOSSES.register("scaled_pg", bounds={"scale": ("> 0", "a scale <= 0 removes or inverts the gradient")})
    def scaled_pg(logp, old_logp, advantages, mask, *, scale: float = 1.0) -> PolicyLossOutput:
        """Scaled policy gradient (a toy).

        Formula: ``l_t = -{scale} A logp_t``

        Paper: none (a test of what a new loss costs).
        """
        CALLS.append((scale, int(mask.sum())))
        adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
        loss = -scale * adv * logp * mask
        return PolicyLossOutput(per_token_loss=loss, clipped=mask.new_zeros(mask.shape, dtype=bool), metrics={})
''')
OVERRIDES = [f"plugins=[{PLUGIN}]", "algo=grpo", "algo.loss.name=scaled_pg", "algo.loss.scale=0.5"]


@pytest.fixture()
def plugin(tmp_path):
    (tmp_path / f"{PLUGIN}.py").write_text(SOURCE)
    sys.path.insert(0, str(tmp_path))
    yield
    sys.path.remove(str(tmp_path))
    sys.modules.pop(PLUGIN, None)
    from mixrl.core.policy_losses import POLICY_LOSSES

    POLICY_LOSSES._items.pop("scaled_pg", None)  # so the next test's import registers it afresh
    POLICY_LOSSES._bounds.pop("scaled_pg", None)


def test_the_loss_composes_is_range_checked_and_explained(plugin):
    from mixrl.explain import explain_text

    cfg = compose_config(OVERRIDES)
    assert cfg.algo.loss.name == "scaled_pg" and cfg.algo.loss.scale == 0.5
    assert "clip_low" not in cfg.algo.loss  # the old loss's parameters are dropped
    text = explain_text(cfg)
    assert "scaled_pg" in text and "-0.5 A logp_t" in text
    with pytest.raises(ConfigError, match="scale"):
        compose_config([*OVERRIDES[:-1], "algo.loss.scale=-1"])  # its bounds, read by the validator
    with pytest.raises(ConfigError, match="no_such"):
        compose_config([*OVERRIDES, "algo.loss.no_such=1"])  # its signature is its config schema


def test_the_loss_value_and_gradient_by_hand(plugin):
    cfg = compose_config(OVERRIDES)
    from mixrl.config.builders import build_objective
    from mixrl.core.objective import compute_objective
    from mixrl.core.provenance import code

    obj = build_objective(cfg)
    logp = torch.tensor([[-0.5, -1.0], [-2.0, -0.1]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    src = torch.full((2, 2), code("on_policy"))
    loss, _ = compute_objective(obj, logp=logp, mask=mask, advantages=adv, token_source=src,
                                behaviour_logp=logp.detach())
    # token-mean over the 3 selected tokens of l_t = -0.5 A logp_t
    by_hand = (-0.5 * 1.0 * -0.5 + -0.5 * 1.0 * -1.0 + -0.5 * -2.0 * -2.0) / 3
    assert loss.item() == pytest.approx(by_hand, rel=1e-6)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.5 / 3, -0.5 / 3], [1.0 / 3, 0.0]]), rtol=1e-6)


def test_a_training_step_runs_with_it(plugin, tiny_model_path, tmp_path):
    from conftest import FAST

    from mixrl.trainer.build import trainer_from_config

    cfg = compose_config([*OVERRIDES, *FAST, "trainer.max_steps=1", f"model.path={tiny_model_path}",
                          f"run_dir={tmp_path / 'run'}"])
    trainer = trainer_from_config(cfg)
    calls = sys.modules[PLUGIN].CALLS
    calls.clear()
    trainer.train()
    assert calls and all(scale == 0.5 and n > 0 for scale, n in calls)  # the step's loss went through it
    assert trainer.state.global_step == 1
