"""FSDP on CPU: ``mixrl train hardware=cpu-2proc-fsdp`` (two gloo processes, PyTorch FSDP2 through
accelerate's FSDP plugin, :mod:`mixrl.trainer.fsdp`), end to end, with rows that land unevenly
across the processes.

One run of Guide (hints) where only process 0's groups are hinted (the reward is computed on
the process holding the completion, ``tests/fsdp_rewards.py``): the hinted rows' regeneration and
behaviour forward run on process 0 only, which under a sharded policy needs process 1 to join
every forward (without that the run dies on a gloo collective mismatch or hangs: both fail here,
the latter by the timeout). It trains 3 steps with checkpoints at steps 2 and 3, then:

* the parameters were sharded (rank 0 held about half of them: ``summary.json`` ``sharding``);
* ``model/`` loads in plain transformers and equals, tensor for tensor, the full state dict that
  accelerate's FSDP checkpointing gathered at the same step (``pytorch_model_fsdp.bin``), its tied
  output projection still tied, and differs from the starting model;
* ``mixrl train resume=RUN_DIR`` from the step-2 checkpoint (step 3's removed, as if the run had
  been killed during step 3) trains step 3 again and ends with exactly the same weights.

Each launch has a deadline: a hung process group is killed and the test fails with the log tail.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from train_process import train_in_group

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300  # per launch; ~45 s on a loaded 2-core machine
REWARD = "tests/fsdp_rewards.py:rank1_alternates"


def _mixrl(args: list[str], log: Path) -> tuple[int | str, float]:
    """``mixrl train ARGS`` in its own process group (:func:`train_process.train_in_group`); measured:
    a hung FSDP run is gone ~35 s after its Ctrl-C."""
    return train_in_group(args, log, timeout=TIMEOUT_S, grace=90)


def _tail(log: Path, n: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])


def _rank_logs(run: Path, n: int = 15) -> str:
    """The last lines of each launched process's own stderr (RUN_DIR/launch/logs, newest launch)."""
    out = []
    for log in sorted((run / "launch" / "logs").glob("*/attempt_*/*/stderr.log"), key=lambda p: p.stat().st_mtime)[-2:]:
        out.append(f"--- rank {log.parent.name}: {log}\n{_tail(log, n)}")
    return "\n".join(out)


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.fixture
def fsdp_model(tiny_bpe_model_path) -> str:
    """The model the FSDP run trains: the BPE chat model (byte-level BPE, chat-formatted prompts)."""
    return tiny_bpe_model_path


@pytest.fixture(scope="module")
def gloo():
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is needed for FSDP on CPU")


