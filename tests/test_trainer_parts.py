"""``MixrlGRPOTrainer`` is TRL's hooks plus parts it holds (``self.parts``); this keeps it so.

An AST walk over the part modules (like ``tests/test_import_graph.py`` walks imports): a part
uses only attributes it owns (``self.x`` is set in its own class), never writes another part's
attribute nor reads another's private one, never holds the trainer (no ``trainer`` name, no
import of the TRL glue), and imports no TRL; every part is ``Stateful`` and its ``state_dict()``
works right after construction; the trainer's only base is TRL's ``GRPOTrainer``.
:func:`cross_part_names` is the measurement the issue asked for (names one part reaches that
another owns); run this file as a script on a folder to print it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parents[1]
TRAINER = REPO / "mixrl" / "trainer"
#: the rooms whose modules are parts (or their helpers): no TRL, no trainer
PART_ROOMS = ("parts", "generation")
#: the TRL glue: the only trainer modules that build parts from, or hand them, the trainer
GLUE = ("mixrl.trainer.grpo", "mixrl.trainer.trl_hooks", "mixrl.trainer.assembly", "mixrl.trainer.build")
#: the trainer's own objects that carry a batch from hook to hook (mixrl/trainer/in_flight.py): not parts, written by the hooks
IN_FLIGHT = ("batch_in_flight", "step_tally")


def part_files(root: Path = TRAINER) -> list[Path]:
    return [p for room in PART_ROOMS for p in sorted((root / room).rglob("*.py"))]


def _classes(path: Path) -> list[ast.ClassDef]:
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)]


def _defined(cls: ast.ClassDef) -> set[str]:
    """What a class owns: its methods, class attributes and every ``self.x = ...`` in its body."""
    names = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            for e in ast.walk(t):
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                    names.add(e.attr)
    return names


def _self_uses(cls: ast.ClassDef) -> set[str]:
    return {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"}


def cross_part_names(files: list[Path], bases: tuple[str, ...] = ()) -> dict[str, set[str]]:
    """``{class: names}``: the attributes a class reads or writes on ``self`` that it does not
    own (a mixin reaching what another mixin or the trainer created). ``bases``: class names
    whose own attributes count as owned (a plain base class; none for parts)."""
    out = {}
    for path in files:
        for cls in _classes(path):
            foreign = _self_uses(cls) - _defined(cls) - {"__class__"}
            if foreign:
                out[cls.name] = foreign
    return out


def _state_attrs(files: list[Path]) -> dict[str, set[str]]:
    """``{class: attributes it assigns on self}`` (its state) for the part classes."""
    out = {}
    for path in files:
        for cls in _classes(path):
            methods = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            out[cls.name] = _defined(cls) - methods
    return out


def _violations(files: list[Path], also: tuple[Path, ...] = ()) -> list[str]:
    """Writes of another part's attribute (``x.part.attr = ...``, ``obj.attr = ...`` on anything
    but ``self``) and reads of another part's private attribute, in ``files`` and ``also``
    (the trainer's hooks: they may read parts, not write them)."""
    owned_by: dict[str, set[str]] = {}
    for name, attrs in _state_attrs(files).items():
        for a in attrs:
            owned_by.setdefault(a, set()).add(name)
    bad = []
    for path in [*files, *also]:
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
            for t in targets:
                for e in ast.walk(t):
                    if isinstance(e, ast.Attribute) and e.attr in owned_by and isinstance(e.value, ast.Attribute) \
                            and isinstance(e.ctx, ast.Store) and e.value.attr not in IN_FLIGHT:
                        bad.append(f"{path.name}:{node.lineno} writes .{e.attr} of {sorted(owned_by[e.attr])}")
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and node.attr.startswith("_") \
                    and not node.attr.startswith("__") and node.attr in owned_by and not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                bad.append(f"{path.name}:{node.lineno} reads private .{node.attr} of {sorted(owned_by[node.attr])}")
    return bad


def _trainer_or_trl(files: list[Path], root: Path) -> list[str]:
    """Imports of TRL or of the glue, and any name ``trainer`` (a variable, an argument, an attribute)."""
    bad = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""]
            else:
                mods = []
            for m in mods:
                if m == "trl" or m.startswith("trl.") or m.startswith(GLUE):
                    bad.append(f"{path.relative_to(root)}:{node.lineno} imports {m}")
            if isinstance(node, ast.Name) and node.id == "trainer" or isinstance(node, ast.arg) and node.arg == "trainer" \
                    or isinstance(node, ast.Attribute) and node.attr == "trainer":
                bad.append(f"{path.relative_to(root)}:{node.lineno} holds the trainer")
    return bad


