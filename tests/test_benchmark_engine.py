"""The benchmarks' generation on the trainer's colocated vLLM engine (``mixrl.benchmarks.engine``), with
vLLM and the engine faked: the trainer's ``generate_on_engine`` wakes an engine TRL put to sleep, and
puts it back to sleep as TRL leaves it (level 2, TRL's ``_llm_weights_sleeping`` set), even when the
generation fails; without sleep mode it only generates. A real engine: tests/test_vllm_cpu.py
(``test_colocate_chord_three_steps_syncs_moving_weights``, sleep mode off on CPU)."""

from __future__ import annotations

import sys
import types

import pytest

from mixrl.benchmarks.engine import EngineGenerator, pair_seed


class _Engine:
    """A colocated ``vllm.LLM``: records what it is asked, echoes each request's tokens."""

    def __init__(self, fail: bool = False):
        self.events, self.fail = [], fail
        self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=64))

    def wake_up(self, tags):
        self.events.append(("wake_up", tuple(tags)))

    def sleep(self, level):
        self.events.append(("sleep", level))

    def generate(self, requests, params, use_tqdm=True):
        self.events.append(("generate", [r["prompt_token_ids"] for r in requests], [p.seed for p in params], use_tqdm))
        if self.fail:
            raise RuntimeError("engine failed")
        return [types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=r["prompt_token_ids"][::-1])])
                for r in requests]


class _Tokenizer:
    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


def _trainer(engine: _Engine, sleep_mode: bool):
    from mixrl.trainer.grpo import MixrlGRPOTrainer

    t = types.SimpleNamespace(vllm_generation=types.SimpleNamespace(llm=engine, enable_sleep_mode=sleep_mode),
                              push_engine_weights=lambda: False)
    t.generate_on_engine = types.MethodType(MixrlGRPOTrainer.generate_on_engine, t)
    return t


@pytest.fixture
def fake_vllm(monkeypatch):
    import mixrl.trainer.grpo  # noqa: F401  (TRL first: it looks vllm up when imported, and a fake has no spec)

    class SamplingParams:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=SamplingParams))


def _generate(trainer):
    return EngineGenerator(trainer).generate(_Tokenizer(), ["ab", "xyz"], [4, 7], temperature=0.0, top_p=None,
                                             max_new_tokens=8, seed=3)


def test_a_sleeping_engine_is_woken_and_put_back_to_sleep_as_trl_leaves_it(fake_vllm):
    engine = _Engine()
    trainer = _trainer(engine, sleep_mode=True)
    assert _generate(trainer) == ["ba", "zyx"]
    requests, seeds = [[97, 98], [120, 121, 122]], [pair_seed(3, 4), pair_seed(3, 7)]
    assert engine.events == [("wake_up", ("kv_cache",)), ("generate", requests, seeds, False), ("sleep", 2)]
    assert trainer.vllm_generation._llm_weights_sleeping is True  # TRL pushes the weights again before its next generation


def test_a_failed_generation_still_puts_the_engine_back_to_sleep(fake_vllm):
    engine = _Engine(fail=True)
    trainer = _trainer(engine, sleep_mode=True)
    with pytest.raises(RuntimeError, match="engine failed"):
        _generate(trainer)
    assert [e[0] for e in engine.events] == ["wake_up", "generate", "sleep"]
    assert trainer.vllm_generation._llm_weights_sleeping is True


def test_without_sleep_mode_the_engine_only_generates(fake_vllm):
    engine = _Engine()
    trainer = _trainer(engine, sleep_mode=False)
    assert _generate(trainer) == ["ba", "zyx"]
    assert [e[0] for e in engine.events] == ["generate"]
    assert not hasattr(trainer.vllm_generation, "_llm_weights_sleeping")
