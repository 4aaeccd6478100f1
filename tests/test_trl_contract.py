"""The contract between ``MixrlGRPOTrainer`` and TRL's ``GRPOTrainer``.

``mixrl.trainer.grpo.OVERRIDDEN`` lists every TRL method mixrl replaces, and
``mixrl.trainer.trl_contract.TOUCHED`` every other private method or field of TRL (and of
transformers' ``Trainer``) mixrl calls, reads or writes, and every public TRL object it patches.
Those are private API: a TRL release may rename, reorder or add parameters without notice. The
signatures are pinned below, written out by hand for TRL 1.16.x, fields by their assignment in
their owner's source, and ``mixrl/`` is scanned for a private name of TRL that neither list
names; an upgrade that changes one fails here with its name, instead of failing mid-training.

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
    "get_batch_samples": (  # transformers' Trainer's
        ("self", REQUIRED),
        ("epoch_iterator", REQUIRED),
        ("num_batches", REQUIRED),
        ("device", REQUIRED),
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


# --------------------------------------------------------------------------- everything else mixrl touches
#: signatures of the methods in TOUCHED (called or patched) that PINNED does not hold: ("owner.name") -> parameters
PINNED_TOUCHED: dict[str, tuple[tuple[str, object], ...]] = {
    "trl.GRPOTrainer._tokenize_prompts": (("self", REQUIRED), ("prompts", REQUIRED)),
    "transformers.Trainer._get_output_dir": (("self", REQUIRED), ("trial", REQUIRED)),
    "trl.generation.vllm_client.VLLMClient._post": (("self", REQUIRED), ("url", REQUIRED), ("kwargs", REQUIRED)),
    "trl.generation.vllm_client.VLLMClient._start_weight_update": (("self", REQUIRED),),
    "trl.generation.vllm_client.VLLMClient._finish_weight_update": (("self", REQUIRED),),
    "trl.generation.vllm_client.VLLMClient.init_communicator": (("self", REQUIRED), ("device", 0)),
    "trl.generation.vllm_client.VLLMClient.update_named_params": (("self", REQUIRED), ("metadata", REQUIRED), ("named_params", REQUIRED)),
    "trl.generation.vllm_generation.VLLMGeneration.generate": (
        ("self", REQUIRED), ("prompts", REQUIRED), ("images", REQUIRED), ("num_generations", REQUIRED), ("profiler", None)),
    "trl.generation.vllm_generation.VLLMGeneration.sync_weights": (("self", REQUIRED),),
    "transformers.integrations.TensorBoardCallback._init_summary_writer": (("self", REQUIRED), ("args", REQUIRED)),
    "transformers.GenerationMixin._get_stopping_criteria": (
        ("self", REQUIRED), ("generation_config", REQUIRED), ("stopping_criteria", REQUIRED), ("tokenizer", None)),
}

def _owner(path: str):
    import importlib

    module, _, name = path.rpartition(".")
    try:
        return importlib.import_module(path)  # a module (trl.generation.vllm_generation)
    except ImportError:
        return getattr(importlib.import_module(module), name)


def _sources(owner) -> str:
    classes = [c for c in getattr(owner, "__mro__", (owner,)) if c is not object]
    return "\n".join(inspect.getsource(c) for c in classes)


def _assigned(owner, name: str) -> bool:
    import re

    return bool(re.search(rf"(self\.{name}\s*(:[^=\n]*)?=[^=])|(\b{name}\s*=[^=])|(import [^\n]*\b{name}\b)", _sources(owner)))


def _touched():
    from mixrl.trainer.trl_contract import TOUCHED

    return TOUCHED


@pytest.mark.parametrize("owner,name,kind", [(o, n, k) for o, n, k, _ in _touched()], ids=lambda x: str(x))
def test_touched_still_exists(owner, name, kind):
    """A method keeps its pinned signature; a field is still assigned by its owner; a patched object still exists."""
    import dataclasses

    cls = _owner(owner)
    if kind == "method" or (kind == "patched" and callable(getattr(cls, name, None)) and inspect.isclass(cls)):
        assert callable(getattr(cls, name, None)), f"{owner}.{name} no longer exists (TRL upgrade?); see mixrl/trainer/trl_contract.py"
        key = f"{owner}.{name}"
        pinned = PINNED.get(name) if owner == "trl.GRPOTrainer" and name in PINNED else PINNED_TOUCHED.get(key)
        assert pinned is not None, f"{key} is touched by mixrl but its signature is pinned nowhere: add it to PINNED_TOUCHED"
        assert _signature(getattr(cls, name)) == pinned, f"{key} changed signature: pinned {pinned}, found {_signature(getattr(cls, name))}"
    else:
        fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
        assert name in fields or _assigned(cls, name), (
            f"{owner} no longer sets {name} (TRL upgrade?); mixrl reads or writes it: see mixrl/trainer/trl_contract.py")


def _trl_private() -> set[str]:
    """Every private name of TRL's trainer, vLLM generation and vLLM client (their classes' own, and the
    ``self._x`` fields their sources assign)."""
    import re

    from trl import GRPOTrainer
    from trl.generation.vllm_client import VLLMClient
    from trl.generation.vllm_generation import VLLMGeneration

    trl_private = set()
    for owner in (GRPOTrainer, VLLMGeneration, VLLMClient):
        trl_private |= {k for c in owner.__mro__ if c is not object for k in vars(c) if k.startswith("_") and not k.startswith("__")}
        trl_private |= set(re.findall(r"self\.(_[a-z][a-z0-9_]*)\s*(?::[^=\n]*)?=[^=]", _sources(owner)))
    return trl_private


def test_every_trl_private_mixrl_touches_is_listed():
    """Every private name of TRL's trainer, vLLM generation and vLLM client that ``mixrl/`` reads,
    writes or calls on an object that may be TRL's is in OVERRIDDEN or TOUCHED (``tests/trl_scan.py``
    resolves the receiver: ``self._x`` in a class that derives from neither TRL nor transformers, such
    as AsyncGeneration's own ``_generate``, is that class's own)."""
    from trl_scan import private_uses

    from mixrl.trainer.trl_contract import names

    unlisted = private_uses(ROOT / "mixrl", _trl_private(), set(_overridden()) | names())
    assert not unlisted, f"mixrl touches TRL privates not listed in mixrl/trainer/trl_contract.py TOUCHED: {unlisted}"


def _patched_owners() -> dict[str, set[str]]:
    """``{name: owners}`` of every public TRL attribute TOUCHED lists as patched."""
    owners: dict[str, set[str]] = {}
    for owner, name, kind, _ in _touched():
        if kind == "patched":
            owners.setdefault(name, set()).add(owner)
    return owners


def _outside_the_trainer(pkg: Path) -> list[tuple[str, str]]:
    """The TRL internals ``pkg`` touches outside ``pkg/trainer/``: each use of a TRL private (listed in
    TOUCHED or not) and each assignment to a patched TRL attribute, on a receiver that may be TRL's."""
    from trl_scan import assignment_sites, private_use_sites

    sites = private_use_sites(pkg, _trl_private()) + assignment_sites(pkg, _patched_owners())
    return sorted(s for s in sites if not s[1].startswith(f"{pkg.name}/trainer/"))