@pytest.mark.slow
def test_fsdp_two_processes_uneven_hints_save_load_and_resume(gloo, fsdp_model, tmp_path):
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    overrides = [
        "algo=guide", "hardware=cpu-2proc-fsdp", f"model.path={fsdp_model}", f"run_dir={run}", f"reward.name={REWARD}",
        "trainer.max_steps=3", "trainer.save_steps=2", "trainer.save_total_limit=0", "trainer.prompts_per_step=4",
        "algo.num_generations=4", "trainer.micro_batch_size=8", "trainer.eval_size=4", "trainer.max_completion_length=24",
        "data.train_size=64", "logger.progress=false", "hardware.torch_threads=1",
    ]
    rc, first_s = _mixrl(overrides, tmp_path / "train.log")
    assert rc == 0, f"the FSDP run failed ({rc}, {first_s:.0f} s):\n{_tail(tmp_path / 'train.log')}\n{_rank_logs(run)}"
    # each process's own output is kept (torchrun --log-dir --redirects 3 --tee 3): rank 1's too
    logs = sorted((run / "launch" / "logs").glob("*/attempt_0/*/stderr.log"))
    assert [p.parent.name for p in logs] == ["0", "1"], logs
    assert "[rank1] " in (tmp_path / "train.log").read_text() or logs[1].stat().st_size == 0

    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and "= 2 process(es)" in summary["geometry"]
    shard = summary["sharding"]
    assert shard["strategy"] == "fsdp" and shard["processes"] == 2
    assert 0.4 * shard["parameters"] < shard["parameters_this_process"] < 0.6 * shard["parameters"]

    # uneven rows: every step hinted exactly process 0's two groups (8 rows), none of process 1's
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["hint/groups"] == 0.5 and r["hinted/rows"] == 8 for r in rows), [
        {k: r.get(k) for k in ("step", "hint/groups", "hinted/rows")} for r in rows]

    # model/: plain transformers, the gathered FSDP weights of step 3, trained, still tied
    ckpt3 = run / "trainer" / "checkpoint-3"
    gathered = torch.load(ckpt3 / "pytorch_model_fsdp.bin", weights_only=True, map_location="cpu")
    loaded = AutoModelForCausalLM.from_pretrained(str(run / "model")).state_dict()
    assert set(loaded) == set(gathered)
    assert all(torch.equal(loaded[k], gathered[k]) for k in gathered), [k for k in gathered if not torch.equal(loaded[k], gathered[k])]
    if json.loads((run / "model" / "config.json").read_text()).get("tie_word_embeddings"):
        saved = _weights(run / "model")  # FSDP saves the tied output projection too: it must still be the embedding
        assert "lm_head.weight" not in saved or torch.equal(saved["lm_head.weight"], saved["model.embed_tokens.weight"])
    start = AutoModelForCausalLM.from_pretrained(fsdp_model).state_dict()
    assert any(not torch.equal(start[k], loaded[k]) for k in start), "3 steps changed no weight"

    # resume from step 2 (as if killed during step 3): step 3 again, the same weights
    uninterrupted = _weights(run / "model")
    shutil.rmtree(ckpt3)
    rc, resume_s = _mixrl([f"resume={run}", "trainer.max_steps=3", "--trust-run-code"], tmp_path / "resume.log")
    assert rc == 0, f"the FSDP resume failed ({rc}, {resume_s:.0f} s):\n{_tail(tmp_path / 'resume.log')}\n{_rank_logs(run)}"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from_step"] == 2 and summary["steps"] == 3
    resumed = _weights(run / "model")
    diff = {k: float((resumed[k] - uninterrupted[k]).abs().max()) for k in uninterrupted}
    assert max(diff.values()) == 0.0, f"resumed step 3 differs from the uninterrupted one: {diff}"
    print(f"FSDP CPU: train {first_s:.1f} s, resume {resume_s:.1f} s")


def test_a_sharded_policy_gets_one_forward_per_micro_batch(tiny_model_path, tmp_path):
    """Rows of two kinds (rollouts and expert rows): one process forwards each kind separately
    (each trimmed to its own width), a sharded policy forwards the micro-batch once, since the
    kinds differ between processes and every forward needs every process. Same log-probs."""
    from mixrl.config.compose import compose_config
    from mixrl.core import provenance as prov
    from mixrl.trainer import build

    cfg = compose_config(["algo=chord", f"model.path={tiny_model_path}", f"run_dir={tmp_path / 'run'}", "trainer.save_steps=0",
                          "logger.progress=false", "hardware.torch_threads=1", "trainer.eval_size=0", "data.train_size=16"])
    trainer = build.trainer_from_config(cfg)
    tok = trainer.processing_class
    g = torch.Generator().manual_seed(0)
    ids = lambda *shape: torch.randint(3, len(tok), shape, generator=g)  # noqa: E731
    c_mask = torch.ones(4, 6, dtype=torch.long)
    c_mask[2:, 3:] = 0  # the expert rows are shorter
    inputs = {"prompt_ids": ids(4, 5), "prompt_mask": torch.ones(4, 5, dtype=torch.long), "completion_ids": ids(4, 6),
              "completion_mask": c_mask, "row_source": torch.tensor([prov.ON_POLICY] * 2 + [prov.code("expert")] * 2)}
    widths = []
    forward = trainer._get_per_token_logps_and_entropies

    def counted(model, input_ids, attention_mask, logits_to_keep, **kw):
        widths.append(int(logits_to_keep))
        return forward(model, input_ids, attention_mask, logits_to_keep, **kw)

    trainer._get_per_token_logps_and_entropies = counted
    with torch.no_grad():
        alone, _ = trainer.parts.forwards.by_row_kind(trainer.model, inputs)
        assert sorted(widths) == [3, 6]
        widths.clear()
        trainer.parts.forwards.collective = True
        sharded, _ = trainer.parts.forwards.by_row_kind(trainer.model, inputs)
    assert widths == [6]
    m = c_mask.bool()
    assert torch.allclose(alone[m], sharded[m], atol=1e-5), (alone[m] - sharded[m]).abs().max()
