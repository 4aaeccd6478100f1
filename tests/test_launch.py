"""The launcher (mixrl/launch.py): `mixrl train` starts the processes a hardware option asks
for, prints and records the command, and generates the accelerate / DeepSpeed configs.

The CPU test runs the real thing end to end (``mixrl train hardware=cpu-2proc``: two gloo
processes through ``torch.distributed.run``). The GPU options cannot start here: their
generated configs are checked by content and loaded with accelerate's own config reader
(DeepSpeed need not be installed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mixrl.config.compose import compose_config, group_options
from mixrl.errors import ConfigError
from mixrl.launch import accelerate_config, deepspeed_config, plan_launch, write_plan
from mixrl.config.hardware import needs_launch, world_size

ROOT = Path(__file__).resolve().parents[1]
GPU_OPTIONS = [o for o in group_options("hardware") if o.startswith("gpu-")]


def _cfg(*overrides: str):
    return compose_config(list(overrides))


# --------------------------------------------------------------------------- CPU, end to end
@pytest.mark.slow  # two training processes launched by `mixrl train`, ~40 s: `make test-slow`
def test_mixrl_train_cpu_2proc_launches_two_processes(tiny_model_path, tmp_path):
    """``mixrl train hardware=cpu-2proc`` (no torchrun by hand) trains 2 steps on 2 processes,
    prints the command and records it in RUN_DIR/launch/command.sh."""
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MIXRL_LAUNCHED")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    overrides = [
        "hardware=cpu-2proc", "trainer.prompts_per_step=2", "algo.num_generations=2", "trainer.max_steps=2",
        "trainer.eval_size=4", "trainer.max_completion_length=8", "data.train_size=8", "logger.progress=false",
        f"model.path={tiny_model_path}", f"run_dir={run_dir}",
    ]
    proc = subprocess.run([sys.executable, "-m", "mixrl.cli.main", "train", *overrides], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    command = (run_dir / "launch" / "command.sh").read_text()
    logs = run_dir / "launch" / "logs"
    assert (f"-m torch.distributed.run --nproc_per_node=2 --standalone --log-dir={logs} --redirects=3 --tee=3 "
            "-m mixrl.cli.main train hardware=cpu-2proc") in command
    # each process's own output, in its own files and on the console with its rank
    assert sorted(p.parent.name for p in logs.glob("*/attempt_0/*/stdout.log")) == ["0", "1"]
    assert "[rank0] " in output
    assert f"run_dir={run_dir}" in command
    assert "launching: " in output and "--nproc_per_node=2" in output.split("launching: ", 1)[1].splitlines()[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and "= 2 process(es)" in summary["geometry"]
    assert (run_dir / "model" / "config.json").is_file() and (run_dir / "launch" / "exit_status").read_text().startswith("0")


def test_cpu_2proc_composes_and_needs_a_launch():
    cfg = _cfg("hardware=cpu-2proc")
    assert world_size(cfg) == 2 and needs_launch(cfg, environ={})
    assert not needs_launch(cfg, environ={"WORLD_SIZE": "2"})  # inside the launched processes
    assert not needs_launch(_cfg(), environ={})  # one process: trains in place


def test_cpu_2proc_fsdp_gives_the_trainer_the_gpu_options_fsdp2_settings(tmp_path):
    """``hardware=cpu-2proc-fsdp``: torchrun (gloo) starts the processes, and the trainer gets
    FSDP2 as transformers' fsdp / fsdp_config arguments, the settings ``gpu-8x80g-fsdp`` writes
    into its accelerate config (run end to end: tests/test_fsdp_cpu.py)."""
    from mixrl.trainer.build import grpo_args

    cfg = _cfg("hardware=cpu-2proc-fsdp")
    assert world_size(cfg) == 2 and needs_launch(cfg, environ={}) and cfg.hardware.strategy == "fsdp"
    plan = plan_launch(cfg, ["hardware=cpu-2proc-fsdp"], tmp_path / "r", python="python")
    assert plan.argv[:4] == ["python", "-m", "torch.distributed.run", "--nproc_per_node=2"] and "accelerate.yaml" not in plan.files
    plugin = grpo_args(cfg, tmp_path).fsdp_plugin_args
    gpu = accelerate_config(_cfg("hardware=gpu-8x80g-fsdp"))["fsdp_config"]
    assert plugin["fsdp_version"] == gpu["fsdp_version"] == 2
    assert plugin["state_dict_type"] == gpu["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    assert plugin["auto_wrap_policy"] == gpu["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert plugin["reshard_after_forward"] is gpu["fsdp_reshard_after_forward"] is True
    assert grpo_args(_cfg("hardware=cpu-2proc"), tmp_path).fsdp_plugin_args is None  # DDP stays DDP


def test_cpu_plan_multi_node_flags(tmp_path):
    cfg = _cfg("hardware=cpu-2proc", "hardware.num_machines=2", "hardware.machine_rank=1",
               "hardware.main_process_ip=10.0.0.7", "hardware.main_process_port=29600")
    plan = plan_launch(cfg, ["hardware=cpu-2proc", "hardware.num_machines=2"], tmp_path / "r", python="python")
    assert plan.argv[:4] == ["python", "-m", "torch.distributed.run", "--nproc_per_node=2"]
    assert {"--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.7", "--master_port=29600"} <= set(plan.argv)
    assert "--standalone" not in plan.argv and plan.argv[-1] == f"run_dir={tmp_path / 'r'}"


def test_multi_node_needs_main_process_ip_and_a_shared_run_dir():
    with pytest.raises(ConfigError, match="main_process_ip"):
        _cfg("hardware=gpu-8x80g", "hardware.num_machines=2")
    with pytest.raises(ConfigError, match="machine_rank"):
        _cfg("hardware=gpu-8x80g", "hardware.num_machines=2", "hardware.main_process_ip=h", "hardware.machine_rank=2")
    from mixrl.launch import launch_run_dir

    cfg = _cfg("hardware=gpu-8x80g", "hardware.num_machines=2", "hardware.main_process_ip=h")
    with pytest.raises(ConfigError, match="run_dir=PATH"):
        launch_run_dir(cfg)


def test_launch_refuses_an_existing_run_before_writing(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text("{}")
    plan = plan_launch(_cfg("hardware=cpu-2proc"), [], run_dir)
    with pytest.raises(ConfigError, match="already exists"):
        write_plan(plan)
    assert not (run_dir / "launch").exists()


# --------------------------------------------------------------------------- GPU options: generated configs
def _load_accelerate(path: Path):
    from accelerate.commands.config.config_args import ClusterConfig

    return ClusterConfig.from_yaml_file(str(path))  # accelerate's own reader: unknown keys / bad values raise


@pytest.mark.parametrize("option", GPU_OPTIONS)
def test_every_gpu_option_composes_and_generates_a_valid_accelerate_config(option, tmp_path):
    cfg = _cfg(f"hardware={option}")
    hw = cfg.hardware
    plan = plan_launch(cfg, [f"hardware={option}"], tmp_path / "run", python="python", model_path="/models/m")
    write_plan(plan)
    files = {p.name for p in (tmp_path / "run" / "launch").iterdir()}
    acc = _load_accelerate(tmp_path / "run" / "launch" / "accelerate.yaml")
    raw = yaml.safe_load((tmp_path / "run" / "launch" / "accelerate.yaml").read_text())
    assert plan.argv[:5] == ["python", "-m", "accelerate.commands.launch", "--config_file", str(tmp_path / "run" / "launch" / "accelerate.yaml")]
    assert plan.argv[5:8] == ["-m", "mixrl.cli.main", "train"] and f"hardware={option}" in plan.argv
    assert acc.num_processes == int(hw.num_processes) and acc.num_machines == 1 and acc.use_cpu is False
    expected = {"ddp": "MULTI_GPU" if int(hw.num_processes) > 1 else "NO", "zero2": "DEEPSPEED", "zero3": "DEEPSPEED", "fsdp": "FSDP"}
    assert str(acc.distributed_type).split(".")[-1] == expected[hw.strategy]
    if hw.strategy in ("zero2", "zero3"):
        ds = json.loads((tmp_path / "run" / "launch" / "deepspeed.json").read_text())
        assert raw["deepspeed_config"]["deepspeed_config_file"] == str(tmp_path / "run" / "launch" / "deepspeed.json")
        assert raw["deepspeed_config"]["zero3_init_flag"] is (hw.strategy == "zero3")
        assert ds["zero_optimization"]["stage"] == {"zero2": 2, "zero3": 3}[hw.strategy]
        assert ds["bf16"]["enabled"] == "auto" and ds["train_micro_batch_size_per_gpu"] == "auto"
        assert ("offload_optimizer" in ds["zero_optimization"]) is bool(hw.offload)
        assert ("offload_param" in ds["zero_optimization"]) is (bool(hw.offload) and hw.strategy == "zero3")
    else:
        assert "deepspeed.json" not in files
        assert raw["mixed_precision"] == "bf16"
    if hw.strategy == "fsdp":
        assert raw["fsdp_config"]["fsdp_version"] == 2 and raw["fsdp_config"]["fsdp_state_dict_type"] == "FULL_STATE_DICT"
        assert raw["fsdp_config"]["fsdp_offload_params"] is bool(hw.offload)
    assert "command.sh" in files and ("vllm-server.sh" in files) is (hw.use_vllm and hw.vllm_mode == "server")


def test_zero3_offload_deepspeed_json():
    ds = deepspeed_config(_cfg("hardware=gpu-8x80g-zero3-offload"))
    z = ds["zero_optimization"]
    assert z["stage"] == 3 and z["offload_optimizer"]["device"] == "cpu" and z["offload_param"]["device"] == "cpu"
    assert z["stage3_gather_16bit_weights_on_model_save"] is True
    z2 = deepspeed_config(_cfg("hardware=gpu-8x80g-zero2", "hardware.offload=true"))["zero_optimization"]
    assert z2["stage"] == 2 and z2["offload_optimizer"]["device"] == "cpu" and "offload_param" not in z2


def test_user_deepspeed_json_is_used_instead_of_the_generated_one(tmp_path):
    mine = tmp_path / "my_ds.json"
    mine.write_text("{}")
    cfg = _cfg("hardware=gpu-8x80g-zero3", f"hardware.deepspeed={mine}")
    plan = plan_launch(cfg, [], tmp_path / "run", python="python")
    assert "deepspeed.json" not in plan.files
    assert yaml.safe_load(plan.files["accelerate.yaml"])["deepspeed_config"]["deepspeed_config_file"] == str(mine)


def test_multi_node_gpu_accelerate_config(tmp_path):
    cfg = _cfg("hardware=gpu-8x80g-zero3", "hardware.num_machines=2", "hardware.machine_rank=1",
               "hardware.main_process_ip=10.1.2.3", f"run_dir={tmp_path / 'shared'}")
    acc = accelerate_config(cfg, "ds.json")
    assert (acc["num_processes"], acc["num_machines"], acc["machine_rank"]) == (16, 2, 1)
    assert (acc["main_process_ip"], acc["main_process_port"]) == ("10.1.2.3", 29500)
    path = tmp_path / "acc.yaml"
    path.write_text(yaml.safe_dump(acc))
    assert _load_accelerate(path).main_process_ip == "10.1.2.3"


def test_vllm_server_mode_splits_the_gpus(tmp_path):
    cfg = _cfg("hardware=gpu-8x80g-vllm-server", "model=qwen2.5-math-7b")
    plan = plan_launch(cfg, [], tmp_path / "run", python="python", model_path="Qwen/Qwen2.5-Math-7B")
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and plan.server_env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    s = plan.server_argv
    assert s[:4] == ["trl", "vllm-serve", "--model", "Qwen/Qwen2.5-Math-7B"]
    assert s[s.index("--data_parallel_size") + 1] == "4" and s[s.index("--tensor_parallel_size") + 1] == "1"
    assert s[s.index("--gpu_memory_utilization") + 1] == "0.9" and s[s.index("--port") + 1] == "8000"
    assert "vllm-serve" in plan.files["command.sh"]
    from mixrl.trainer.build import grpo_args

    cfg.hardware.bf16 = False  # TrainingArguments refuses bf16 on a machine without a GPU
    args = grpo_args(cfg, tmp_path)
    assert (args.use_vllm, args.vllm_mode, args.vllm_server_port) == (True, "server", 8000)


def test_hardware_options_are_refused_where_they_cannot_run():
    with pytest.raises(ConfigError, match="needs CUDA GPUs"):
        _cfg("hardware=cpu-2proc", "hardware.strategy=zero3")
    with pytest.raises(ConfigError, match="strategy"):
        _cfg("hardware.strategy=zero4")
    with pytest.raises(ConfigError, match="offload"):
        _cfg("hardware=cpu-2proc-fsdp", "hardware.offload=true")
    with pytest.raises(ConfigError, match="offload"):
        _cfg("hardware=gpu-8x80g", "hardware.offload=true")
    with pytest.raises(ConfigError, match="vllm_tensor_parallel_size"):
        _cfg("hardware=gpu-8x80g-vllm-server", "hardware.vllm_tensor_parallel_size=3")


def test_missing_deepspeed_is_one_line_with_the_pip_line():
    """``mixrl train hardware=gpu-8x80g-zero3`` without DeepSpeed: exit 2, one line, the pip line
    (checked before CUDA, so it shows on any machine)."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is not None:
        pytest.skip("deepspeed is installed here")
    from typer.testing import CliRunner

    from mixrl.cli.main import app

    result = CliRunner().invoke(app, ["train", "hardware=gpu-8x80g-zero3"])
    lines = [ln for ln in result.output.strip().splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "pip install 'mixrl[deepspeed]'" in lines[0] and "hardware.strategy=zero3" in lines[0]