def test_only_the_trainer_touches_trl_internals():
    """The room rule: only ``mixrl/trainer/`` touches TRL internals (a private method or field, a TRL
    object patched). Code elsewhere asks the trainer (the benchmarks' engine: ``push_engine_weights``,
    ``generate_on_engine``) or lives in the trainer's package (``mixrl.trainer.trl_vllm``: TRL's vLLM
    objects made to work with vLLM's CPU build)."""
    outside = _outside_the_trainer(ROOT / "mixrl")
    assert not outside, (
        f"only mixrl/trainer/ may touch TRL internals; found outside it: {outside}. Move the code into "
        "mixrl/trainer/ (a method of MixrlGRPOTrainer delegating to mixrl/trainer/trl_hooks/, or a trainer module)")


def test_the_room_rule_catches_trl_touched_outside_the_trainer(tmp_path):
    """On a synthetic package: a TRL private read, written or called, and a patched TRL attribute assigned
    (directly or through ``setattr``) outside ``trainer/`` are found, with their line; the same inside
    ``trainer/``, a callback's own ``generate`` and a freshly built model's ``generation_config`` are not."""
    from synthetic_package import write_package

    patch_client = ("from trl.generation.vllm_client import VLLMClient\n\n\ndef install():\n"
                    "    def init(self, device=0):\n        self._post('u')\n\n    VLLMClient.init_communicator = init\n")
    pkg = write_package(tmp_path / "toy", {
        "__init__.py": "",
        "trainer/__init__.py": "",
        "trainer/patch.py": patch_client,  # inside the trainer: allowed
        "trainer/build.py": "def build(args, w):\n    args.per_device_train_batch_size = w\n",
        "transfer.py": patch_client,
        "cpu.py": ("from trl.generation import vllm_generation\n\n\ndef dtype(llm):\n"
                   "    vllm_generation.LLM = llm\n    setattr(vllm_generation, 'LLM', llm)\n"),
        "engine.py": ("class EngineGenerator:\n    def __init__(self, trainer):\n        self.vg = trainer.vllm_generation\n\n"
                      "    def generate(self):\n        self.vg._llm_weights_sleeping = True\n"),
        "args.py": "def weights(args, w):\n    setattr(args, 'per_device_train_batch_size', w)\n",
        "callback.py": ("from transformers import TrainerCallback\n\n\nclass Eval(TrainerCallback):\n"
                        "    def __init__(self, generate):\n        self.generate = generate\n"),
        "tiny.py": ("def build(config, g):\n    from transformers import Qwen2ForCausalLM\n\n"
                    "    model = Qwen2ForCausalLM(config)\n    model.generation_config = g\n    return model\n"),
    })
    assert _outside_the_trainer(pkg) == [
        ("LLM", "toy/cpu.py:5"),
        ("LLM", "toy/cpu.py:6"),
        ("_llm_weights_sleeping", "toy/engine.py:6"),
        ("_post", "toy/transfer.py:6"),
        ("init_communicator", "toy/transfer.py:8"),
        ("per_device_train_batch_size", "toy/args.py:2"),
    ]
