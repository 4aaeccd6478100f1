"""One registry type (issue 47): every registry of mixrl is a ``mixrl.registry.Registry``, refuses a
second object under a taken name in one line naming both, and leaves the registry as it was; the same
object again (a module imported twice) changes nothing. The torch-free packages use it without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mixrl.core.registry import Registry as CoreRegistry
from mixrl.envs import ENVIRONMENTS
from mixrl.registry import Registry
from mixrl.sources.feedback import BUILDERS
from mixrl.tools.builtin import TOOLS


def _registries():
    from mixrl.core.advantages import ADVANTAGES
    from mixrl.core.policy_base import POLICY_LOSSES
    from mixrl.rewards.components import REWARD_MODELS
    from mixrl.rewards.registry import REWARDS
    from mixrl.sampler.pickers import PICKERS
    from mixrl.sources.base import INJECTIONS, SOURCES

    return [ENVIRONMENTS, TOOLS, BUILDERS, POLICY_LOSSES, ADVANTAGES, SOURCES, INJECTIONS, PICKERS, REWARD_MODELS, REWARDS]


def test_every_registry_is_the_one_type():
    assert CoreRegistry is Registry
    for reg in _registries():
        assert type(reg) is Registry, reg


@pytest.mark.parametrize("reg", _registries(), ids=lambda r: r.kind)
def test_a_taken_name_is_refused_in_one_line_and_the_registry_is_unchanged(reg):
    name = reg.names()[0]
    held = reg[name]

    def impostor():
        """Not the registered one."""

    with pytest.raises(ValueError) as err:
        reg.register(name)(impostor)
    msg = str(err.value)
    assert "\n" not in msg and f"{reg.kind} {name!r} is already registered" in msg
    assert f"{held.__module__}.{held.__qualname__}" in msg and "impostor" in msg and "choose another name" in msg
    assert reg[name] is held
    assert reg.add(name, held) is held and reg[name] is held  # the same object again: no change


def test_mapping_access_and_an_unknown_name():
    reg = Registry("widget")
    reg.add("b", str)
    reg.add("a", int)
    assert reg["a"] is int and "b" in reg and list(reg) == ["a", "b"] and reg.items() == [("a", int), ("b", str)]
    with pytest.raises(KeyError, match=r"unknown widget 'c'; choices: a, b"):
        reg["c"]


def test_the_torch_free_packages_stay_torch_free():
    code = "import sys, mixrl.envs, mixrl.tools; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
