"""Generate the objective and trainer pins from TODAY's code.

Run at commit 1f21884 (main, "README lists the exact group options; ...") on branch
``pins``, on CPU with one torch thread::

    OMP_NUM_THREADS=1 python tests/pins/make_pins.py            # both fixtures
    OMP_NUM_THREADS=1 python tests/pins/make_pins.py --only trainer --trainer-out /tmp/x.json

The cases of ``trainer_pins_more.json`` (one per ``conf/algo/*.yaml`` the first pins did not
cover) were added later, at commit 452baff on branch ``i23-pins``, on the committed pin model,
with ``ATEN_CPU_CAPABILITY=avx2``; they are made alone, and the same warning holds for them::

    ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=1 python tests/pins/make_pins.py --only trainer-more

DO NOT RE-RUN THIS AFTER THE OBJECTIVE REFACTOR (mixrl/core/objective.py,
mixrl/trainer/mixing.py, mixrl/trainer/grpo.py, build.py, config): the pins are the OLD
code's values, and the refactor must reproduce them (to 1e-6). Re-generating them from
the new code would pin whatever the new code does and prove nothing. (The objective part
imports today's ``compute_objective(spec, ...)`` and ``build_objective(cfg)``, which the
refactor replaces, so it is expected to stop running.)

Fixtures written next to this file:

``objective_pins.json``: ``{"meta": ..., "cases": {key: case}}``. For every
``conf/algo/*.yaml`` except ``sft_then_rl`` (a staged algo: no objective of its own; its
stages are ``algo=sft`` and ``algo=grpo``, pinned as themselves) and every CPU recipe
(``recipes/*/arith-tiny.yaml`` except ``sft_then_rl/arith-tiny``, plus
``chord/mu-arith-tiny`` and ``chord/phi-arith-tiny``), the objective of today's
``build_objective(compose_config(overrides))`` on ``batch.make_batch(kind, seed)`` with
``kind`` = the spec's ``mix_mode``, for step in {0, 7} x normalisers in {local (None),
global (local counts x 2.5)} x {as configured, ``algo.kl.coef=0.05``,
``algo.entropy_coef=0.01``}. Key: ``"<algo=X|recipe=Y>|step=S|norm=local|global[|kl=0.05|ent=0.01]"``.
Each case holds the ``overrides`` to recompose its config, ``batch`` {kind, seed}, ``step``,
``normalisers`` (null or {"on_policy"|"expert"|"all": [tokens, rows]}), ``loss``,
``metrics`` (every metric returned), ``grad_logp`` and ``grad_entropies`` ([8][7] lists:
d loss / d input; all zeros where no gradient flows). Floats are rounded to 9
significant digits (float32 is exact at 9).

``trainer_pins.json``: ``{"meta": ..., "cases": {key: {"overrides": [...], "result": ...}}}``
where ``result`` is ``harness.run_one_step(overrides, model_path, out_dir)`` on the tiny
model warm-started for 10 steps (``mixrl.models.tiny.warm_start(dir, steps=10)``, which is
bit-deterministic on one machine but not across CPUs; its ``model.safetensors`` sha256 is in
``meta``). That model, made on an avx2 CPU, is committed as ``tests/fixtures/pin-model`` (on an
avx512 machine, ``ATEN_CPU_CAPABILITY=avx2`` rebuilds it bit for bit), and the trainer pins run on it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
for p in (str(HERE), str(REPO)):
    if p not in sys.path:
        sys.path.insert(0, p)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402

from batch import make_batch  # noqa: E402

COMMIT = "1f21884"
BATCH_SEED = 0
STEPS = (0, 7)
GLOBAL_SCALE = 2.5  # "global" normalisers: local counts x 2.5, as if the micro-batch were part of a larger step
VARIANTS = {"": [], "kl=0.05": ["algo.kl.coef=0.05"], "ent=0.01": ["algo.entropy_coef=0.01"]}
TINY_STEPS = 10

#: the trainer pins' geometry: 4 prompts x 4 generations = 16 rows = 2 micro-batches of 8, one step
TRAINER_BASE = [
    "trainer.max_steps=1",
    "trainer.prompts_per_step=4",
    "algo.num_generations=4",
    "trainer.micro_batch_size=8",
    "trainer.max_grad_norm=0",  # no clipping: pin the raw gradient
    "trainer.eval_size=0",
    "trainer.max_completion_length=24",
    "trainer.logging_steps=1",
    "data.train_size=16",
    "logger.progress=false",
    "hardware.torch_threads=1",
]
TRAINER_ALGOS = ["grpo", "dr_grpo", "gspo", "cispo", "topr", "sapo", "m2po", "bapo", "sft", "mix", "chord", "luffy"]
TRAINER_RECIPES = ["chord/mu-arith-tiny", "chord/phi-arith-tiny"]
#: num_iterations=2: TRL reuses one generation batch for 2 optimizer steps (ratios != 1 in the second);
#: a large learning rate moves the policy far enough that clipping, M2PO's mask and BAPO's bounds act
TRAINER_ITER2 = ["grpo", "chord", "luffy", "m2po", "bapo"]
ITER2 = ["trainer.num_iterations=2", "trainer.max_steps=2", "trainer.learning_rate=1e-3"]
AUX_ROWS = ["algo.mix.expert_rows=4"]  # aux_loss (CHORD, mix): a multiple of processes x micro-batches


def r9(x: float) -> float:
    return float(f"{float(x):.9g}")


def _grid(t: torch.Tensor | None, like: torch.Tensor) -> list[list[float]]:
    t = torch.zeros_like(like) if t is None else t
    return [[r9(v) for v in row] for row in t.detach().tolist()]


# --------------------------------------------------------------------------- objective
def objective_configs() -> list[tuple[str, list[str]]]:
    from mixrl.config.compose import conf_dir, recipes_dir

    out = []
    for p in sorted((conf_dir() / "algo").glob("*.yaml")):
        if p.stem != "sft_then_rl":
            out.append((f"algo={p.stem}", [f"algo={p.stem}"]))
    recipes = sorted(p.parent.name + "/arith-tiny" for p in recipes_dir().glob("*/arith-tiny.yaml"))
    recipes = [r for r in recipes if r != "sft_then_rl/arith-tiny"] + ["chord/mu-arith-tiny", "chord/phi-arith-tiny"]
    for r in recipes:
        out.append((f"recipe={r}", [f"recipe={r}"]))
    return out


def local_counts(batch: dict) -> dict[str, tuple[float, float]]:
    mask = batch["mask"].float()
    exp = (batch["row_source"] == 1).float().unsqueeze(1)

    def counts(m):
        return float(m.sum()), float((m.sum(-1) > 0).sum())

    return {"on_policy": counts(mask * (1 - exp)), "expert": counts(mask * exp), "all": counts(mask)}


def objective_case(overrides: list[str], step: int, norm: str) -> dict:
    from mixrl.config.compose import compose_config
    from mixrl.core.objective import compute_objective
    from mixrl.trainer.build import build_objective

    spec = build_objective(compose_config(overrides))
    b = make_batch(spec.mix_mode, BATCH_SEED)
    normalisers = None
    if norm == "global":
        normalisers = {k: (t * GLOBAL_SCALE, r * GLOBAL_SCALE) for k, (t, r) in local_counts(b).items()}
    loss, metrics = compute_objective(
        spec, logp=b["logp"], mask=b["mask"], advantages=b["advantages"], row_source=b["row_source"],
        old_logp=b["old_logp"], ref_logp=b["ref_logp"], entropies=b["entropies"], step=step, normalisers=normalisers,
    )
    loss.backward()
    return {
        "overrides": list(overrides),
        "batch": {"kind": spec.mix_mode, "seed": BATCH_SEED},
        "step": step,
        "normalisers": None if normalisers is None else {k: list(v) for k, v in normalisers.items()},
        "loss": r9(loss.detach()),
        "metrics": {k: r9(v) for k, v in metrics.items()},
        "grad_logp": _grid(b["logp"].grad, b["logp"]),
        "grad_entropies": _grid(b["entropies"].grad, b["entropies"]),
    }


def make_objective_pins() -> tuple[dict, list[str]]:
    from mixrl.errors import ConfigError

    cases, skipped = {}, []
    for name, base in objective_configs():
        for tag, extra in VARIANTS.items():
            overrides = base + extra
            for step in STEPS:
                for norm in ("local", "global"):
                    key = "|".join([name, f"step={step}", f"norm={norm}"] + ([tag] if tag else []))
                    try:
                        cases[key] = objective_case(overrides, step, norm)
                    except ConfigError as e:
                        skipped.append(f"{key}: {e}")
    meta = {
        "commit": COMMIT,
        "batch": "tests/pins/batch.py make_batch(kind, seed)",
        "global_normalisers": f"local counts x {GLOBAL_SCALE}",
        "rounding": "9 significant digits",
        "skipped": skipped + ["algo=sft_then_rl, recipe=sft_then_rl/arith-tiny: staged algo, no objective of its own "
                              "(its stages algo=sft and algo=grpo are pinned)"],
    }
    return {"meta": meta, "cases": cases}, skipped


# --------------------------------------------------------------------------- trainer
def sft_then_rl_stage_overrides() -> list[tuple[str, list[str]]]:
    """The override list of each sft_then_rl stage, as ``compose_stages`` composes it
    (``algo=<stage.algo>`` + the non-algo overrides + the stage's overrides + its max_steps),
    with ``trainer.max_steps=1`` last (one step each). Checked against ``compose_stages``."""
    from omegaconf import OmegaConf

    from mixrl.config.compose import compose_config, compose_stages

    outer = ["algo=sft_then_rl", *TRAINER_BASE]
    cfg = compose_config(outer)
    stages = compose_stages(cfg, outer)
    keep = [o for o in TRAINER_BASE if not o.startswith("algo.")]
    out = []
    for st, (name, stage_cfg) in zip(cfg.algo.stages, stages):
        ovs = [f"algo={st.algo}", *keep, *list(st.get("overrides") or [])]
        if st.get("max_steps") is not None:
            ovs.append(f"trainer.max_steps={int(st.max_steps)}")
        mine = compose_config(ovs)
        assert OmegaConf.to_yaml(mine) == OmegaConf.to_yaml(stage_cfg), f"stage {name}: override list differs from compose_stages"
        out.append((name, [*ovs, "trainer.max_steps=1"]))
    return out


def trainer_cases() -> dict[str, list[str]]:
    cases: dict[str, list[str]] = {}
    aux = {"chord", "mix"}
    for algo in TRAINER_ALGOS:
        cases[f"algo={algo}"] = [f"algo={algo}", *TRAINER_BASE, *(AUX_ROWS if algo in aux else [])]
    for recipe in TRAINER_RECIPES:
        cases[f"recipe={recipe}"] = [f"recipe={recipe}", *TRAINER_BASE, *AUX_ROWS]
    for algo in TRAINER_ITER2:
        cases[f"algo={algo}|num_iterations=2"] = [
            f"algo={algo}", *TRAINER_BASE, *(AUX_ROWS if algo in aux else []), *ITER2]
    for name, ovs in sft_then_rl_stage_overrides():
        cases[f"algo=sft_then_rl|stage={name}"] = ovs
    return cases


# --------------------------------------------------------------------------- trainer, more
#: the cases added at commit 452baff so that every conf/algo/*.yaml has a trainer pin
#: (``trainer_pins_more.json``, ``--only trainer-more``); the cases above are not re-made
MORE_COMMIT = "452baff"
PIN_MODEL = "@PIN_MODEL@"  # replaced by the pin model's folder when a case runs (a teacher = the pin model)
TEACHER = ["teacher=model", f"teacher.source.models=[{PIN_MODEL}]"]
HINTED = ["algo.inject.max_success=0.5"]
TOY_FEEDBACK = ["algo.inject.template='{prompt}{feedback}'", "algo.inject.wrong='#### {expected}'",
                "algo.inject.missing='#### {expected}'"]  # every group (half its rollouts right) gets a hint
MORE_TRAINER_CASES = {
    # a teacher is the pin model itself; with privileged context (the expert solution or the
    # answer in its prompt) its log-probs differ from the student's, so distillation has a gradient
    "algo=ampo": ["algo=ampo", *TEACHER],  # no group fails under these rollouts: the on-policy path only
    "algo=kdrl": ["algo=kdrl", *TEACHER, "teacher.source.privileged=expert"],
    "algo=opd": ["algo=opd", *TEACHER, "teacher.source.privileged=answer"],
    "algo=exopd": ["algo=exopd", *TEACHER, "teacher.source.privileged=expert"],
    "algo=opsd": ["algo=opsd"],  # the policy as its own privileged teacher
    "algo=ghpo": ["algo=ghpo", *HINTED],
    "algo=guide": ["algo=guide", *HINTED],
    "algo=pope": ["algo=pope", *HINTED],
    "algo=prefix_rft": ["algo=prefix_rft"],
    "algo=prefixrl": ["algo=prefixrl"],
    "algo=uft": ["algo=uft"],
    # replay needs a past step (min_age 1): two steps, the second draws on the first's rollouts
    "algo=remix|max_steps=2": ["algo=remix", "trainer.max_steps=2"],
    # exgrpo: replay from the start (its 0.35 solve-rate switch would leave two steps without replay; tests/test_exgrpo.py checks it)
    "algo=exgrpo|max_steps=2": ["algo=exgrpo", "trainer.max_steps=2", "algo.inject.start_solve_rate=null"],
    # the preset before it followed the authors' code, by overrides: its pin (commit c8099dd) must hold
    "algo=exgrpo|old reading|max_steps=2": ["algo=exgrpo", "trainer.max_steps=2", "offpolicy=replay", "sampler=none", "algo.inject.fill=failed",
                                            "algo.inject.start_solve_rate=null", "algo.advantage.name=grpo",
                                            "algo.loss.name=ppo_clip", "algo.aggregation.name=token-mean", "algo.entropy_coef=0",
                                            "algo.terms.experience.name=policy", "~algo.terms.experience.gamma"],
    "algo=repo_replay|max_steps=2": ["algo=repo_replay", "trainer.max_steps=2"],
    # added with --missing (each case records the commit that made it)
    "algo=alol": ["algo=alol"],
    "algo=palu": ["algo=palu", "algo.controller.target=0"],
    "algo=rl_plus": ["algo=rl_plus"],
    "algo=srpo": ["algo=srpo"],
    "algo=soup|max_steps=2": ["algo=soup", "trainer.max_steps=2", "algo.inject.per_group=2"],
    "algo=simplemix": ["algo=simplemix"],
    "algo=wpo": ["algo=wpo"],
    "algo=hypo": ["algo=hypo"],
    "algo=rpo": ["algo=rpo"],
    "algo=grpo_dpo": ["algo=grpo_dpo"],
    "algo=clip_cov": ["algo=clip_cov", "algo.loss.clip_ratio=0.05"],  # enough candidates that a token is dropped
    "algo=kl_cov|num_iterations=2": ["algo=kl_cov", "trainer.num_iterations=2"],  # |log r| acts off-policy only
    "algo=gmpo": ["algo=gmpo"],
    "algo=opmd|num_iterations=2": ["algo=opmd", "trainer.num_iterations=2"],
    "algo=asymre": ["algo=asymre"],
    "algo=rec|num_iterations=2": ["algo=rec", "trainer.num_iterations=2"],
    "algo=vespo|num_iterations=2": ["algo=vespo", "trainer.num_iterations=2"],
    "algo=ppo": ["algo=ppo"],
    "algo=reinforce_pp": ["algo=reinforce_pp"],
    "algo=rloo": ["algo=rloo"],
    "algo=remax": ["algo=remax"],
    # feedback regeneration: the templates keep to the task's characters (the pin model's vocabulary)
    # (algo.inject.refine=failed: the refinement rule these cases were made with; the preset's
    # refine=all, the authors' every-rollout refinement, is tested by hand in tests/test_feedback_regen.py)
    "algo=critique_grpo": ["algo=critique_grpo", *TOY_FEEDBACK, "algo.inject.refine=failed"],
    # mixrl's earlier Critique-GRPO preset (clip 0.2, token-mean, no entropy bonus): the case made at 452baff
    "algo=critique_grpo|old reading": ["algo=critique_grpo", *TOY_FEEDBACK, "algo.inject.refine=failed", "algo.loss.clip=true",
                                       "algo.aggregation.name=token-mean", "algo.entropy_coef=0.0"],
    # retries keep the attempt's prefix; the verifier's feedback (the preset before issue 52: the policy's own
    # reflection needs a model that reads, and more than the pin model's 64 positions)
    "algo=r3l": ["algo=r3l", *TOY_FEEDBACK, "algo.inject.pivot=divergence", "algo.inject.feedback=verifier",
                 "algo.inject.train_reflections=0", "algo.inject.reflect_correct=false",
                 "algo.terms.policy.tokens=[on_policy,refined]"],
    # issue 52: the policy writes its own context (the requests keep to the task's characters)
    "algo=sage": ["algo=sage", *HINTED, "algo.inject.request='{prompt}{solution}'", "algo.inject.template='{prompt}{hint}'",
                  "algo.inject.hint_tokens=4"],
    "algo=rise": ["algo=rise", "algo.inject.solutions=4", "algo.inject.verifications=2",
                  "algo.inject.request='{prompt}{solution}'", "algo.inject.verify_tokens=8"],
    # issue 53: advantage shaping, stability controls, pair constructors and losses (added with --missing)
    "algo=nsr": ["algo=nsr"],
    "algo=ace": ["algo=ace"],
    "algo=progrpo": ["algo=progrpo"],
    "algo=dgpo": ["algo=dgpo"],
    "algo=gui_g1": ["algo=gui_g1", "algo.shaping.column=level"],  # the task has no rate column: its level is the weight
    "algo=entropic": ["algo=entropic"],
    "algo=minpro": ["algo=minpro"],
    "algo=etr": ["algo=etr"],
    "algo=r2vpo": ["algo=r2vpo"],
    "algo=vcpo": ["algo=vcpo"],
    "algo=sfpo|num_iterations=2": ["algo=sfpo", "trainer.num_iterations=2"],  # one fast step, then the reposition
    "algo=alp": ["algo=alp"],
    "algo=unio4_offline": ["algo=unio4_offline"],
    "algo=rdpo": ["algo=rdpo"],
    "algo=slic": ["algo=slic"],
    "algo=spin": ["algo=spin"],
    "algo=rso": ["algo=rso"],
    "algo=copg": ["algo=copg"],
    # OSP's self-judged pairs (issue 52): the judging request in the pin model's characters
    "algo=osp": ["algo=osp", "algo.inject.request='{first} {second}'"],
    # the earlier preset (the strength from the run's reward), values unchanged
    "algo=osp|old reading": ["algo=osp", "algo.inject.name=group_pairs", "algo.terms.osp.strength=reward"],
    "algo=dno": ["algo=dno"],
    "algo=sera": ["algo=sera"],
    # slope 1: the LeakyReLU kink sits at log pi = the expert's log-prob, where float noise between kernel sets
    # flips tokens across it (1% of the gradient measured); the kink itself is tested by hand in tests/core/test_calibrl.py
    "algo=calibrl": ["algo=calibrl", "algo.terms.guided.negative_slope=1.0"],
    "algo=egpo": ["algo=egpo"],
    "algo=polychromic": ["algo=polychromic", "algo.advantage.set_size=2"],  # the pin's groups of 4: sets of 4 would be one set, A = 0
    "algo=nash_md": ["algo=nash_md"],
    "algo=tempsamp": ["algo=tempsamp"],
    "algo=gepo": ["algo=gepo"],
    "algo=seppo": ["algo=seppo"],
    "algo=aspo": ["algo=aspo"],  # no tool calls in the pin task: A' = A (the wiring); Eq. 2 by hand in tests/core/test_aspo.py
    # issue 52: new instances from failures and selected refinements (the contexts keep to the pin model's characters and 64 positions)
    "algo=fission_grpo": ["algo=fission_grpo", "algo.inject.template='{prompt}{attempt}{feedback}'", "algo.inject.wrong='#### {expected}'",
                          "algo.inject.missing='#### {expected}'", "algo.inject.errors=2", "algo.inject.recoveries=2", "algo.inject.success=0.5"],
    "algo=ilf": ["algo=ilf", "algo.inject.template='{prompt}{attempt}{feedback}'", "algo.inject.wrong='#### {expected}'",
                 "algo.inject.missing='#### {expected}'", "algo.inject.attempts=2", "algo.inject.refinements=2", "algo.inject.success=0.5"],
    "algo=rex_rag": ["algo=rex_rag", "algo.inject.keep=0.5", "algo.inject.revisions=[' = ',' #']"],  # revision prompts in the pin model's characters
    # steps are the running sums (separator ' ', as the toy recipes): the pin's wrong rollouts get a step rectified / edited
    "algo=scope": ["algo=scope", "algo.inject.separator=' '"],
    "algo=edit_grpo": ["algo=edit_grpo", "algo.inject.separator=' '"],
    "algo=capo": ["algo=capo"],  # under the pins' exact-match reward its per-token credit is 0: a token-weighted GRPO
}
#: the rollouts of each case (a function of tests/pins/rollouts.py): tolerant_completion, except
#: where the second step's groups must all fail for the replay fill to act
MORE_ROLLOUTS = {"algo=exgrpo|max_steps=2": "collapsing_completion", "algo=exgrpo|old reading|max_steps=2": "collapsing_completion",
                 "algo=repo_replay|max_steps=2": "collapsing_completion"}


def more_trainer_cases() -> dict[str, list[str]]:
    """``TRAINER_BASE`` after the algo, then the case's own overrides (which win)."""
    return {k: [ovs[0], *TRAINER_BASE, *ovs[1:]] for k, ovs in MORE_TRAINER_CASES.items()}


def resolve_overrides(overrides: list[str], model_path: str) -> list[str]:
    return [o.replace(PIN_MODEL, str(model_path)) for o in overrides]


def make_more_trainer_pins(model_path: str, work: Path, skip: set[str] = frozenset()) -> dict:
    """The ``trainer_pins_more.json`` cases (those not in ``skip``), run with ``rollouts.tolerant_completion``."""
    import rollouts
    from harness import run_one_step

    cases, timing = {}, {}
    for key, overrides in more_trainer_cases().items():
        if key in skip:
            continue
        t0 = time.perf_counter()
        completion = MORE_ROLLOUTS.get(key, "tolerant_completion")
        result = run_one_step(resolve_overrides(overrides, model_path), model_path,
                              work / key.replace("/", "_").replace("|", "_").replace("=", "-"),
                              completion=getattr(rollouts, completion))
        timing[key] = round(time.perf_counter() - t0, 2)
        result["metrics"] = [{k: v for k, v in row.items() if not k.endswith("seconds")}  # teacher/seconds: wall-clock
                             for row in result["metrics"]]
        cases[key] = {"overrides": overrides, "rollouts": completion, "result": result}
        print(f"  {key}: {timing[key]} s, losses {result['losses']}", file=sys.stderr)
    meta = {
        "commit": MORE_COMMIT,
        "model": "tests/fixtures/pin-model",
        "model_sha256": sha256(Path(model_path) / "model.safetensors"),
        "rollouts": "tests/pins/rollouts.py, the function each case names",
        "placeholder": f"{PIN_MODEL} = the pin model's folder",
        "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY", "default"),
        "torch_threads": 1,
        "torch": torch.__version__,
    }
    return {"meta": meta, "cases": cases}


