"""One optimizer step of a mixrl trainer under ``torchrun``; dumps what every row did.

Run by ``tests/test_ddp.py`` (not collected by pytest)::

    torchrun --nproc_per_node W tests/ddp_worker.py --model DIR --out DIR --case luffy:6 --case chord:3

Each ``--case ALGO:MICRO[:K[:N]]`` builds the trainer exactly as ``mixrl.trainer.run.train``
does (composed config, ``hardware.num_processes`` = the torchrun world size,
``trainer.micro_batch_size`` = MICRO, LUFFY's ``algo.inject.per_group`` = K,
``trainer.max_tokens_per_micro_batch`` = N), runs
``trainer.train()`` for one optimizer step and writes, from rank 0,
``OUT/<algo>[-k<K>]-w<W>-m<MICRO>.json`` and ``.grad.pt``:

* ``rows``: every row of the step (rollouts and expert rows, all processes) with its
  global id, the rank that held it, prompt and completion text, ``row_source``,
  advantage and its contribution to the step objective. The contribution is the
  objective (``compute_objective``) of that row alone with the trainer's global
  normalisers, divided by W (DDP averages gradients over processes), so the
  contributions of all rows add up to the step's objective whatever W and the
  accumulation are, and can be compared row by row across runs.
* ``micro_batches``: per micro-batch, the trainer's loss and the sum of its rows'
  contributions (times W), which must agree (the objective is linear in rows).
* ``.grad.pt``: the flattened gradient at ``on_pre_optimizer_step`` (after DDP's
  all-reduce and accumulation; clipping is disabled), and ``grad_norms`` per rank.

Determinism: rollouts are not sampled. ``GRPOTrainer._generate_single_turn`` (the
parent mixrl's override calls) is replaced by a fixed function of the prompt and the
rollout's slot in its group, so 1- and 2-process runs score the same completions. CHORD's
expert-row draw (``AppendRows.sample``, seeded per process) is replaced by global expert
rows ``[p*r, (p+1)*r)`` of the pool for process p, so the runs train on the same rows.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

import torch  # noqa: E402

EXPERT_GID = 1000  # global ids of CHORD's appended expert rows start here
PROMPTS_PER_STEP = 3
NUM_GENERATIONS = 4  # 12 rows; with 2 processes rows 4..7 (group 1) straddle ranks 0 and 1
EXPERT_ROWS = 4  # CHORD: a multiple of processes x micro-batches for every case the test runs


def fixed_completion(prompt: str, slot: int) -> str:
    """The "rollout" of ``prompt`` in group slot ``slot``: right on every other slot (shifted by the
    prompt's length so groups differ), wrong otherwise, with lengths that vary."""
    expr = prompt.strip().rstrip("=")
    if not re.fullmatch(r"[0-9+\-*]+", expr):
        raise ValueError(f"unexpected arith prompt {prompt!r}")
    answer = eval(expr)  # noqa: S307 - digits and + - * only
    if (slot + len(prompt)) % 2 == 1:
        return f"{answer} #### {answer}"
    return f"{slot}{'9' * slot} #### {answer + slot + 1}"


def patch_generation() -> None:
    import trl

    def generate(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        tok = self.processing_class
        start = self.accelerator.process_index * len(prompt_ids)
        out = []
        for i, ids in enumerate(prompt_ids):
            prompt = tok.decode(ids, skip_special_tokens=True)
            text = fixed_completion(prompt, (start + i) % num_generations)
            out.append(list(tok(text=text, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id])
        return out, None

    trl.GRPOTrainer._generate_single_turn = generate


def patch_chord_sample() -> None:
    from mixrl.sources.inject import AppendRows

    def sample(self, ctx):
        p, r = ctx.process_index, self.geometry.expert_rows_per_process
        pool = self.source.pool
        picks = []
        for g in range(p * r, (p + 1) * r):
            row = pool[g % len(pool)]
            picks.append((row["prompt"], row["expert"][0]))
        return picks

    AppendRows.sample = sample


def make_trainer(overrides: list[str], callbacks: list):
    """What ``mixrl.trainer.run.train`` builds (the same assembly; without its evaluation and saving)."""
    from mixrl.config.compose import compose_config
    from mixrl.config.geometry import geometry
    from mixrl.trainer import build

    cfg = compose_config(overrides)
    return build.trainer_from_config(cfg, callbacks=callbacks), geometry(cfg)


def run_case(algo: str, micro: int, k: int | None, model: str, out: Path, budget: int | None = None) -> None:
    import torch.distributed as dist
    from transformers import TrainerCallback

    from mixrl.core.objective import compute_objective

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    name = f"{algo}{'' if k is None else f'-k{k}'}-w{world}-m{micro}{'' if budget is None else f'-b{budget}'}"
    overrides = [
        f"algo={algo}",
        f"model.path={model}",
        f"hardware.num_processes={world}",
        f"trainer.prompts_per_step={PROMPTS_PER_STEP}",
        f"algo.num_generations={NUM_GENERATIONS}",
        f"trainer.micro_batch_size={micro}",
        "trainer.max_steps=1",
        "trainer.max_grad_norm=0",  # no clipping: compare raw gradients
        "trainer.eval_size=0",
        "trainer.max_completion_length=24",
        "data.train_size=16",
        "logger.progress=false",
        f"run_dir={out / 'runs' / name}",
    ]
    if k is not None:
        overrides.append(f"algo.inject.per_group={k}")
    if budget is not None:  # token-budget micro-batches (mixrl.trainer.parts.token_budget)
        overrides.append(f"trainer.max_tokens_per_micro_batch={budget}")
    if algo == "chord":
        # a fixed count (wins over the ratio): the preset's expert_ratio rounds to a multiple of
        # processes x micro-batches, which would give the 1-process, 1-micro-batch run fewer expert rows
        overrides.append(f"algo.inject.rows={EXPERT_ROWS}")

    state: dict = {"grad": None}

    class GradCapture(TrainerCallback):  # after DDP's all-reduce, before the optimizer step
        def on_pre_optimizer_step(self, args, st, control, **kwargs):
            grads = [
                (p.grad if p.grad is not None else torch.zeros_like(p)).detach().flatten().clone()
                for p in trainer.model.parameters()  # `trainer` is bound below, before train()
                if p.requires_grad
            ]
            state["grad"] = torch.cat(grads).double()

    trainer, geom = make_trainer(overrides, [GradCapture()])
    tok = trainer.processing_class
    rows: dict[int, dict] = {}
    micro_batches: list[dict] = []

    gen_orig = trainer._generate_and_score_completions

    def gen_and_score(inputs):
        out_ = gen_orig(inputs)
        n_roll, n = len(inputs), out_["completion_ids"].shape[0]
        n_exp = n - n_roll
        gid = [rank * n_roll + i for i in range(n_roll)] + [EXPERT_GID + rank * n_exp + j for j in range(n_exp)]
        out_["test_gid"] = torch.tensor(gid, dtype=torch.long, device=out_["completion_ids"].device)
        for i, g in enumerate(gid):
            pm, cm = out_["prompt_mask"][i].bool(), out_["completion_mask"][i].bool()
            rows[g] = {
                "gid": g,
                "rank": rank,
                "prompt": tok.decode(out_["prompt_ids"][i][pm].tolist(), skip_special_tokens=True),
                "completion": tok.decode(out_["completion_ids"][i][cm].tolist(), skip_special_tokens=True),
                "completion_tokens": int(cm.sum()),
                "source": int(out_["row_source"][i]),
                "advantage": float(out_["advantages"][i]),
            }
        return out_

    trainer._generate_and_score_completions = gen_and_score

    logps_orig = trainer.parts.forwards.by_row_kind
    captured: dict = {}

    def logps_hook(*args, **kwargs):
        res = logps_orig(*args, **kwargs)
        captured["logps"], captured["entropies"] = res[0].detach(), None if res[1] is None else res[1].detach()
        return res

    trainer.parts.forwards.by_row_kind = logps_hook

    loss_orig = trainer._compute_loss

    def compute_loss(model_, inputs):
        loss = loss_orig(model_, inputs)
        logps, ent = captured["logps"], captured["entropies"]
        total = 0.0
        for i in range(logps.shape[0]):
            sl = slice(i, i + 1)
            old = inputs.get("old_per_token_logps")
            ref = inputs.get("ref_per_token_logps")
            with torch.no_grad():
                row_loss, _ = compute_objective(
                    trainer.objective,
                    logp=logps[sl],
                    mask=inputs["completion_mask"][sl],
                    advantages=inputs["advantages"][sl],
                    token_source=inputs["token_source"][sl],
                    old_logp=None if old is None else old[sl],
                    behaviour_logp=inputs["behaviour_logp"][sl],
                    ref_logp=None if ref is None else ref[sl],
                    entropies=None if ent is None else ent[sl],
                    step=trainer.state.global_step,
                    normalisers=trainer.batch_in_flight.normalisers,
                )
            total += float(row_loss)
            rows[int(inputs["test_gid"][i])]["contribution"] = float(row_loss) / world
        micro_batches.append({"rank": rank, "rows": int(logps.shape[0]), "loss": float(loss.detach()), "sum_rows": total})
        return loss

    trainer._compute_loss = compute_loss

    trainer.train()

    grad = state["grad"]
    assert grad is not None, "on_pre_optimizer_step was not called"
    prompts = {r["prompt"] for r in rows.values()}
    experts = {r["prompt"]: list(r["expert"]) for r in trainer.train_dataset if r["prompt"] in prompts and r.get("expert")}
    meta = {
        "rows": list(rows.values()),
        "experts": experts,
        "micro_batches": micro_batches,
        "grad_norm": float(grad.norm()),
        "normalisers": trainer.batch_in_flight.normalisers,
    }
    gathered = [meta]
    if world > 1:
        gathered = [None] * world
        dist.all_gather_object(gathered, meta)
    if rank == 0:
        result = {
            "name": name,
            "algo": algo,
            "world": world,
            "micro_batch_size": micro,
            "grad_accum": geom.grad_accum,
            "num_generations": geom.num_generations,
            "experts_per_group": int(getattr(trainer.parts.injections.injections[0], "per_group", 0)),
            "rows": sorted((r for m in gathered for r in m["rows"]), key=lambda r: r["gid"]),
            "micro_batches": [b for m in gathered for b in m["micro_batches"]],
            "experts": {p: e for m in gathered for p, e in m["experts"].items()},
            "grad_norms": [m["grad_norm"] for m in gathered],
            "normalisers": [m["normalisers"] for m in gathered],
        }
        (out / f"{name}.json").write_text(json.dumps(result, indent=1))
        torch.save(grad, out / f"{name}.grad.pt")
    if world > 1:
        dist.barrier()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="tiny model directory")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--case", action="append", required=True,
                    help="ALGO:MICRO_BATCH_SIZE[:EXPERTS_PER_GROUP[:TOKEN_BUDGET]], e.g. luffy:6, luffy:3:3 or grpo:6::40")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    patch_generation()
    patch_chord_sample()
    for case in a.case:
        algo, micro, *rest = case.split(":")
        k = int(rest[0]) if rest and rest[0] else None
        run_case(algo, int(micro), k, a.model, out, budget=int(rest[1]) if len(rest) > 1 else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
