"""``mixrl plan``: compose a config (and with ``--sbatch``, write its SLURM job) and print its
plan (:mod:`mixrl.planning.render`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from mixrl.cli.console import OVERRIDES, err
from mixrl.cli.errors import user_errors
from mixrl.config.recipe_index import list_recipe_names
from mixrl.options import check_number, check_out_file, text_with, write_out_file

#: the mark of a job script `mixrl plan --sbatch` wrote (its second line, mixrl/slurm.py): such a file is rewritten, any other refused
SBATCH_MARK = text_with("# written by `mixrl plan --sbatch`")


@user_errors
def plan(
    overrides: Optional[List[str]] = OVERRIDES,
    prompt_tokens: Optional[int] = typer.Option(None, "--prompt-tokens", help="Prompt length assumed by the context check and the memory estimate (tokens; default data.max_prompt_tokens, else 512, the built-in task's longest prompt for builtin:arith)."),
    sbatch: Optional[Path] = typer.Option(None, "--sbatch", help="Also write a SLURM job script for this config to this file: "
                                          "hardware.num_machines nodes, one `mixrl train` per node, requeued on preemption "
                                          "(needs run_dir=PATH on a shared file system; see mixrl/slurm.py)."),
):
    """Context check, geometry, per-GPU memory estimate and launch command of a config, without loading the model.

    `mixrl plan recipe=chord/qwen2.5-7b-openr1` (a bare recipe name works too). The estimate
    (weights, gradients, optimizer state per ZeRO stage / FSDP, activations per micro-batch,
    vLLM share) is explained in mixrl/plan.py."""
    from mixrl.config.compose import compose_config  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.planning.render import render_plan  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    check_number(prompt_tokens, "--prompt-tokens", low=1, integer=True)
    if sbatch is not None:
        check_out_file(sbatch, "--sbatch", example="job.sh", written_by=SBATCH_MARK, command="mixrl plan --sbatch")  # a directory or an unwritable folder: refused before composing
    overrides = [f"recipe={o}" if "=" not in o and o in list_recipe_names() else o for o in (overrides or [])]
    composed = overrides
    if sbatch is not None and not any(o.startswith("hardware.main_process_ip=") for o in overrides):
        composed = [*overrides, "hardware.main_process_ip=slurm-first-node"]  # the job reads it from SLURM on each node
    cfg = compose_config(composed)
    if sbatch is not None:
        from mixrl.slurm import sbatch_script  # deferred: keeps `mixrl --help` light

        text = sbatch_script(cfg, overrides)  # checked (run_dir) before anything is written
        write_out_file(sbatch, text, "--sbatch", mode=0o755, written_by=SBATCH_MARK, command="mixrl plan --sbatch")  # missing folders are made
        err.print(f"wrote {sbatch}: sbatch {sbatch}", highlight=False, soft_wrap=True)
    sys.stdout.write(render_plan(cfg, overrides, prompt_tokens=prompt_tokens))
