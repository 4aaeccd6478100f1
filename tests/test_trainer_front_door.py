"""The trainer's front door: one spec in, no attribute set from outside afterwards.

``MixrlGRPOTrainer`` takes TRL's arguments and one more, ``spec`` (a frozen
:class:`mixrl.trainer.parts_spec.PartsSpec` that ``trainer/build.py`` fills once);
:func:`mixrl.trainer.assembly.build_parts` reads the spec. No module of ``mixrl/`` but the
trainer's own (``trainer/grpo.py`` and ``trainer/trl_hooks/``, the hooks each of its TRL overrides
routes to, which receive the trainer as ``t``) assigns an attribute of a trainer, except the writes listed in
:data:`REMAINING` (each with the reason it is still there).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: attribute writes on a trainer left outside its own code: (module, attribute) -> why (none left)
REMAINING: dict[tuple[str, str], str] = {}

#: names that hold a trainer where mixrl writes one
TRAINER_NAMES = {"trainer", "t", "tr", "_trainer"}


def _holder(node: ast.AST) -> str | None:
    """``trainer`` for ``trainer.x``, ``self.trainer.x`` and ``trainer().x`` targets."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


def attribute_writes(path: Path):
    """``(holder, attribute, line)`` of every ``holder.attr = ...`` / ``+=`` / annotated assignment (tuple targets
    unpacked) and ``setattr(holder, "attr", ...)`` (``"?"`` when the name is not a literal) in one module."""
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, ast.Attribute):
                    yield t.value, t.attr, node.lineno
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
            name = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else "?"
            yield node.args[0], name, node.lineno


def trainer_writes(root: Path) -> set[tuple[str, str]]:
    """``(module, attribute)`` of every ``<trainer>.attr = ...`` / ``+=`` / ``setattr(<trainer>, "attr", ...)``
    under ``root/mixrl`` outside the trainer's own code (``trainer/grpo.py`` and its hooks, ``trainer/trl_hooks/``)."""
    found = set()
    for path in sorted((root / "mixrl").rglob("*.py")):
        rel = str(path.relative_to(root))
        if rel == "mixrl/trainer/grpo.py" or rel.startswith("mixrl/trainer/trl_hooks/"):
            continue
        found |= {(rel, attr) for holder, attr, _ in attribute_writes(path) if _holder(holder) in TRAINER_NAMES}
    return found


def test_the_scan_finds_a_write_from_outside(tmp_path):
    (tmp_path / "mixrl" / "trainer").mkdir(parents=True)
    (tmp_path / "mixrl" / "trainer" / "grpo.py").write_text("def f(trainer):\n    trainer.ok = 1\n")
    (tmp_path / "mixrl" / "trainer" / "trl_hooks").mkdir()
    (tmp_path / "mixrl" / "trainer" / "trl_hooks" / "loss.py").write_text("def f(t):\n    t.ok = 1\n")
    (tmp_path / "mixrl" / "x.py").write_text(
        "def f(trainer, t, self):\n    trainer.a = 1\n    t.b += 2\n    setattr(trainer, 'c', 3)\n"
        "    self.trainer.d, other.e = 4, 5\n    trainer.model.f = 6\n")
    assert trainer_writes(tmp_path) == {("mixrl/x.py", n) for n in "abcd"}


def test_nothing_outside_the_trainer_writes_a_trainer_attribute():
    found = trainer_writes(REPO)
    assert found - set(REMAINING) == set(), (
        f"{sorted(found - set(REMAINING))}: give the trainer what it needs at construction (mixrl.trainer.parts_spec.PartsSpec) "
        "or hand the value back through a declared channel, not an attribute set from outside")
    assert set(REMAINING) - found == set(), f"{sorted(set(REMAINING) - found)} no longer written: drop them from REMAINING"


def test_the_trainer_takes_one_spec_beyond_trl_and_build_parts_reads_it():
    from mixrl.trainer.assembly import build_parts
    from mixrl.trainer.grpo import MixrlGRPOTrainer
    from mixrl.trainer.parts_spec import PartsSpec

    params = inspect.signature(MixrlGRPOTrainer.__init__).parameters
    assert [p for p in params if params[p].kind == inspect.Parameter.KEYWORD_ONLY] == ["spec"]
    assert list(inspect.signature(build_parts).parameters) == ["h", "spec"]
    spec = PartsSpec(objective=None, advantage=("grpo", {}, False))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.staleness = 2  # type: ignore[misc]
    assert spec.injections == () and spec.config is None and spec.episodes is None  # the defaults: every optional part off


