"""The TRL contract's scan (``tests/trl_scan.py``) resolves the receiver where the source says what it
is: an unrelated class's own ``self._save`` is not TRL's (SePPO's had to be renamed before), while the
same name on a TRL-derived class, on one of its mixins, on ``trainer``, on ``super()`` of a TRL-derived
class, or on ``self`` in a function outside any class (a method patched onto TRL) is still found."""

from __future__ import annotations

from pathlib import Path

from synthetic_package import write_package

from trl_scan import private_use_sites, private_uses  # tests/trl_scan.py (tests/ is on sys.path under pytest)

PRIVATE = {"_save", "_metrics", "_step"}


def test_an_unrelated_classs_own_private_is_not_flagged(tmp_path):
    pkg = write_package(tmp_path / "toy", {
        "__init__.py": "",
        "sources/seppo.py": ("import torch\n\n\nclass Base:\n    pass\n\n\n"
                             "class Sampler(Base, torch.nn.Module):\n    def _save(self, x):\n        return x\n\n"
                             "    def step(self):\n        self._save(1)\n        return super()._save(2)\n\n\n"
                             "class Keeper:\n    @classmethod\n    def make(cls):\n        return cls._save\n"),
    })
    assert private_uses(pkg, PRIVATE) == {}


def test_trl_privates_are_still_flagged_through_every_receiver_that_may_be_trls(tmp_path):
    pkg = write_package(tmp_path / "toy", {
        "__init__.py": "",
        "trainer/__init__.py": "",
        "trainer/mixin.py": "class SaveMixin:\n    def keep(self):\n        return self._save()\n",
        "trainer/grpo.py": ("from trl import GRPOTrainer\nfrom toy.trainer.mixin import SaveMixin\n\n\n"
                            "class Trainer(SaveMixin, GRPOTrainer):\n    def hook(self):\n        return super()._step\n\n\n"
                            "class Deeper(Trainer):\n    def m(self):\n        return self._metrics\n"),
        "trainer/steps.py": "def save_now(trainer):\n    trainer._save()\n",
        "trainer/patch.py": "def _post(self, url):\n    return self._metrics\n",
        "trainer/other.py": ("import transformers\n\n\nclass Callback(transformers.TrainerCallback):\n"
                             "    def on_step_end(self):\n        return self._step\n"),
        "sources/seppo.py": "class Sampler:\n    def step(self):\n        return self._save\n",  # its own: not flagged
    })
    assert private_use_sites(pkg, PRIVATE) == [
        ("_metrics", "toy/trainer/grpo.py:12"),  # self in a subclass of a TRL-derived class
        ("_metrics", "toy/trainer/patch.py:2"),  # self in a function outside any class (patched onto TRL)
        ("_save", "toy/trainer/mixin.py:3"),  # self in a mixin of a TRL-derived class
        ("_save", "toy/trainer/steps.py:2"),  # trainer.
        ("_step", "toy/trainer/grpo.py:7"),  # super() in a TRL-derived class
        ("_step", "toy/trainer/other.py:6"),  # self in a transformers-derived class (through a module alias)
    ]
    assert private_uses(pkg, PRIVATE) == {"_metrics": "toy/trainer/grpo.py:12", "_save": "toy/trainer/mixin.py:3",
                                          "_step": "toy/trainer/grpo.py:7"}
    assert private_uses(pkg, PRIVATE, listed={"_save", "_metrics"}) == {"_step": "toy/trainer/grpo.py:7"}


def test_assignments_to_patched_trl_attributes_are_resolved_by_their_owner(tmp_path):
    """``assignment_sites``: an assignment (or ``del``, ``setattr``, ``patch.object``) counts when its
    receiver may be the attribute's owner: the owner's class or module itself, ``self`` in a class deriving
    from the owner or mixed into one, any receiver the source does not pin down; not ``self`` in a class
    deriving from another TRL / transformers class, nor a local name only ever built as a class that is
    no owner."""
    from trl_scan import assignment_sites

    owners = {"generation_config": {"trl.GRPOTrainer"}, "generate": {"trl.generation.vllm_generation.VLLMGeneration"},
              "LLM": {"trl.generation.vllm_generation"}}
    pkg = write_package(tmp_path / "toy", {
        "__init__.py": "",
        "mixin.py": "class Curriculum:\n    def set(self, g):\n        self.generation_config = g\n",
        "grpo.py": ("from trl import GRPOTrainer\nfrom toy.mixin import Curriculum\n\n\n"
                    "class Trainer(Curriculum, GRPOTrainer):\n    def set(self, g):\n        self.generation_config, x = g, 1\n"),
        "callback.py": ("import transformers\n\n\nclass Eval(transformers.TrainerCallback):\n"
                        "    def __init__(self, generate, g):\n        self.generate = generate\n        self.generation_config = g\n"),
        "patch.py": ("from unittest import mock\nfrom trl.generation import vllm_generation\n\n\n"
                     "def f(t, llm, g):\n    del vllm_generation.LLM\n    t.vllm_generation.generate = g\n"
                     "    with mock.patch.object(vllm_generation, 'LLM', llm):\n        pass\n"),
        "model.py": ("from trl import GRPOTrainer\nfrom transformers import Qwen2ForCausalLM\n\n\n"
                     "def built(c, g):\n    model = Qwen2ForCausalLM(c)\n    model.generation_config = g\n"
                     "    trainer = GRPOTrainer(c)\n    trainer.generation_config = g\n"
                     "    other = Qwen2ForCausalLM(c) if c else g\n    other.generation_config = g\n"),
    })
    assert assignment_sites(pkg, owners) == [
        ("LLM", "toy/patch.py:6"),  # the owner module itself
        ("LLM", "toy/patch.py:8"),  # patch.object with the name written out
        ("generate", "toy/patch.py:7"),  # a receiver the source does not pin down
        ("generation_config", "toy/grpo.py:7"),  # self in a GRPOTrainer subclass (in a tuple)
        ("generation_config", "toy/mixin.py:3"),  # self in a mixin of one
        ("generation_config", "toy/model.py:11"),  # a local not only built as one class
        ("generation_config", "toy/model.py:9"),  # a local built as the owner
    ]
