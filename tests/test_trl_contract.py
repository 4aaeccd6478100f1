"""The contract between ``MixrlGRPOTrainer`` and TRL's ``GRPOTrainer``.

``mixrl.trainer.grpo.OVERRIDDEN`` lists every TRL method mixrl replaces. Those methods are
private API: a TRL release may rename, reorder or add parameters without notice. The
parent signatures are pinned below, written out by hand for TRL 1.16.x; an upgrade that
changes one fails here with the method's name, instead of failing mid-training.

To upgrade TRL: read the changed method in TRL, adapt the override in
``mixrl/trainer/grpo.py``, then update ``PINNED`` and ``TRL_SPEC`` here and in pyproject.toml.
"""

from __future__ import annotations

import inspect
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

REQUIRED = "<required>"

#: parent (``trl.GRPOTrainer``) signatures in TRL 1.16.x: ((parameter, default), ...)
PINNED: dict[str, tuple[tuple[str, object], ...]] = {
    "_generate_single_turn": (
        ("self", REQUIRED),
        ("prompt_ids", REQUIRED),
        ("images", REQUIRED),
        ("multimodal_fields", REQUIRED),
        ("num_generations", REQUIRED),
        ("has_tool_images", False),
    ),
    "_calculate_rewards": (
        ("self", REQUIRED),
        ("inputs", REQUIRED),
        ("prompts", REQUIRED),
        ("completions", REQUIRED),
        ("completion_ids_list", REQUIRED),
    ),
    "_generate_and_score_completions": (
        ("self", REQUIRED),
        ("inputs", REQUIRED),
    ),
    "_tool_call_loop": (
        ("self", REQUIRED),
        ("prompts", REQUIRED),
        ("prompt_ids", REQUIRED),
        ("completion_ids", REQUIRED),
        ("completions", REQUIRED),
        ("logprobs", REQUIRED),
        ("images", REQUIRED),
        ("multimodal_fields", REQUIRED),
    ),
    "_compute_loss": (
        ("self", REQUIRED),
        ("model", REQUIRED),
        ("inputs", REQUIRED),
    ),
    "_get_per_token_logps_and_entropies": (
        ("self", REQUIRED),
        ("model", REQUIRED),
        ("input_ids", REQUIRED),
        ("attention_mask", REQUIRED),
        ("logits_to_keep", REQUIRED),
        ("batch_size", None),
        ("compute_entropy", False),
        ("compute_aux_loss", False),
        ("pixel_values", None),
        ("image_grid_thw", None),
        ("num_images", None),
        ("pixel_attention_mask", None),
        ("spatial_shapes", None),
        ("num_tiles", None),
        ("image_sizes", None),
        ("token_type_ids", None),
        ("mm_token_type_ids", None),
        ("image_position_ids", None),
    ),
    "training_step": (
        ("self", REQUIRED),
        ("model", REQUIRED),
        ("inputs", REQUIRED),
        ("num_items_in_batch", REQUIRED),
    ),
    "_save_checkpoint": (
        ("self", REQUIRED),
        ("model", REQUIRED),
        ("trial", REQUIRED),
    ),
    "_load_optimizer_and_scheduler": (
        ("self", REQUIRED),
        ("checkpoint", REQUIRED),
    ),
    # not overridden today; pinned so that overriding them later needs no lookup
    "compute_loss": (
        ("self", REQUIRED),
        ("model", REQUIRED),
        ("inputs", REQUIRED),
        ("return_outputs", False),
        ("num_items_in_batch", None),
    ),
    "_prepare_inputs": (
        ("self", REQUIRED),
        ("generation_batch", REQUIRED),
    ),
}

#: the TRL requirement mixrl declares (pyproject.toml) and the installed version it implies
TRL_SPEC = "trl>=1.16,<1.17"
TRL_MINOR = (1, 16)

ROOT = Path(__file__).resolve().parent.parent


def _signature(fn) -> tuple[tuple[str, object], ...]:
    return tuple(
        (p.name, REQUIRED if p.default is inspect.Parameter.empty else p.default)
        for p in inspect.signature(fn).parameters.values()
    )


def _overridden() -> tuple[str, ...]:
    from mixrl.trainer.grpo import OVERRIDDEN

    return tuple(OVERRIDDEN)


def _overridden_or_empty() -> tuple[str, ...]:
    try:
        return _overridden()
    except Exception:  # reported by test_grpo_module_imports
        return ()