def tiny_model(cache: Path) -> str:
    from mixrl.models import tiny

    return str(tiny.warm_start(cache, steps=TINY_STEPS, progress=False))


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def make_trainer_pins(model_path: str, work: Path, threads: int = 1) -> tuple[dict, list[str]]:
    from harness import run_one_step

    from mixrl.errors import ConfigError

    cases, skipped, timing = {}, [], {}
    for key, overrides in trainer_cases().items():
        if threads != 1:
            overrides = [*overrides, f"hardware.torch_threads={threads}"]
        t0 = time.perf_counter()
        try:
            result = run_one_step(overrides, model_path, work / key.replace("/", "_").replace("|", "_").replace("=", "-"))
        except ConfigError as e:
            skipped.append(f"{key}: {e}")
            continue
        timing[key] = round(time.perf_counter() - t0, 2)
        cases[key] = {"overrides": overrides, "result": result}
        print(f"  {key}: {timing[key]} s, losses {result['losses']}", file=sys.stderr)
    meta = {
        "commit": COMMIT,
        "model": f"mixrl.models.tiny.warm_start(dir, steps={TINY_STEPS}, progress=False)",
        "model_sha256": sha256(Path(model_path) / "model.safetensors"),
        "torch_threads": threads,
        "torch": torch.__version__,
        "skipped": skipped,
    }
    return {"meta": meta, "cases": cases}, skipped


