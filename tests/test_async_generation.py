"""The actor-learner bookkeeping of ``hardware.vllm_async=true`` (mixrl.trainer.generation.async_generation),
against a fake engine: which weights generated each batch, when weights are pushed, what is kept.
No vLLM and no training here; tests/test_vllm_cpu.py trains through a real server."""

from __future__ import annotations

import threading

import pytest

from mixrl.config.compose import compose_config
from mixrl.errors import ConfigError
from mixrl.trainer.generation.async_generation import AsyncGeneration, Lookahead, staleness_stats


class FakeEngine:
    """A server holding "weights" (the trainer step they were pushed at); each completion says
    which weights sampled it. Pushing while a request runs is an error, as loading weights into an
    engine mid-generation would be."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.weights = None
        self.busy = threading.Lock()
        self.gate: threading.Event | None = None  # when set: generation blocks until it is released
        self.requests = []

    def generate(self, prompt_ids, n):
        with self.busy:
            if self.gate is not None:
                assert self.gate.wait(10)
            self.requests.append((prompt_ids, self.weights))
            return {"sampled_by": self.weights, "prompts": prompt_ids, "n": n}

    def push(self):
        assert self.busy.acquire(blocking=False), "weights pushed while the engine was generating"
        try:
            self.weights = self.trainer.step
        finally:
            self.busy.release()


class FakeTrainer:
    def __init__(self, k=1):
        self.step = 0
        self.engine = FakeEngine(self)
        self.snapshots_taken = []
        self.pipe = AsyncGeneration(self.engine.generate, self.engine.push, self._snapshot, max_staleness=k)

    def _snapshot(self):
        self.snapshots_taken.append(self.step)
        return {"w": self.step}

    def run(self, batches: list[list[list[int]]]) -> list[tuple[int, int, dict]]:
        """One optimizer step per batch, as MixrlGRPOTrainer drives the pipeline; returns
        (trainer step, recorded version, engine output) per step."""
        seen = []
        for t, prompts in enumerate(batches):
            self.step = t
            self.pipe.sync(t)
            out, version = self.pipe.generate(prompts, 2)
            if t + 1 < len(batches):
                self.pipe.submit(batches[t + 1], 2)
            seen.append((t, version, out))
        return seen


BATCHES = [[[i, i + 1]] for i in range(0, 10, 2)]  # 5 steps, one prompt each


def test_one_step_off_policy_versions_and_weights():
    tr = FakeTrainer(k=1)
    seen = tr.run(BATCHES)
    assert [v for _, v, _ in seen] == [0, 0, 1, 2, 3]  # the first batch by the initial weights, then one behind
    assert [t - v for t, v, _ in seen] == [0, 1, 1, 1, 1]
    for t, v, out in seen:  # each batch was sampled by the weights its version names, for its own prompts
        assert out["sampled_by"] == v and out["prompts"] == BATCHES[t]
    assert tr.pipe.pushes == 5 and tr.pipe.dropped == 0
    assert tr.pipe.pending is None  # nothing sent beyond the last step


def test_the_request_runs_while_the_trainer_trains():
    tr = FakeTrainer()
    tr.pipe.sync(0)
    tr.pipe.generate(BATCHES[0], 2)
    tr.engine.gate = threading.Event()
    request = tr.pipe.submit(BATCHES[1], 2)  # returns at once although the engine is blocked
    assert not request.future.done()
    tr.engine.gate.set()  # "training" ends; the engine finishes
    tr.step = 1
    tr.pipe.sync(1)  # waits for the request before loading new weights (FakeEngine.push asserts it)
    out, version = tr.pipe.generate(BATCHES[1], 2)
    assert (version, out["sampled_by"]) == (0, 0)


def test_max_staleness_k_pushes_only_when_a_batch_would_be_staler():
    tr = FakeTrainer(k=2)
    seen = tr.run(BATCHES)
    stale = [t - v for t, v, _ in seen]
    assert max(stale) == 2 and stale == [0, 1, 2, 1, 2]
    assert tr.pipe.pushes == 3  # steps 0, 2, 4
    assert all(out["sampled_by"] == v for _, v, out in seen)


def test_a_request_for_other_prompts_is_dropped_and_the_batch_generated_now():
    tr = FakeTrainer()
    tr.pipe.sync(0)
    tr.pipe.generate(BATCHES[0], 2)
    tr.pipe.submit(BATCHES[1], 2)
    tr.step = 1
    tr.pipe.sync(1)
    out, version = tr.pipe.generate(BATCHES[2], 2)  # e.g. the data order changed under the trainer
    assert version == 1 and out["sampled_by"] == 1 and tr.pipe.dropped == 1


def test_evaluation_generates_with_current_weights_and_keeps_the_request_in_flight():
    tr = FakeTrainer()
    tr.pipe.sync(0)
    tr.pipe.generate(BATCHES[0], 2)
    tr.pipe.submit(BATCHES[1], 2)
    tr.step = 1  # the optimizer step is done; evaluation runs before the next batch
    assert tr.pipe.sync(1, training=False)
    out, version = tr.pipe.generate([[99]], 2, training=False)
    assert (version, out["sampled_by"]) == (1, 1)
    out, version = tr.pipe.generate(BATCHES[1], 2)  # the training batch still comes from the request in flight
    assert (version, out["sampled_by"]) == (0, 0)


def test_snapshots_kept_only_for_versions_that_may_still_be_trained():
    tr = FakeTrainer()
    tr.run(BATCHES[:3])
    assert tr.snapshots_taken == [0, 1, 2]
    assert sorted(tr.pipe.weights) == [1, 2]  # version 1's batch is trained at step 2; version 0's snapshot is gone
    tr2 = FakeTrainer()
    tr2.pipe.sync(0)
    tr2.pipe.generate(BATCHES[0], 2)
    tr2.pipe.submit(BATCHES[1], 2)
    tr2.step = 1
    tr2.pipe.sync(1)
    assert sorted(tr2.pipe.weights) == [0, 1]  # the batch in flight (version 0) is trained at step 1
    assert tr2.pipe.weights_of(0) == {"w": 0}
    with pytest.raises(RuntimeError, match="no snapshot of policy version 5"):
        tr2.pipe.weights_of(5)


def test_an_engine_error_surfaces_where_the_batch_is_used():
    tr = FakeTrainer()
    tr.pipe.sync(0)
    tr.pipe.generate(BATCHES[0], 2)

    def broken(ids, n):
        raise ConnectionError("server gone")

    tr.pipe._generate = broken
    tr.pipe.submit(BATCHES[1], 2)
    tr.step = 1
    tr.pipe.sync(1)  # waiting for the failed request does not raise here
    with pytest.raises(ConnectionError, match="server gone"):
        tr.pipe.generate(BATCHES[1], 2)


def test_lookahead_peeks_without_changing_the_sequence():
    la = Lookahead(iter(range(5)))
    assert next(la) == 0
    assert la.peek(0) == 1 and la.peek(2) == 3
    assert list(la) == [1, 2, 3, 4]
    assert la.peek(0) is None


def test_staleness_stats_count_only_rows_a_policy_sampled():
    assert staleness_stats(3, [2, 2, -1, 3]) == {"staleness/mean": pytest.approx(2 / 3), "staleness/max": 1.0}
    assert staleness_stats(3, [-1, -1]) == {}


SERVER = ["hardware=cpu", "hardware.use_vllm=true", "hardware.vllm_mode=server", "hardware.vllm_async=true"]


@pytest.mark.parametrize("algo", ["grpo", "chord", "luffy"])
def test_async_is_accepted_where_rollouts_are_the_loaders_prompts(algo):
    cfg = compose_config([f"algo={algo}", *SERVER])
    assert cfg.hardware.vllm_async and cfg.hardware.vllm_async_max_staleness == 1


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["hardware.vllm_mode=colocate"], "set hardware.use_vllm=true hardware.vllm_mode=server"),
        (["hardware.vllm_async_max_staleness=0"], "must be >= 1"),
        (["trainer.num_iterations=2"], "set trainer.num_iterations=1"),
        (["algo=prefix_rft"], "sets generation prefixes"),
        (["algo=ghpo"], "generates more completions"),
    ],
)
def test_async_layouts_it_does_not_handle_are_refused_in_one_line(overrides, expected):
    with pytest.raises(ConfigError, match=expected) as e:
        compose_config([*SERVER, *overrides])
    assert "\n" not in str(e.value)
