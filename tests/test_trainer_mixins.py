"""``MixrlGRPOTrainer`` is its TRL hooks plus mixins, one module per job (mixrl/trainer/*.py).

The mixins come before TRL's ``GRPOTrainer`` in the MRO, so a method one of them defines
silently replaces TRL's or transformers' method of the same name, and a name two of them
define is decided by their order. These checks keep that explicit: the TRL methods mixrl
replaces are the subclass's own (``OVERRIDDEN``, pinned by test_trl_contract.py) plus the
ones listed here, and no name is defined twice. Import-only: well under a second.
"""

from __future__ import annotations

import collections
import importlib

from trl import GRPOTrainer

from mixrl.trainer.grpo import OVERRIDDEN, MixrlGRPOTrainer

#: transformers/TRL methods a mixin replaces on purpose (the async lookahead wraps the batch fetch)
MIXIN_OVERRIDES = {"get_batch_samples"}


def _mixins() -> list[type]:
    mro = MixrlGRPOTrainer.__mro__
    return list(mro[1 : mro.index(GRPOTrainer)])


def _methods(cls: type) -> set[str]:
    return {n for n in vars(cls) if not (n.startswith("__") and n.endswith("__"))}


def test_no_method_is_defined_by_two_parts_of_the_trainer():
    owners = collections.defaultdict(list)
    for cls in [MixrlGRPOTrainer, *_mixins()]:
        for name in _methods(cls):
            owners[name].append(cls.__name__)
    twice = {name: where for name, where in owners.items() if len(where) > 1}
    assert not twice, f"defined by more than one of MixrlGRPOTrainer's classes (the MRO picks one silently): {twice}"


def test_mixins_replace_only_the_listed_trl_methods():
    replaced = {name: cls.__name__ for cls in _mixins() for name in _methods(cls) if hasattr(GRPOTrainer, name)}
    assert set(replaced) == MIXIN_OVERRIDES, (
        f"mixins replace these GRPOTrainer/Trainer methods: {replaced}; a TRL hook belongs on MixrlGRPOTrainer "
        f"itself (OVERRIDDEN), an intended replacement in MIXIN_OVERRIDES")
    assert not set(replaced) & set(OVERRIDDEN)


def test_each_mixin_lives_in_a_trainer_module_with_a_docstring():
    assert len(_mixins()) >= 8, [c.__name__ for c in _mixins()]
    for cls in _mixins():
        assert cls.__module__.startswith("mixrl.trainer.") and cls.__module__ != "mixrl.trainer.grpo", cls
        module = importlib.import_module(cls.__module__)
        assert module.__doc__ and len(module.__doc__.split()) >= 20, f"{cls.__module__} needs a docstring saying what it owns"