def write_json(path: Path, data: dict) -> None:
    """One case per line: small and diffable."""
    lines = ["{", f' "meta": {json.dumps(data["meta"])},', ' "cases": {']
    items = list(data["cases"].items())
    for i, (k, v) in enumerate(items):
        lines.append(f"  {json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" + ("," if i < len(items) - 1 else ""))
    lines += [" }", "}", ""]
    path.write_text("\n".join(lines))
    json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["objective", "trainer", "trainer-more"],
                    help="generate one fixture only (trainer-more: only trainer_pins_more.json; never by default)")
    ap.add_argument("--missing", action="store_true",
                    help="with --only trainer-more: run only the cases the file lacks (a new algo) and add them, each with "
                         "the commit that made it; every existing case stays as it is")
    ap.add_argument("--more-out", type=Path, default=HERE / "trainer_pins_more.json")
    ap.add_argument("--objective-out", type=Path, default=HERE / "objective_pins.json")
    ap.add_argument("--trainer-out", type=Path, default=HERE / "trainer_pins.json")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the trainer pins (pins: 1)")
    ap.add_argument("--model", help="tiny model directory (default: warm-started into a temporary cache)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    if a.only in (None, "objective"):
        data, skipped = make_objective_pins()
        write_json(a.objective_out, data)
        print(f"{a.objective_out}: {len(data['cases'])} cases, {len(skipped)} skipped", file=sys.stderr)
        for s in skipped:
            print(f"  skipped {s}", file=sys.stderr)
    if a.only == "trainer-more":  # on the committed pin model
        old = json.loads(a.more_out.read_text()) if a.missing else None
        keep = set(old["cases"]) if old else set()
        with tempfile.TemporaryDirectory(prefix="mixrl-pins-") as tmp:
            data = make_more_trainer_pins(a.model or str(REPO / "tests" / "fixtures" / "pin-model"), Path(tmp) / "runs",
                                          skip=keep)
        if old:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
            for case in data["cases"].values():
                case["commit"] = commit
            data = {"meta": old["meta"], "cases": {**old["cases"], **data["cases"]}}
        write_json(a.more_out, data)
        print(f"{a.more_out}: {len(data['cases'])} cases", file=sys.stderr)
    if a.only in (None, "trainer"):
        with tempfile.TemporaryDirectory(prefix="mixrl-pins-") as tmp:
            model = a.model or tiny_model(Path(tmp) / "tiny-cache")
            data, skipped = make_trainer_pins(model, Path(tmp) / "runs", a.threads)
        write_json(a.trainer_out, data)
        print(f"{a.trainer_out}: {len(data['cases'])} cases, {len(skipped)} skipped", file=sys.stderr)
        for s in skipped:
            print(f"  skipped {s}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
