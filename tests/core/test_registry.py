"""Registry behaviour and the contract every registered component must meet."""

import ast
import inspect
import pathlib

import pytest

import mixrl.core as core
from mixrl.core import REGISTRIES, Registry, UnknownComponentError
from mixrl.errors import ConfigError

CORE_DIR = pathlib.Path(core.__file__).parent
ALLOWED_ANNOTATIONS = {float, int, bool, str, float | None, int | None}
ALLOWED_IMPORTS = {"torch", "math", "dataclasses", "inspect", "typing", "collections",
                   "types", "sys", "__future__", "mixrl"}


def test_register_get_names_contains_params():
    reg = Registry("widget")

    @reg.register("b")
    def b(x, *, alpha: float = 0.5, n: int | None = None):
        return x

    @reg.register("a")
    def a(x):
        return x

    assert reg.get("b") is b and reg.names() == ["a", "b"]
    assert "a" in reg and "zzz" not in reg
    params = reg.params("b")
    assert list(params) == ["alpha", "n"]
    assert params["alpha"].default == 0.5 and params["n"].annotation == (int | None)
    assert reg.params("a") == {}


def test_unknown_component_error_is_one_line_with_suggestion():
    with pytest.raises(UnknownComponentError) as e:
        core.POLICY_LOSSES.get("ppo_clp")
    msg = str(e.value)
    assert msg.startswith("unknown policy loss 'ppo_clp' (did you mean: ppo_clip?); choices: ")
    assert "\n" not in msg and "sapo" in msg
    assert isinstance(e.value, KeyError) and isinstance(e.value, ConfigError)


def test_check_params():
    core.POLICY_LOSSES.check_params("ppo_clip", {"clip_low": 0.1, "dual_clip_c": None})
    core.POLICY_LOSSES.check_params("ppo_clip", {"dual_clip_c": 3})  # int is fine for float
    with pytest.raises(TypeError) as e:
        core.POLICY_LOSSES.check_params("ppo_clip", {"clip_hi": 0.3})
    assert "did you mean: clip_high" in str(e.value)
    with pytest.raises(TypeError):
        core.POLICY_LOSSES.check_params("ppo_clip", {"clip_low": True})


def test_expected_names_are_registered():
    assert set(core.POLICY_LOSSES.names()) == {
        "ppo_clip", "reinforce", "topr", "cispo", "gspo", "sapo", "m2po", "sft"}
    assert set(core.TOKEN_WEIGHTS.names()) == {"one", "p", "chord_phi", "luffy"}
    assert set(core.AGGREGATIONS.names()) == {
        "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"}
    assert set(core.ADVANTAGES.names()) == {"grpo", "dr_grpo", "rloo", "reinforce", "batch_norm"}
    assert set(core.KL_ESTIMATORS.names()) == {"k1", "k2", "k3", "k3_clamped"}
    assert set(core.CONTROLLERS.names()) == {"bapo", "entropic"}


COMPONENTS = [(key, name) for key, reg in REGISTRIES.items() for name in reg.names()]


@pytest.mark.parametrize("key,name", COMPONENTS)
def test_component_contract(key, name):
    reg = REGISTRIES[key]
    obj = reg.get(name)
    for p in reg.params(name).values():
        assert p.default is not inspect.Parameter.empty, f"{key} {name}.{p.name} has no default"
        assert p.annotation in ALLOWED_ANNOTATIONS, f"{key} {name}.{p.name}: {p.annotation}"
    doc = inspect.getdoc(obj) or ""
    assert "Paper" in doc and "Parameters" in doc, f"{key} {name}: docstring lacks Paper/Parameters"
    for pname in reg.params(name):
        assert pname in doc, f"{key} {name}: parameter {pname} undocumented"


@pytest.mark.parametrize(
    "path", sorted(p for p in CORE_DIR.glob("*.py") if p.name != "objective.py"), ids=lambda p: p.name
)
def test_core_is_pure_tensor_math(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mods = [node.module or ""]
        else:
            continue
        for mod in mods:
            top = mod.split(".")[0]
            assert top in ALLOWED_IMPORTS, f"{path.name} imports {mod}"
            if top == "mixrl":
                assert mod.startswith("mixrl.core") or mod == "mixrl.errors", f"{path.name}: {mod}"
