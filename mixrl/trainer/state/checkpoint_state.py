"""What a checkpoint carries beyond TRL's own files, so that a resumed run continues exactly.

The trainer hands :func:`save` a ``{name: Stateful}`` of the parts that are on (each with
``state_dict()`` / ``load_state_dict()``, torch's ``Stateful`` protocol) and this module owns the
file names and which process writes what; :func:`load` is the reverse. The files are written
into the checkpoint folder *before* TRL writes its own (``trainer_state.json`` is written last,
so a checkpoint that looks complete has them even when the run is killed right after it):

======================  ==================================  ==========================================
part                    file                                written by
======================  ==================================  ==========================================
``progress``            ``mixrl_run_state.json``            the saving process: rollout counters and
                                                            TRL's micro-batch counter ``_step``
``controller``          ``mixrl_state.json`` "controller"   the saving process
``injections``          ``mixrl_state.json`` "injections"   the saving process; an injection with
                        ``mixrl_injection{i}_rank{r}.pt``   ``state_in_file`` (a replay buffer): every
                                                            process its own
``lag``, ``buffer``     ``mixrl_generation_rank{r}.pt``     every process its own: the lagged weight
                                                            snapshots; TRL's buffered generation batch
                                                            when a checkpoint falls inside one
``sampler``             ``mixrl_sampler.json``              the saving process
``critic``              ``mixrl_critic.pt``                 the saving process
any other (non-empty)   ``mixrl_{name}.pt``                 the saving process
======================  ==================================  ==========================================

A part that is on and finds nothing in a checkpoint of a step > 0 fails the resume with a
:class:`~mixrl.errors.ConfigError` naming the part (a run resumed with other processes, or a
checkpoint of a run configured without it). A part whose ``state_dict()`` is empty right after
construction (no state) is neither written nor looked for.
"""

from __future__ import annotations

import json
import os

import torch
from torch.distributed.checkpoint.stateful import Stateful

from mixrl.errors import ConfigError
from mixrl.trainer.state.resume import RUN_STATE_FILE

STATE_FILE = "mixrl_state.json"
GENERATION_FILE = "mixrl_generation_rank{rank}.pt"  # per process: lag snapshots, a buffered generation batch
SAMPLER_FILE = "mixrl_sampler.json"
CRITIC_FILE = "mixrl_critic.pt"  # the critic's weights and optimizer state, in every checkpoint
INJECTION_FILE = "mixrl_injection{i}_rank{rank}.pt"  # per process: an injection's own file (state_in_file)
_PER_PROCESS = ("lag", "buffer")  # merged into GENERATION_FILE
_LAID_OUT = ("progress", "controller", "injections", "sampler", "critic", *_PER_PROCESS)


def save(folder: str, parts: dict[str, Stateful], *, rank: int, should_save: bool) -> None:
    """Every part's state into the checkpoint ``folder``: per-process files by every process,
    shared ones by the saving process (``should_save``)."""
    def write_json(name: str, state) -> None:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, name), "w") as f:
            json.dump(state, f)

    generation: dict = {}
    for name in _PER_PROCESS:
        if name in parts:
            generation.update(parts[name].state_dict())
    if generation:  # every process saves its own
        os.makedirs(folder, exist_ok=True)
        torch.save(generation, os.path.join(folder, GENERATION_FILE.format(rank=rank)))
    injections = parts["injections"].state_dict() if "injections" in parts else None
    if should_save:
        if "progress" in parts:
            write_json(RUN_STATE_FILE, parts["progress"].state_dict())
        if "controller" in parts or injections is not None:
            write_json(STATE_FILE, {"controller": parts["controller"].state_dict() if "controller" in parts else None,
                                    "injections": injections["shared"] if injections is not None else []})
    if injections is not None and injections["per_process"]:  # every process saves its own (its buffer)
        os.makedirs(folder, exist_ok=True)
        for i, state in injections["per_process"].items():
            torch.save(state, os.path.join(folder, INJECTION_FILE.format(i=i, rank=rank)))
    if should_save:
        if "sampler" in parts:
            write_json(SAMPLER_FILE, parts["sampler"].state_dict())
        if "critic" in parts:
            os.makedirs(folder, exist_ok=True)
            torch.save(parts["critic"].state_dict(), os.path.join(folder, CRITIC_FILE))
        for name, part in parts.items():
            if name not in _LAID_OUT:
                state = part.state_dict()
                if state:
                    os.makedirs(folder, exist_ok=True)
                    torch.save(state, os.path.join(folder, f"mixrl_{name}.pt"))