def test_no_part_uses_an_attribute_it_does_not_own():
    assert cross_part_names(part_files()) == {}


def test_no_part_writes_another_parts_attribute_or_reads_its_private_ones():
    assert _violations(part_files(), also=(TRAINER / "grpo.py", *sorted((TRAINER / "trl_hooks").glob("*.py")))) == []


def test_no_part_holds_the_trainer_nor_imports_trl_or_the_glue():
    assert _trainer_or_trl(part_files(), REPO) == []


def test_the_walk_finds_a_part_reaching_into_another(tmp_path):
    """The checks above can fail: in a synthetic room, a part reading an attribute it never set,
    writing another part's, reading another's private one, holding the trainer and importing TRL."""
    room = tmp_path / "parts"
    room.mkdir()
    (room / "a.py").write_text(
        "from trl import GRPOTrainer\n\n\n"
        "class B:\n    def __init__(self):\n        self.store, self._cache = None, {}\n\n\n"
        "class A:\n    def __init__(self, b, trainer):\n        self.b, self.trainer = b, trainer\n\n"
        "    def run(self):\n        self.b.store = self._step\n        return self.b._cache\n"
    )
    files = part_files(tmp_path)
    assert cross_part_names(files) == {"A": {"_step"}}
    assert _violations(files) == ["a.py:14 writes .store of ['B']", "a.py:15 reads private ._cache of ['B']"]
    assert _trainer_or_trl(files, tmp_path) == [
        "parts/a.py:1 imports trl", "parts/a.py:10 holds the trainer", "parts/a.py:11 holds the trainer",
        "parts/a.py:11 holds the trainer"]


def test_the_trainer_has_one_base_trls_and_replaces_only_the_listed_hooks():
    from trl import GRPOTrainer

    from mixrl.trainer.grpo import OVERRIDDEN, MixrlGRPOTrainer

    assert MixrlGRPOTrainer.__bases__ == (GRPOTrainer,)
    replaced = {n for n in vars(MixrlGRPOTrainer) if hasattr(GRPOTrainer, n) and not n.startswith("__")}
    # get_batch_samples: transformers' batch fetch, read ahead in async mode (mixrl.trainer.grpo's docstring)
    assert replaced == set(OVERRIDDEN) | {"get_batch_samples"}, replaced


