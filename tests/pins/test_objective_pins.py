"""Objective-level pins: the objective built from each shipped algo and CPU recipe by the
new spine (``mixrl.config.objective.build_objective`` + ``mixrl.core.compute_objective``:
terms selected by per-token provenance) computes, on the pinned micro-batch, the loss and
the gradients (w.r.t. log-probs and entropies) that the code at commit 1f21884 computed
(``objective_pins.json``, written by ``make_pins.py`` from that code).

Cases: 12 algos + 7 recipes, at steps 0 and 7 (mu schedules move), with this micro-batch's
own counts and with global normalisers (as in a larger step split over micro-batches and
processes), as configured, with a KL term and with an entropy bonus. Tolerance: relative
1e-6, absolute 1e-7 (the pinned values are rounded to 9 significant digits).
"""

from __future__ import annotations

import ast
import functools
import json
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from batch import make_batch  # noqa: E402

from mixrl.config.compose import compose_config  # noqa: E402
from mixrl.config.builders import build_objective  # noqa: E402
from mixrl.core.objective import compute_objective, population_key  # noqa: E402
from mixrl.errors import ConfigError  # noqa: E402

PINS = json.loads((HERE / "objective_pins.json").read_text())
REL, ABS = 1e-6, 1e-7
#: the old code's normaliser keys -> the token populations the new terms normalise over
POPULATIONS = {"on_policy": ("on_policy",), "expert": ("expert",), "all": ("on_policy", "expert")}


def _overrides(case: dict) -> list[str]:
    o = case["overrides"]
    return list(ast.literal_eval(o) if isinstance(o, str) else o)


def _rejected(case: dict) -> bool:
    """SFT trains on no rollout token, so a KL or entropy term on rollout tokens is a
    contradiction: the old code trained it silently (and `explain` rejected it); the one
    validation pass now rejects it when the config is composed."""
    o = _overrides(case)
    sft = "algo=sft" in o or "recipe=sft/arith-tiny" in o
    return sft and any(x.startswith(("algo.kl.coef=", "algo.entropy_coef=")) for x in o)


@functools.lru_cache(maxsize=None)
def _objective(overrides: tuple[str, ...]):
    return build_objective(compose_config(list(overrides)))


def _run(case: dict):
    objective = _objective(tuple(_overrides(case)))
    b = make_batch(case["batch"]["kind"], case["batch"]["seed"])
    norm = case["normalisers"]
    if norm is not None:
        norm = {population_key(POPULATIONS[k]): tuple(v) for k, v in norm.items()}
    loss, metrics = compute_objective(
        objective, logp=b["logp"], mask=b["mask"], advantages=b["advantages"],
        token_source=b["row_source"].unsqueeze(1).expand(b["mask"].shape), old_logp=b["old_logp"],
        ref_logp=b["ref_logp"], entropies=b["entropies"], step=case["step"], normalisers=norm,
    )
    loss.backward()
    grad_ent = b["entropies"].grad if b["entropies"].grad is not None else torch.zeros_like(b["entropies"])
    return loss, metrics, b["logp"].grad, grad_ent


@pytest.mark.parametrize("key", list(PINS["cases"]))
def test_objective_pin(key):
    case = PINS["cases"][key]
    if _rejected(case):
        with pytest.raises(ConfigError, match="nothing puts them in the batch"):
            compose_config(_overrides(case))
        return
    loss, metrics, grad_logp, grad_ent = _run(case)
    assert loss.item() == pytest.approx(case["loss"], rel=REL, abs=ABS)
    torch.testing.assert_close(grad_logp, torch.tensor(case["grad_logp"]), rtol=REL, atol=ABS)
    torch.testing.assert_close(grad_ent, torch.tensor(case["grad_entropies"]), rtol=REL, atol=ABS)
    for name in ("loss/total", "clip_frac", "entropy", "mu", "loss/sft", "loss/kl", "expert/token_prob"):
        if name in case["metrics"] and name in metrics:
            assert metrics[name] == pytest.approx(case["metrics"][name], rel=REL, abs=ABS), name


def test_every_shipped_method_is_pinned():
    algos = {_overrides(c)[0] for c in PINS["cases"].values()}
    for name in ("grpo", "dr_grpo", "gspo", "cispo", "topr", "sapo", "m2po", "bapo", "sft", "mix", "chord", "luffy"):
        assert f"algo={name}" in algos
    assert {"recipe=chord/mu-arith-tiny", "recipe=chord/phi-arith-tiny"} <= algos