def _missing(name: str, path: str, why: str) -> ConfigError:
    return ConfigError(f"resume: {path} is missing (the state of the {name} part: {why})")


def load(checkpoint: str, parts: dict[str, Stateful], *, rank: int, step: int, device) -> None:
    """Restore what :func:`save` wrote into ``checkpoint`` (after TRL restored its optimizer and
    scheduler). ``step``: the checkpoint's optimizer step (a part that is on and finds nothing
    fails for a step > 0)."""
    if "progress" in parts:  # a checkpoint written before the counters were recorded keeps the defaults
        path = os.path.join(checkpoint, RUN_STATE_FILE)
        state = {}
        if os.path.isfile(path):
            with open(path) as f:
                state = json.load(f)
        parts["progress"].load_state_dict(state)
    path = os.path.join(checkpoint, GENERATION_FILE.format(rank=rank))
    if os.path.exists(path):
        generation = torch.load(path, weights_only=True, map_location="cpu")
        if "lag" in parts:
            if "lag_snapshots" not in generation and step > 0:
                raise _missing("lag", f"{path}: lag_snapshots", "the lagged weights of trainer.staleness")
            if "lag_snapshots" in generation:
                parts["lag"].load_state_dict(generation)
        if "buffer" in parts and "buffered_inputs" in generation:
            parts["buffer"].load_state_dict(generation)
    elif "lag" in parts and step > 0:
        raise ConfigError(f"resume: {path} is missing (the lagged weights of trainer.staleness, the lag part); resume "
                          "with the same hardware.num_processes, or start a new run")
    path = os.path.join(checkpoint, STATE_FILE)
    shared = None
    if os.path.exists(path):
        with open(path) as f:
            shared = json.load(f)
    if "controller" in parts:
        if shared is not None and shared.get("controller") is not None:
            parts["controller"].load_state_dict(shared["controller"])
        elif step > 0:
            raise _missing("controller", f"{path}: controller", "the run was started without this controller; start a new run")
    if "injections" in parts and shared is not None:
        entries = shared.get("injections") or []
        per_process = {}
        for i, s in enumerate(entries):
            if isinstance(s, dict) and "state_file" in s:
                file = os.path.join(checkpoint, f"{s['state_file']}_rank{rank}.pt")
                if not os.path.exists(file):
                    raise ConfigError(
                        f"resume: {file} is missing (the checkpoint was saved by fewer processes; the injections part); "
                        "resume with the same hardware.num_processes")
                per_process[i] = torch.load(file, weights_only=True)
        parts["injections"].load_state_dict({"shared": entries, "per_process": per_process})
    elif "injections" in parts and step > 0 and parts["injections"].state_dict()["shared"]:
        raise _missing("injections", path, "the injections' state; start a new run")
    if "sampler" in parts:
        path = os.path.join(checkpoint, SAMPLER_FILE)
        if os.path.exists(path):
            with open(path) as f:
                parts["sampler"].load_state_dict(json.load(f))
        elif step > 0:
            raise ConfigError(f"resume: {path} is missing (the run was started without this sampler: the sampler part); "
                              "resume with the run's own sampler, or start a new run")
    if "critic" in parts:
        path = os.path.join(checkpoint, CRITIC_FILE)
        if not os.path.exists(path):
            raise ConfigError(f"resume: {path} is missing (the critic of algo.critic: the critic part); start a new run")
        parts["critic"].load_state_dict(torch.load(path, weights_only=True, map_location=device))
    for name, part in parts.items():
        if name in _LAID_OUT or not part.state_dict():
            continue
        path = os.path.join(checkpoint, f"mixrl_{name}.pt")
        if not os.path.exists(path):
            if step > 0:
                raise _missing(name, path, "start a new run")
            continue
        part.load_state_dict(torch.load(path, weights_only=True, map_location="cpu"))