def _instances() -> dict:
    """One of every part, built from small stand-ins (no model, no TRL)."""
    from mixrl.trainer.parts.scoring_chunks import ScoringChunks
    from mixrl.trainer.parts.token_budget import TokenBudget
    from mixrl.trainer.generation.async_generation import AsyncGeneration, AsyncPipeline
    from mixrl.trainer.generation.lagged_weights import LaggedWeights
    from mixrl.trainer.parts import (
        ControllerSteps, Critic, Forwards, Injections, RemaxBaseline, SamplerRounds, Scoring, Teachers,
    )
    from mixrl.trainer.parts.advantage_shaping import AdvantageShaping
    from mixrl.trainer.parts.critic import ValueModel
    from mixrl.trainer.parts.packing import Packing

    class Sampler:  # mixrl.sampler.runtime.Sampler's checkpoint face
        def __init__(self):
            self.state = {"draws": 0}

        def state_dict(self):
            return dict(self.state)

        def load_state_dict(self, state):
            self.state = dict(state)

    class Controller(Sampler):  # a mixrl.core.CONTROLLERS instance's
        when = "step_end"

    forwards = Forwards(lambda *a, **k: None, collective=False, device="cpu", pad_token_id=0, dummy_token=0, batch_size=2)
    scoring = Scoring(reward_funcs=[], reward_weights=torch.ones(1), decode=str, calculate=None, is_conversational=bool,
                      device="cpu")
    value = ValueModel(torch.nn.Identity(), 2)
    return {
        "forwards": forwards,
        "scoring": scoring,
        "packing": Packing("auto"),
        "injections": Injections([], tokenizer=None, process_index=0, num_processes=1, num_generations=2,
                                 max_completion_length=4, device="cpu", tokenize_prompts=None, gather=None, generate_one=None,
                                 gathers_prompts=False, forwards=forwards, scoring=scoring),
        "teachers": Teachers(SimpleNamespace(), [], forwards=forwards, tokens=(), entropy=False, tokenize_prompts=None,
                             reduce_sum=None, temperature=1.0, top_p=1.0, max_completion_length=4, eos_token_id=1, pad_token_id=0),
        "critic": Critic(value, torch.optim.AdamW(value.parameters()), {}, advantage_params={}, include_offpolicy=False,
                         reward_funcs=[], reward_weights=torch.ones(1), batch_size=2),
        "remax": RemaxBaseline(eos_token_ids=[1], scoring=scoring, for_generation=None, process_index=0),
        "sampler": SamplerRounds(Sampler(), dataset=[], num_generations=2, pad_token_id=0, weigh=scoring.weighted),
        "controller": ControllerSteps(Controller(), policy_tokens=("on_policy",), reduce_sum=None, reduce_mean=None,
                                      gather=None, device="cpu"),
        "lag": LaggedWeights(2),
        "async_gen": AsyncPipeline(AsyncGeneration(generate=None, push=None, snapshot=None, max_staleness=1),
                                   tokenize_prompts=None),
        "budget": TokenBudget(64),
        "score_chunks": ScoringChunks(64, collective=False),
        "shaping": AdvantageShaping("sign_weight", {}, offpolicy=False, forwards=forwards, gather=lambda t: t),
    }


def test_every_part_is_stateful_right_after_construction():
    from dataclasses import fields

    from torch.distributed.checkpoint.stateful import Stateful

    from mixrl.trainer.parts import Parts

    parts = _instances()
    assert set(parts) == {f.name for f in fields(Parts)}, "a Parts field without an instance here: add it"
    for name, part in parts.items():
        assert isinstance(part, Stateful), name
        assert isinstance(part.state_dict(), dict), name
        part.load_state_dict(part.state_dict())
    assert parts["lag"].state_dict() == {"lag_snapshots": {}}
    assert set(parts["critic"].state_dict()) == {"model", "optimizer"}
    parts["async_gen"].engine.close()


def test_each_part_module_says_what_it_owns_receives_and_returns():
    import importlib

    for path in part_files():
        if path.name == "__init__.py":
            continue
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        doc = importlib.import_module(module).__doc__ or ""
        assert len(doc.split()) >= 20, f"{module} needs a docstring saying what it owns"
        if module.startswith("mixrl.trainer.parts.") and module != "mixrl.trainer.parts.batch_fields":
            assert "Owns:" in doc and "Receives" in doc and "Returns" in doc, module


if __name__ == "__main__":  # python tests/test_trainer_parts.py [folder of trainer modules]: the cross-part names
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else TRAINER
    files = sorted(root.rglob("*.py"))
    found = cross_part_names(files)
    for cls, names in sorted(found.items()):
        print(f"{cls}: {len(names)}: {', '.join(sorted(names))}")
    print("total", sum(len(v) for v in found.values()), "distinct", len(set().union(*found.values())) if found else 0)