def test_grpo_module_imports():
    import mixrl.trainer.grpo as grpo

    assert grpo.OVERRIDDEN, "OVERRIDDEN must list the TRL methods MixrlGRPOTrainer replaces"
    assert len(set(grpo.OVERRIDDEN)) == len(grpo.OVERRIDDEN), f"duplicates in OVERRIDDEN: {grpo.OVERRIDDEN}"


def _trl_specifier(requirements) -> list:
    from packaging.requirements import Requirement

    return [Requirement(r).specifier for r in requirements if Requirement(r).name == "trl"]


def _is_1_16_x(spec) -> bool:
    """The specifier admits exactly the 1.16 releases (checked on a few probe versions)."""
    inside = ["1.16.0", "1.16.1", "1.16.9"]
    outside = ["1.15.2", "1.17.0", "2.0.0", "0.29.0"]
    return all(spec.contains(v) for v in inside) and not any(spec.contains(v) for v in outside)


def test_trl_pin_in_pyproject_is_1_16_x():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    specs = _trl_specifier(deps)
    assert len(specs) == 1 and _is_1_16_x(specs[0]), (
        f"pyproject.toml requires trl{specs}; MixrlGRPOTrainer's overrides are pinned to {TRL_SPEC}"
    )


def test_installed_mixrl_metadata_pins_trl_1_16_x():
    specs = _trl_specifier(metadata.requires("mixrl") or [])
    assert len(specs) == 1 and _is_1_16_x(specs[0]), (
        f"installed mixrl requires trl{specs}; expected {TRL_SPEC} (reinstall: pip install -e .)"
    )


def test_installed_trl_is_1_16_x():
    import trl

    major, minor = (int(x) for x in trl.__version__.split(".")[:2])
    assert (major, minor) == TRL_MINOR, (
        f"trl {trl.__version__} is installed; mixrl's GRPOTrainer overrides are pinned to "
        f"{TRL_MINOR[0]}.{TRL_MINOR[1]}.x ({TRL_SPEC})"
    )


def test_every_overridden_method_is_pinned():
    missing = [name for name in _overridden() if name not in PINNED]
    assert not missing, (
        f"OVERRIDDEN lists {missing} but tests/test_trl_contract.py pins no parent signature for them; "
        "write the trl.GRPOTrainer signature into PINNED"
    )


@pytest.mark.parametrize("name", sorted(PINNED))
def test_parent_signature_matches_pin(name):
    from trl import GRPOTrainer

    assert hasattr(GRPOTrainer, name), f"trl.GRPOTrainer.{name} no longer exists (TRL upgrade?)"
    actual = _signature(getattr(GRPOTrainer, name))
    assert actual == PINNED[name], (
        f"trl.GRPOTrainer.{name} changed signature: pinned {PINNED[name]}, found {actual}. "
        f"Adapt MixrlGRPOTrainer.{name} (mixrl/trainer/grpo.py) to the new TRL, then update the pin."
    )


def test_overrides_are_defined_on_the_subclass():
    from mixrl.trainer.grpo import MixrlGRPOTrainer

    not_defined = [name for name in _overridden() if name not in vars(MixrlGRPOTrainer)]
    assert not not_defined, f"OVERRIDDEN lists {not_defined} but MixrlGRPOTrainer does not define them itself"


def test_overrides_override_existing_parent_methods():
    from trl import GRPOTrainer

    gone = [name for name in _overridden() if not callable(getattr(GRPOTrainer, name, None))]
    assert not gone, f"MixrlGRPOTrainer overrides {gone}, which trl.GRPOTrainer does not have (TRL renamed them?)"


@pytest.mark.parametrize("name", sorted(PINNED))
def test_override_accepts_parent_parameters(name):
    """TRL calls the override the way it calls its own method: same parameters, same order."""
    from mixrl.trainer.grpo import MixrlGRPOTrainer

    if name not in _overridden_or_empty():
        pytest.skip(f"{name} is not overridden")
    assert _signature(vars(MixrlGRPOTrainer)[name]) == PINNED[name], (
        f"MixrlGRPOTrainer.{name} takes {_signature(vars(MixrlGRPOTrainer)[name])}, TRL passes {PINNED[name]}"
    )


def test_subclass_is_a_grpo_trainer():
    from trl import GRPOTrainer

    from mixrl.trainer.grpo import MixrlGRPOTrainer

    assert issubclass(MixrlGRPOTrainer, GRPOTrainer)