def test_the_config_fills_the_spec():
    """The settings the trainer once received as attributes after construction come from the config, in the spec."""
    from mixrl.config.compose import compose_config
    from mixrl.config.geometry import geometry
    from mixrl.trainer.build import parts_spec
    from mixrl.trainer.magnitude import MagnitudeBounds

    cfg = compose_config(["algo=grpo", "hardware.vllm_sync_tolerance=0.25", "trainer.max_abs_loss=50",
                          "trainer.generation=shared-prefill", "trainer.staleness=2"])
    spec = parts_spec(cfg, geometry(cfg), injection=None, teacher=None, sampler=None, sampler_length=None, model_path="unused")
    assert spec.sync_tolerance == 0.25 and spec.magnitude == MagnitudeBounds(1000.0, 50.0)
    assert spec.generation == "shared-prefill" and spec.staleness == 2 and spec.config is None and spec.episodes is None
    assert spec.samples is None  # rows for samples.jsonl: mixrl train's trainer alone keeps them
    run = parts_spec(cfg, geometry(cfg), injection=None, teacher=None, sampler=None, sampler_length=None,
                     model_path="unused", for_run=True)
    assert run.config["trainer"]["staleness"] == 2
    assert (run.samples.rows, run.samples.chars) == (int(cfg.logger.samples_per_step), int(cfg.logger.samples_max_chars))
    episodic = compose_config(["algo=uis1"])
    assert callable(parts_spec(episodic, geometry(episodic), injection=None, teacher=None, sampler=None,
                               sampler_length=None, model_path="unused").episodes)


def test_sample_rows_pass_from_the_trainer_to_the_callback_once():
    from mixrl.trainer.sample_log import SampleTap

    tap = SampleTap(2, chars=50)
    assert tap.take() is None
    tap.keep([{"a": 1}])
    tap.keep([{"b": 2}])  # a later batch before the log replaces the earlier one
    assert tap.take() == [{"b": 2}] and tap.take() is None


def args_writes(root: Path) -> set[tuple[str, int]]:
    """``(module, line)`` of every write of an attribute (:func:`attribute_writes`) of ``args`` or of an attribute
    named ``args`` (``self.args``, ``t.args``) under ``root/mixrl``: TRL's ``GRPOConfig`` written after its construction."""
    found = set()
    for path in sorted((root / "mixrl").rglob("*.py")):
        rel = str(path.relative_to(root))
        found |= {(rel, line) for holder, _, line in attribute_writes(path)
                  if (isinstance(holder, ast.Name) and holder.id == "args") or (isinstance(holder, ast.Attribute) and holder.attr == "args")}
    return found


def test_the_scan_finds_a_grpo_config_write(tmp_path):
    (tmp_path / "mixrl").mkdir()
    (tmp_path / "mixrl" / "x.py").write_text(
        "def f(args, t, self, other):\n    args.a = 1\n    t.args.b += 1\n    setattr(self.args, 'c', 3)\n"
        "    other.d = 4\n    args = 5\n    self.argsx.e = 6\n")
    assert args_writes(tmp_path) == {("mixrl/x.py", n) for n in (2, 3, 4)}


def test_the_grpo_config_is_built_once_and_never_written():
    """``grpo_args`` builds the ``GRPOConfig`` complete: what the build decides beside the config (the reward
    weights, the tool loop's rounds, a benchmark's generation kwargs) arrives at construction, and no module
    writes a field of it afterwards (the token budget's scoring rows swap one for a block, through
    ``parts.token_budget._swapped``, listed in the TRL contract)."""
    from mixrl.config.compose import compose_config
    from mixrl.trainer.env_rollout import env_return, env_rewards
    from mixrl.trainer.trl_args import grpo_args

    assert args_writes(REPO) == set()
    cfg = compose_config(["algo=grpo"])
    args = grpo_args(cfg, Path("/tmp/unused-run"), reward_weights=[0.25, 0.75], max_tool_calling_iterations=3,
                     generation_kwargs={"do_sample": False})
    assert (args.reward_weights, args.max_tool_calling_iterations, args.generation_kwargs) == ([0.25, 0.75], 3, {"do_sample": False})
    assert grpo_args(cfg, Path("/tmp/unused-run")).reward_weights is None  # TRL's default: every function weight 1
    funcs = [object()]
    assert env_rewards(cfg, funcs, [0.5]) == (funcs, [0.5])  # env=single: the task's reward functions and weights
    episodic = compose_config(["algo=uis1"])
    assert env_rewards(episodic, funcs, [0.5]) == ([env_return], [1.0])  # an environment's return, weight 1
