"""One trainer assembly (:func:`mixrl.trainer.build.trainer_from_config`): ``mixrl train``, the
benchmark, the DDP/FSDP worker, the pins harness and the tests build their trainer with it, and
nothing else constructs a ``MixrlGRPOTrainer``; called on a config alone it gives the trainer
``mixrl train`` builds for that config (same objective, sources, rows, rewards, TRL arguments,
weights)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from conftest import FAST

REPO = Path(__file__).resolve().parents[1]

#: the callers that once assembled a trainer by hand (tests/pins/harness.py is the pins' safety net)
CALLERS = ["mixrl/trainer/run.py", "bench/variants.py", "tests/ddp_worker.py", "tests/pins/harness.py",
           "tests/test_teacher.py", "tests/test_engine_correction_trl.py"]


@pytest.mark.parametrize("rel", CALLERS)
def test_each_caller_uses_the_one_assembly(rel):
    text = (REPO / rel).read_text()
    assert "trainer_from_config(" in text
    assert "build_trainer(" not in text  # the old second path is gone
    assert "MixrlGRPOTrainer(" not in text


def test_only_the_assembly_constructs_the_trainer():
    """``MixrlGRPOTrainer(`` is called in one place in the repository: build.trainer_from_config."""
    calls = []
    for folder in ("mixrl", "bench", "tests", "scripts"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path.name == "test_assembly.py":  # this file names it in its checks
                continue
            n = len(re.findall(r"(?<![\w.])(?<!class )MixrlGRPOTrainer\(", path.read_text()))
            calls += [str(path.relative_to(REPO))] * n
    assert calls == ["mixrl/trainer/build.py"], calls
    build_text = (REPO / "mixrl/trainer/build.py").read_text()
    assert "def build_trainer(" not in build_text
    body = build_text[build_text.index("def trainer_from_config("):]
    body = body[: body.index("\ndef ", 1)]
    assert "MixrlGRPOTrainer(" in body


class _Built(Exception):
    """Stops ``mixrl train`` once its trainer is built (nothing trained, weights as loaded)."""


@pytest.mark.parametrize("algo", [[], ["algo=luffy"]], ids=["default", "luffy"])
def test_trainer_from_config_is_the_trainer_mixrl_train_builds(algo, tiny_model_path, tmp_path, monkeypatch):
    from rich.console import Console

    from mixrl.config.compose import compose_config
    from mixrl.trainer import build, run

    overrides = [*FAST, *algo, f"model.path={tiny_model_path}", "trainer.eval_size=0"]
    built = []
    assemble = build.trainer_from_config

    def record(cfg, **kwargs):
        built.append(assemble(cfg, **kwargs))
        raise _Built

    monkeypatch.setattr(build, "trainer_from_config", record)
    with pytest.raises(_Built):
        run.train(compose_config([*overrides, f"run_dir={tmp_path / 'train'}"]), Console(quiet=True))
    monkeypatch.undo()
    trained = built[0]
    cfg = compose_config([*overrides, f"run_dir={tmp_path / 'train'}"])  # the same run_dir: TRL's output_dir
    mine = build.trainer_from_config(cfg)

    assert mine.objective == trained.objective and mine.objective.terms
    assert (mine.advantage_name, mine.advantage_params) == (trained.advantage_name, trained.advantage_params)
    assert [type(i).__name__ for i in mine.parts.injections] == [type(i).__name__ for i in trained.parts.injections]
    assert [type(i.source).__name__ for i in mine.parts.injections] == [type(i.source).__name__ for i in trained.parts.injections]
    if algo:
        assert mine.parts.injections.injections[0].source is not None  # luffy: a source of expert rows
    assert mine.train_dataset.to_list() == trained.train_dataset.to_list() and len(mine.train_dataset) == 64
    assert [f.__name__ for f in mine.reward_funcs] == [f.__name__ for f in trained.reward_funcs]
    a, b = mine.args.to_dict(), trained.args.to_dict()
    a.pop("logging_dir", None), b.pop("logging_dir", None)
    assert a == b
    # once set by train alone, now by the assembly for every caller
    assert a["save_total_limit"] == (int(cfg.trainer.save_total_limit) or None) and a["logging_nan_inf_filter"] is False
    sa, sb = mine.model.state_dict(), trained.model.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert mine.processing_class.get_vocab() == trained.processing_class.get_vocab()
    # mixrl train's checkpoints record the config it trains under (a resume of an edited config.yaml is refused); other callers' do not
    from omegaconf import OmegaConf

    assert trained.spec.config == OmegaConf.to_container(cfg, resolve=True) and mine.spec.config is None
