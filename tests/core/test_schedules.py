"""Schedules: values at given steps (CHORD's mu variants), spec resolution and errors."""

import math
import types

import pytest

from mixrl.core import SCHEDULES, UnknownComponentError, describe_schedule, resolve_schedule
from mixrl.core.registry import ComponentParamError


def values(spec, steps):
    f = resolve_schedule(spec)
    return [f(s) for s in steps]


def test_constant_and_number_spec():
    assert values(0.3, [0, 10, 10_000]) == [0.3, 0.3, 0.3]
    assert values({"name": "constant", "value": 2}, [5]) == [2.0]
    assert values("constant", [5]) == [0.0]


def test_linear():
    spec = {"name": "linear", "start": 1.0, "end": 0.0, "steps": 4}
    assert values(spec, [0, 1, 2, 4, 100]) == pytest.approx([1.0, 0.75, 0.5, 0.0, 0.0])
    assert values({"name": "linear", "steps": 0, "end": 0.7}, [0, 3]) == [0.7, 0.7]


def test_cosine_chord_math_recipe():
    spec = {"name": "cosine", "warmup": 200, "decay": 400, "peak": 0.5, "valley": 0.02}
    exp = [0.0, 0.5 * 100 / 200, 0.5, 0.02 + 0.48 * 0.5 * (1 + math.cos(math.pi * 0.25)),
           0.02 + 0.48 * 0.5, 0.02, 0.02]
    assert values(spec, [0, 100, 200, 300, 400, 600, 5000]) == pytest.approx(exp)


def test_cosine_chord_mu_no_warmup():
    spec = {"name": "cosine", "warmup": 0, "decay": 200, "peak": 0.9, "valley": 0.05}
    assert values(spec, [0, 100, 200, 201]) == pytest.approx([0.9, 0.05 + 0.85 * 0.5, 0.05, 0.05])


def test_cosine_edge_cases():
    # CHORD-phi: constant 0.1 via peak = valley, warmup = decay = 0 (also the defaults)
    assert values({"name": "cosine"}, [0, 1, 1000]) == pytest.approx([0.1, 0.1, 0.1])
    # decay = 0: ramp then jump to valley at the end of warmup
    spec = {"name": "cosine", "warmup": 4, "decay": 0, "peak": 1.0, "valley": 0.2}
    assert values(spec, [0, 2, 3, 4, 9]) == pytest.approx([0.0, 0.5, 0.75, 0.2, 0.2])


def test_step_switch():
    spec = {"name": "step", "switch_step": 3, "before": 1.0, "after": 0.0}
    assert values(spec, [0, 2, 3, 50]) == [1.0, 1.0, 0.0, 0.0]
    assert values("step", [0]) == [1.0]  # switch_step 0: "after" from the start


def test_any_mapping_works():
    spec = types.MappingProxyType({"name": "step", "switch_step": 1})
    assert values(spec, [0, 1]) == [0.0, 1.0]


def test_errors_are_one_line():
    with pytest.raises(UnknownComponentError) as e:
        resolve_schedule({"name": "cosin"})
    msg = str(e.value)
    assert "\n" not in msg and "unknown schedule 'cosin'" in msg and "did you mean: cosine" in msg
    with pytest.raises(TypeError) as e:
        resolve_schedule({"name": "cosine", "peek": 0.3})
    assert "\n" not in str(e.value) and "'peek'" in str(e.value) and "peak" in str(e.value)
    with pytest.raises(ComponentParamError) as e:
        resolve_schedule({"name": "cosine", "warmup": "ten"})
    assert "warmup" in str(e.value) and "int" in str(e.value)
    with pytest.raises(TypeError):
        resolve_schedule({"peak": 0.3})
    with pytest.raises(TypeError):
        resolve_schedule([0.1])


def test_describe():
    assert describe_schedule(
        {"name": "cosine", "warmup": 0, "peak": 0.9, "decay": 200, "valley": 0.05}
    ) == "cosine(warmup=0, peak=0.9, decay=200, valley=0.05)"
    assert describe_schedule(0.1) == "constant(value=0.1)"
    assert describe_schedule({"name": "step", "switch_step": 50}) == "step(switch_step=50, before=0, after=1)"


def test_registered_names():
    assert SCHEDULES.names() == ["constant", "cosine", "linear", "step"]
