"""A probe of the newest surfaces as a new user meets them (issue 50): ``mixrl eval``, ``compare``,
``reproduce``, ``plan --sbatch``, ``docs``, ``model build-tiny``, ``scripts/gpu_check.py``,
``env=`` and tools, reward models and judges, and feedback builders, each given the inputs users
get wrong: wrong types, out-of-range and non-finite numbers, missing, empty, truncated, non-UTF-8
and foreign files, read-only folders, a directory where a file goes.

Every case decides its own outcome, and passes only when it is one of

* a **clean refusal**: exit status 2, exactly one ``error:`` line (the last line), no traceback,
  nothing the user owned changed and nothing new created;
* a **right result**: exit 0 and the case's own check of what was written.

A failing case says which class it fell into: ``traceback`` (a raw exception, a usage box, a
second line), ``silently wrong`` (exit 0 where it must refuse, or a wrong result), ``data lost``
(a file of the user's changed or deleted). The commands run in this process through Typer's
CliRunner (the same exit status and output as the command line, without the 3-5 s import of a
new process); the GPU check script through its ``main(argv)``; feedback builders through the
``refine`` injection's own hook with a stand-in trainer context. Cases that need training are in
``test_probe_feedback_failure_during_training_*`` (marked ``slow``).

Counts: before the fixes of issue 50, 50 of the 87 fast cases went wrong (6 data lost, 12 silently
wrong, 32 raw failures) and the 3 slow ones (2 raw failures, 1 silently wrong); after them, none.
The fast cases take about 16 CPU seconds (docs/guides/testing.md).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import stat
import subprocess
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch
from typer.testing import CliRunner

from mixrl.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
TRACEBACK = "Traceback (most recent call last)"


# ----------------------------------------------------------------------------- the outcome
@dataclass
class Outcome:
    code: int | None
    output: str
    exc: BaseException | None = None  # an exception that escaped the command (a raw failure)


@dataclass
class Case:
    name: str
    #: (tmp folder) -> (how to run it, the files the user owns): the runner is () -> Outcome
    setup: Callable[[Path], tuple[Callable[[], Outcome], list[Path]]]
    expect: str = "refuse"  # refuse | ok
    needles: tuple[str, ...] = ()  # words the error line must hold (the option, the file)
    check: Callable[[Path], str | None] | None = None  # ok: what is wrong with the result (None: right)
    created_ok: tuple[str, ...] = field(default_factory=tuple)  # new paths a refusal may leave (none by default)


def _cli(*argv) -> Callable[[], Outcome]:
    def run() -> Outcome:
        res = runner.invoke(app, [str(a) for a in argv])
        exc = res.exception if res.exception is not None and not isinstance(res.exception, SystemExit) else None
        text = res.output
        if exc is not None:
            text += "\n" + TRACEBACK + "\n" + "".join(traceback.format_exception(exc))[-1500:]
        return Outcome(res.exit_code, text, exc)
    return run


def _gpu_check(*argv) -> Callable[[], Outcome]:
    """``python scripts/gpu_check.py ARGV`` in this process (its ``main``)."""
    def run() -> Outcome:
        mod = runpy.run_path(str(ROOT / "scripts" / "gpu_check.py"), run_name="gpu_check_probe")
        buf = io.StringIO()
        code, exc = None, None
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            try:
                code = mod["main"]([str(a) for a in argv])
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 2
            except BaseException as e:  # noqa: BLE001 - the probe records it
                exc = e
                buf.write("\n" + TRACEBACK + "\n" + "".join(traceback.format_exception(e))[-1500:])
        return Outcome(code, buf.getvalue(), exc)
    return run


def _snapshot(paths: list[Path]) -> dict[str, object]:
    snap: dict[str, object] = {}
    for p in paths:
        if p.is_file():
            snap[str(p)] = p.read_bytes()
        elif p.is_dir():
            snap[str(p)] = sorted(str(q.relative_to(p)) for q in p.rglob("*"))
            for q in p.rglob("*"):
                if q.is_file():
                    snap[str(q)] = q.read_bytes()
        else:
            snap[str(p)] = None
    return snap


def _tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def judge(case: Case, tmp: Path) -> tuple[str, str]:
    """Run ``case`` in ``tmp`` and classify it: (class, why); class ``clean`` when it is right."""
    run, owned = case.setup(tmp)
    before_snap, before_tree = _snapshot(owned), _tree(tmp)
    try:
        out = run()
    finally:
        while IMMUTABLE:
            subprocess.run(["chattr", "-i", str(IMMUTABLE.pop())], capture_output=True, check=False)
        for p in tmp.rglob("*"):  # read-only folders made by the case: writable again, so tmp can be removed
            if p.is_dir() and not os.access(p, os.W_OK):
                p.chmod(p.stat().st_mode | stat.S_IWUSR)
    if _snapshot(owned) != before_snap:
        return "data lost", f"a file of the user's changed or went away; output: {out.output[-600:]}"
    lines = [ln for ln in out.output.strip().splitlines() if ln.strip()]
    if out.exc is not None or TRACEBACK in out.output:
        return "traceback", out.output[-1500:]
    if case.expect == "ok":
        if out.code != 0:
            return "traceback" if out.code != 2 else "silently wrong", f"exit {out.code} where it must work: {out.output[-800:]}"
        why = case.check(tmp) if case.check else None
        return ("silently wrong", why) if why else ("clean", "")
    if out.code == 0:
        return "silently wrong", f"exit 0 where it must refuse: {out.output[-800:]}"
    errors = [ln for ln in lines if ln.lstrip().startswith("error:") or ": error:" in ln]
    if out.code != 2 or len(errors) != 1 or lines[-1] != errors[0]:
        return "traceback", f"exit {out.code}, not one error line last: {out.output[-800:]}"
    missing = [n for n in case.needles if n not in errors[0]]
    if missing:
        return "traceback", f"the error line does not name {missing}: {errors[0]}"
    new = {p for p in _tree(tmp) - before_tree if not any(p.startswith(c) for c in case.created_ok)}
    if new:
        return "silently wrong", f"a refusal left new files behind: {sorted(new)[:5]}"
    return "clean", ""


# ----------------------------------------------------------------------------- material
def _writable(folder: Path) -> bool:
    try:
        (folder / ".probe").touch()
    except OSError:
        return False
    (folder / ".probe").unlink()
    return True


def _read_only(folder: Path) -> Path:
    """A folder no new file can be made in: read-only by its mode, and for root (whom modes do not
    stop) immutable (``chattr +i``); the case is skipped where neither works."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    if _writable(folder):
        subprocess.run(["chattr", "+i", str(folder)], capture_output=True, check=False)
        IMMUTABLE.append(folder)
    if _writable(folder):
        pytest.skip("no read-only folder can be made here (root without chattr)")
    return folder


IMMUTABLE: list[Path] = []  # folders made immutable by a case: made mutable again after it


def _run_dir(path: Path, *, algo: str = "grpo", seed: int = 0, after: float = 0.5) -> Path:
    """A finished run as ``mixrl compare`` reads it (summary.json, metrics.jsonl, config.yaml)."""
    path.mkdir(parents=True)
    summary = {"run_dir": str(path), "algo": algo, "recipe": None, "seed": seed, "steps": 2, "rollouts": 32,
               "accuracy_before": 0.1, "accuracy_after": after, "eval_before": {"accuracy": 0.1, "n": 8.0},
               "eval_after": {"accuracy": after, "n": 8.0}, "wall_seconds": 1.0}
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "accuracy": 0.1 * s, "reward_mean": 0.1 * s}) + "\n"
                                                for s in (1, 2)))
    (path / "config.yaml").write_text(f"algo:\n  name: {algo}\nseed: {seed}\n")
    return path


def _runs(tmp: Path) -> Path:
    runs = tmp / "runs"
    for s in (0, 1):
        _run_dir(runs / f"grpo-s{s}", seed=s, after=0.5 + 0.1 * s)
    return runs


def _model_without_weights(tmp: Path) -> Path:
    d = tmp / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 8,
                                               "num_hidden_layers": 1, "num_attention_heads": 1, "vocab_size": 16,
                                               "intermediate_size": 8, "max_position_embeddings": 64}))
    (d / "tokenizer_config.json").write_text("{}")
    return d


SUITE = "methods:\n  grpo: grpo/arith-tiny\nseeds: 1\njobs: 1\noverrides: [trainer.max_steps=2]\n"


def _suite(tmp: Path, data: bytes) -> Path:
    p = tmp / "suite.yaml"
    p.write_bytes(data)
    return p


def _no(what: str):
    return lambda tmp: None


# ----------------------------------------------------------------------------- the cases
def _compare_users_md(tmp):
    out = tmp / "report"
    out.mkdir()
    (out / "compare.md").write_text("# my own notes\n")
    return _cli("compare", _runs(tmp), "--out", out, "--no-plots"), [out]


def _compare_users_notes(tmp):
    out = tmp / "report"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    return _cli("compare", _runs(tmp), "--out", out, "--no-plots"), [out]


def _compare_again(tmp):
    runs = _runs(tmp)
    out = tmp / "cmp"
    res = runner.invoke(app, ["compare", str(runs), "--out", str(out), "--no-plots"])
    assert res.exit_code == 0, res.output
    (out / "compare.md").write_text("stale\n")
    return _cli("compare", runs, "--out", out, "--no-plots"), [runs]


def _compare_again_check(tmp):
    md = (tmp / "cmp" / "compare.md").read_text()
    return None if "grpo" in md and "stale" not in md else f"compare.md was not rewritten: {md[:200]}"


def _compare_out_is_file(tmp):
    f = tmp / "compare.md"
    f.write_text("mine\n")
    return _cli("compare", _runs(tmp), "--out", f, "--no-plots"), [f]


def _compare_read_only(tmp):
    return _cli("compare", _runs(tmp), "--out", _read_only(tmp / "ro") / "cmp", "--no-plots"), []


def _compare_target(value):
    return lambda tmp: (_cli("compare", _runs(tmp), "--out", tmp / "cmp", "--no-plots", "--target", value), [])


def _compare_summary(data: bytes):
    def setup(tmp):
        runs = _runs(tmp)
        (runs / "grpo-s1" / "summary.json").write_bytes(data)
        return _cli("compare", runs, "--out", tmp / "cmp", "--no-plots"), [runs]
    return setup


def _compare_config(data: bytes):
    def setup(tmp):
        runs = _runs(tmp)
        (runs / "grpo-s1" / "config.yaml").write_bytes(data)
        return _cli("compare", runs, "--out", tmp / "cmp", "--no-plots"), [runs]
    return setup


def _rejudge(data: bytes):
    def setup(tmp):
        d = tmp / "results"
        d.mkdir()
        (d / "compare.json").write_bytes(data)
        (d / "compare.md").write_text("# results\n")
        return _cli("rejudge", d), [d]
    return setup


def _eval_run_config(data: bytes):
    def setup(tmp):
        run = tmp / "run"
        run.mkdir()
        (run / "config.yaml").write_bytes(data)
        _model_without_weights(run)
        return _cli("eval", run), [run]
    return setup


def _eval_no_weights(tmp):
    d = _model_without_weights(tmp)
    return _cli("eval", d), [d]


def _eval_adapter_no_weights(tmp):
    base = _model_without_weights(tmp)
    d = tmp / "adapter"
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base), "peft_type": "LORA"}))
    return _cli("eval", d), [d]


def _eval_missing_shard(tmp):
    from safetensors.torch import save_file

    d = _model_without_weights(tmp)
    save_file({"w": torch.zeros(2)}, str(d / "model-00001-of-00002.safetensors"))
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
        "w": "model-00001-of-00002.safetensors", "v": "model-00002-of-00002.safetensors"}}))
    return _cli("eval", d), [d]


def _eval_model_file(tmp):
    f = tmp / "model.safetensors"
    f.write_bytes(b"\x00" * 16)
    return _cli("eval", f), [f]


def _eval_config_not_utf8(tmp):
    d = _model_without_weights(tmp)
    (d / "config.json").write_bytes(b'{"model_type": "\xff\xfe"}')
    (d / "model.safetensors").write_bytes(b"")
    return _cli("eval", d), [d]


def _eval_empty_weights(tmp):
    d = _model_without_weights(tmp)
    (d / "model.safetensors").write_bytes(b"")
    return _cli("eval", d), [d]


def _eval_out_read_only(tmp):
    d = _model_without_weights(tmp)
    return _cli("eval", d, "--out", _read_only(tmp / "ro") / "eval.json"), [d]


def _reproduce_suite(data: bytes, *extra):
    def setup(tmp):
        s = _suite(tmp, data)
        return _cli("reproduce", s, "--out", tmp / "out", *extra), [s]
    return setup


def _reproduce_users_readme(tmp):
    s = _suite(tmp, SUITE.encode())
    out = tmp / "out"
    out.mkdir()
    (out / "README.md").write_text("mine\n")
    return _cli("reproduce", s, "--out", out), [s, out]


PLAN = ("recipe=grpo/arith-tiny",)


def _plan_sbatch_missing_folder(tmp):
    return _cli("plan", *PLAN, f"run_dir={tmp / 'run'}", "--sbatch", tmp / "jobs" / "new" / "job.sh"), []


def _plan_sbatch_check(tmp):
    job = tmp / "jobs" / "new" / "job.sh"
    return None if job.is_file() and job.read_text().startswith("#!/bin/bash") else f"{job} was not written"


def _plan_sbatch_dir(tmp):
    d = tmp / "jobs"
    d.mkdir()
    (d / "old.sh").write_text("mine\n")
    return _cli("plan", *PLAN, f"run_dir={tmp / 'run'}", "--sbatch", d), [d]


def _plan_sbatch_read_only(tmp):
    return _cli("plan", *PLAN, f"run_dir={tmp / 'run'}", "--sbatch", _read_only(tmp / "ro") / "job.sh"), []


def _plan_sbatch_users_file(tmp):
    job = tmp / "job.sh"
    job.write_text("#!/bin/bash\n# my own job script\nsrun python my_training.py\n")
    return _cli("plan", *PLAN, f"run_dir={tmp / 'run'}", "--sbatch", job), [job]


def _plan_sbatch_again(tmp):
    job = tmp / "job.sh"
    res = runner.invoke(app, ["plan", *PLAN, f"run_dir={tmp / 'run'}", "--sbatch", str(job)])
    assert res.exit_code == 0, res.output
    job.write_text(job.read_text().replace("#SBATCH --nodes=1", "#SBATCH --nodes=99"))
    return _cli("plan", *PLAN, f"run_dir={tmp / 'run'}", "--sbatch", job), []


def _plan_sbatch_again_check(tmp):
    text = (tmp / "job.sh").read_text()
    return None if "--nodes=1" in text and "--nodes=99" not in text else "the earlier script was not rewritten"


def _eval_out_users_file(tmp):
    d = _model_without_weights(tmp)
    f = tmp / "results.json"
    f.write_text('{"my": "results"}\n')
    return _cli("eval", d, "--out", f), [d, f]


def _docs_users_page(tmp):
    f = tmp / "peers.md"
    f.write_text("# My comparison of RL frameworks\n")
    return _cli("docs", "peers", "--data", ROOT / "docs" / "peers.yaml", "--out", f), [f]


def _gpu_out_users_file(tmp):
    f = tmp / "notes.md"
    f.write_text("# my notes\n")
    return _gpu_check("--device", "cpu", "--only", "vllm-colocate", "--out", f), [f]


def _plan_prompt_tokens(value):
    return lambda tmp: (_cli("plan", *PLAN, "--prompt-tokens", value), [])


def _docs_page_onto_dir(tmp):
    d = tmp / "page"
    d.mkdir()
    (d / "mine.md").write_text("mine\n")
    return _cli("docs", "peers", "--data", ROOT / "docs" / "peers.yaml", "--out", d), [d]


def _docs_page_read_only(tmp):
    return _cli("docs", "peers", "--data", ROOT / "docs" / "peers.yaml", "--out", _read_only(tmp / "ro") / "peers.md"), []


def _docs_peers_data(data: bytes):
    def setup(tmp):
        f = tmp / "peers.yaml"
        f.write_bytes(data)
        return _cli("docs", "peers", "--data", f, "--out", tmp / "peers.md"), [f]
    return setup


def _docs_site_elsewhere(tmp):
    os.chdir(tmp)
    return _cli("docs", "site"), []


def _build_tiny(*argv):
    return lambda tmp: (_cli("model", "build-tiny", *argv), [])


def _build_tiny_on_data(*argv):
    def setup(tmp):
        data = tmp / "rows.jsonl"
        data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(40)))
        return _cli("model", "build-tiny", f"data.source={data}", "--quiet", *argv), [data]
    return setup


def _gpu(*argv):
    return lambda tmp: (_gpu_check(*argv), [])


def _gpu_out_read_only(tmp):
    return _gpu_check("--device", "cpu", "--only", "vllm-colocate", "--out", _read_only(tmp / "ro") / "check.md"), []


def _gpu_out_dir(tmp):
    d = tmp / "check.md"
    d.mkdir()
    return _gpu_check("--device", "cpu", "--only", "vllm-colocate", "--out", d), [d]


def _samples(*argv):
    def setup(tmp):
        run = tmp / "run"
        run.mkdir()
        (run / "config.yaml").write_text("seed: 0\n")
        (run / "samples.jsonl").write_text(json.dumps({"split": "train", "step": 1, "source": "on_policy", "prompt": "1+1=",
                                                       "completion": "2", "reward": 1.0, "advantage": 0.5}) + "\n")
        return _cli("samples", run, *argv), [run]
    return setup


def _explain(*overrides):
    return lambda tmp: (_cli("explain", *overrides), [])


CASES = [
    # compare: the output folder
    Case("compare --out a folder holding the user's compare.md", _compare_users_md, needles=("--out", "compare.md")),
    Case("compare --out a folder holding the user's other files", _compare_users_notes, needles=("--out", "notes.txt")),
    Case("compare --out an earlier compare's folder is rewritten", _compare_again, expect="ok", check=_compare_again_check),
    Case("compare --out an existing file", _compare_out_is_file, needles=("--out",)),
    Case("compare --out under a read-only folder", _compare_read_only, needles=("--out",)),
    Case("compare --target nan", _compare_target("nan"), needles=("--target",)),
    Case("compare --target inf", _compare_target("inf"), needles=("--target",)),
    Case("compare a run whose summary.json is not UTF-8", _compare_summary(b'{"algo": "\xff"}'), needles=("summary.json",)),
    Case("compare a run whose summary.json is cut short", _compare_summary(b'{"algo": "grpo", "seed'), needles=("summary.json",)),
    Case("compare a run whose summary.json is empty", _compare_summary(b""), needles=("summary.json",)),
    Case("compare a run whose config.yaml is not UTF-8", _compare_config(b"algo:\n  name: gr\xffpo\n"), needles=("config.yaml",)),
    Case("compare a run whose config.yaml is not a mapping", _compare_config(b"- 1\n- 2\n"), needles=("config.yaml",)),
    Case("rejudge a compare.json that is not UTF-8", _rejudge(b'{"metric": "\xff"}'), needles=("compare.json",)),
    Case("rejudge a compare.json cut short", _rejudge(b'{"metric": "accuracy", "meth'), needles=("compare.json",)),
    Case("eval a run whose config.yaml is not UTF-8", _eval_run_config(b"seed: 0\ndata: \xff\n"), needles=("config.yaml",)),
    # eval: the model folder and --out
    Case("eval a model folder without weights", _eval_no_weights, needles=("weights",)),
    Case("eval a weights file instead of its folder", _eval_model_file),
    Case("eval a LoRA adapter folder without its weights", _eval_adapter_no_weights, needles=("LoRA adapter weights",)),
    Case("eval a sharded model missing a shard", _eval_missing_shard, needles=("model-00002-of-00002.safetensors",)),
    Case("eval a model whose config.json is not UTF-8", _eval_config_not_utf8, needles=("config.json",)),
    Case("eval a model whose weights file is empty", _eval_empty_weights, needles=("model.safetensors",)),
    Case("eval --out under a read-only folder", _eval_out_read_only, needles=("--out",)),
    # reproduce: the suite file and the numbers
    Case("reproduce a suite file that is not UTF-8", _reproduce_suite(b"methods:\n  grpo: grpo/arith-tiny\n# \xff\xfe\n"),
         needles=("suite.yaml",)),
    Case("reproduce an empty suite file", _reproduce_suite(b""), needles=("suite",)),
    Case("reproduce a suite file cut short", _reproduce_suite(b"methods:\n  grpo: [grpo/ar"), needles=("suite",)),
    Case("reproduce a suite file that is a YAML list", _reproduce_suite(b"- grpo/arith-tiny\n"), needles=("suite",)),
    Case("reproduce a suite with seeds: -1", _reproduce_suite(SUITE.replace("seeds: 1", "seeds: -1").encode()), needles=("seeds",)),
    Case("reproduce --seeds 0", _reproduce_suite(SUITE.encode(), "--seeds", "0"), needles=("--seeds",)),
    Case("reproduce --jobs 0", _reproduce_suite(SUITE.encode(), "--jobs", "0"), needles=("--jobs",)),
    Case("reproduce --jobs -2", _reproduce_suite(SUITE.encode(), "--jobs", "-2"), needles=("--jobs",)),
    Case("reproduce --out a folder holding the user's README.md", _reproduce_users_readme, needles=("--out", "README.md")),
    Case("reproduce --out an existing file", lambda tmp: (_cli("reproduce", _suite(tmp, SUITE.encode()), "--out",
                                                                _suite(tmp, SUITE.encode())), [tmp / "suite.yaml"]),
         needles=("--out",)),
    # plan --sbatch and --prompt-tokens
    Case("plan --sbatch into a folder that does not exist yet", _plan_sbatch_missing_folder, expect="ok", check=_plan_sbatch_check),
    Case("plan --sbatch onto a directory", _plan_sbatch_dir, needles=("--sbatch",)),
    Case("plan --sbatch under a read-only folder", _plan_sbatch_read_only, needles=("--sbatch",)),
    Case("plan --prompt-tokens 0", _plan_prompt_tokens("0"), needles=("--prompt-tokens",)),
    Case("plan --prompt-tokens -5", _plan_prompt_tokens("-5"), needles=("--prompt-tokens",)),
    Case("plan --sbatch onto the user's own script", _plan_sbatch_users_file, needles=("--sbatch", "did not write")),
    Case("plan --sbatch onto an earlier plan's script is rewritten", _plan_sbatch_again, expect="ok", check=_plan_sbatch_again_check),
    Case("eval --out onto the user's own file", _eval_out_users_file, needles=("--out", "did not write")),
    Case("docs peers --out onto the user's own page", _docs_users_page, needles=("--out", "did not write")),
    Case("gpu_check --out onto the user's own notes", _gpu_out_users_file, needles=("--out", "did not write")),
    # docs
    Case("docs peers --out onto a directory", _docs_page_onto_dir, needles=("--out",)),
    Case("docs peers --out under a read-only folder", _docs_page_read_only, needles=("--out",)),
    Case("docs peers --data not UTF-8", _docs_peers_data(b"verl:\n  - option: \xff\n"), needles=("peers.yaml",)),
    Case("docs peers --data empty", _docs_peers_data(b""), needles=("peers.yaml",)),
    Case("docs site outside the repository", _docs_site_elsewhere, needles=("repository root",)),
    # model build-tiny: numbers and data
    Case("model build-tiny --steps 0", _build_tiny("--steps", "0"), needles=("--steps",)),
    Case("model build-tiny --steps -3", _build_tiny("--steps", "-3"), needles=("--steps",)),
    Case("model build-tiny --target-accuracy nan", _build_tiny_on_data("--target-accuracy", "nan", "--steps", "1"),
         needles=("--target-accuracy",)),
    Case("model build-tiny --target-accuracy 1.5", _build_tiny_on_data("--target-accuracy", "1.5"), needles=("--target-accuracy",)),
    Case("model build-tiny on a data file that does not exist", _build_tiny("data.source=/nonexistent/rows.jsonl")),
    # the GPU check script
    Case("gpu_check --timeout nan", _gpu("--timeout", "nan", "--dry-run"), needles=("--timeout",)),
    Case("gpu_check --timeout inf", _gpu("--timeout", "inf", "--dry-run"), needles=("--timeout",)),
    Case("gpu_check --budget -1", _gpu("--budget", "-1", "--dry-run"), needles=("--budget",)),
    Case("gpu_check --budget nan", _gpu("--budget", "nan", "--dry-run"), needles=("--budget",)),
    Case("gpu_check --out under a read-only folder", _gpu_out_read_only, needles=("--out",)),
    Case("gpu_check --out onto a directory", _gpu_out_dir, needles=("--out",)),
    Case("gpu_check --out a .txt file", _gpu("--out", "check.txt", "--dry-run"), needles=("--out",)),
    # what the command line itself refuses: a value of the wrong type, a misspelt option, a missing argument
    Case("model build-tiny --steps abc", _build_tiny("--steps", "abc"), needles=("--steps",)),
    Case("reproduce --seeds 1.5", _reproduce_suite(SUITE.encode(), "--seeds", "1.5"), needles=("--seeds",)),
    Case("compare --target high", _compare_target("high"), needles=("--target",)),
    Case("plan --sbtach (misspelt)", lambda tmp: (_cli("plan", *PLAN, "--sbtach", tmp / "job.sh"), []), needles=("--sbtach",)),
    Case("eval without a model folder", lambda tmp: (_cli("eval"), []), needles=("Missing argument",)),
    Case("explain --steps 0", lambda tmp: (_cli("explain", "--steps", "0"), []), needles=("--steps",)),
    Case("explain --plot onto a directory", lambda tmp: (_cli("explain", "--plot", tmp), []), needles=("--plot",)),
    Case("samples --width -1", _samples("--width", "-1"), needles=("--width",)),
    Case("samples --last -2", _samples("--last", "-2"), needles=("--last",)),
    # env= and tools, reward models and judges, feedback builders: their keys
    Case("env=tools env.max_tool_calls=-1", _explain("env=tools", "env.max_tool_calls=-1"), needles=("max_tool_calls",)),
    Case("env=tools env.tools=[nonexistent]", _explain("env=tools", "env.tools=[nonexistent]"), needles=("nonexistent",)),
    Case("env=arith_retry env.max_turns=0", _explain("env=arith_retry", "env.max_turns=0"), needles=("max_turns",)),
    Case("env=arith_retry env.max_turns=nan", _explain("env=arith_retry", "env.max_turns=nan"), needles=("max_turns",)),
    Case("reward=judge reward.params.timeout_s=nan", _explain("reward=judge", "reward.params.timeout_s=nan"), needles=("timeout_s",)),
    Case("reward=judge reward.params.scale=0", _explain("reward=judge", "reward.params.scale=0"), needles=("scale",)),
    Case("reward=judge reward.params.unparsable=ignore", _explain("reward=judge", "reward.params.unparsable=ignore"),
         needles=("unparsable",)),
    Case("reward=model reward.params.batch_size=0", _explain("reward=model", "reward.params.batch_size=0"), needles=("batch_size",)),
    Case("reward=model reward.params.normalize=zscore", _explain("reward=model", "reward.params.normalize=zscore"),
         needles=("normalize",)),
    Case("algo.inject.feedback a file that does not exist", _explain("algo=critique_grpo", "algo.inject.feedback=/nonexistent/fb.py:fn"),
         needles=("feedback",)),
    Case("algo.inject.per_group=nan", _explain("algo=critique_grpo", "algo.inject.per_group=nan"), needles=("per_group",)),
    Case("algo.inject.success=-1", _explain("algo=critique_grpo", "algo.inject.success=-1"), needles=("success",)),
]


@pytest.fixture
def probe_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MIXRL_CACHE", str(tmp_path / ".cache"))
    work = tmp_path / "case"
    work.mkdir()
    return work


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_probe_cli(case, probe_tmp):
    cls, why = judge(case, probe_tmp)
    assert cls == "clean", f"{cls}: {why}"


# ----------------------------------------------------------------------------- feedback builders, in the refine hook
class _Tok:
    eos_token_id, pad_token_id = 0, 0
    model_max_length = 64

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 250 + 1 for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i)


def _refine_with(builder_source: str, tmp: Path, *, max_positions: int | None = 64):
    """The ``refine`` injection with the builder ``fb.py:critique`` (``builder_source``), run once on
    a group of 4 with 3 failed rollouts, through a stand-in context of a 64-position model; returns
    the rollouts."""
    from mixrl.core import provenance as prov
    from mixrl.sources.base import InjectContext, Rollouts
    from mixrl.sources.with_feedback import RefineFromFeedback

    import hashlib

    fb = tmp / f"fb_{hashlib.sha1(builder_source.encode()).hexdigest()[:8]}.py"  # a module of its own per source (imports are cached)
    fb.write_text(builder_source)
    inj = RefineFromFeedback(feedback=f"{fb}:critique", template="{feedback}{prompt}")

    def ids(s):
        return [ord(c) % 250 + 1 for c in s]

    kw = {"max_positions": max_positions} if "max_positions" in InjectContext.__dataclass_fields__ else {}
    ctx = InjectContext(tokenizer=_Tok(), process_index=0, num_processes=1, num_generations=4, max_completion_length=16,
                        global_step=0, micro_step=0, device=torch.device("cpu"),
                        tokenize_prompts=lambda ps: [ids(p) for p in ps], gather=lambda t: t,
                        generate=lambda prompts: ([ids("#### 19") for _ in prompts], None),
                        score=lambda inputs, comps: torch.tensor([[1.0 if i == 0 else 0.0] for i in range(len(comps))]),
                        behaviour_logps=lambda p, c: [[-1.0] * len(cc) for cc in c], **kw)
    row = {"prompt": "3+5+2+9=", "answer": "19"}
    comps = ["#### 19", "#### 18", "8 1", "#### 7"]
    r = Rollouts([ids(c) for c in comps], None, [prov.ON_POLICY] * 4, prompt_ids=[[1]] * 4)
    return inj.after_generation(ctx, [row] * 4, r)


FEEDBACK_CASES = {
    "raises": ("def critique(attempt):\n    raise ValueError('judge is down')\n", ("critique", "ValueError", "judge is down")),
    "returns a number": ("def critique(attempt):\n    return 3\n", ("critique", "int")),
    "returns a list": ("def critique(attempt):\n    return ['a', 'b']\n", ("critique", "list")),
    "returns a pivot that is not a number": (
        "from mixrl.sources.feedback import Feedback\ndef critique(attempt):\n    return Feedback('wrong', pivot='x')\n",
        ("critique", "pivot")),
    "returns 5,000 characters for a 64-position model": ("def critique(attempt):\n    return 'x' * 5000\n",
                                                        ("critique", "5000", "64")),
}


@pytest.mark.parametrize("name", list(FEEDBACK_CASES), ids=list(FEEDBACK_CASES))
def test_probe_feedback_builder(name, tmp_path):
    """A builder that fails is one line naming it and what it returned (the trainer stops with the
    checkpoint saved: the slow test below)."""
    from mixrl.errors import MixrlUserError

    source, needles = FEEDBACK_CASES[name]
    try:
        _refine_with(source, tmp_path)
    except MixrlUserError as e:
        text = str(e)
        assert "\n" not in text.strip(), f"traceback: more than one line: {text}"
        missing = [n for n in needles if n not in text]
        assert not missing, f"traceback: the error does not name {missing}: {text}"
        return
    except Exception as e:  # noqa: BLE001 - the probe's class
        pytest.fail(f"traceback: {type(e).__name__}: {e}")
    pytest.fail("silently wrong: accepted")


def test_probe_feedback_builder_right_results(tmp_path):
    """What a builder may return works: a string, a Feedback with a pivot, None (no refinement),
    and an empty string (R3L's arith recipe)."""
    r = _refine_with("def critique(attempt):\n    return 'no'\n", tmp_path)
    assert r.guided == [0, 0, 0, 2]
    r = _refine_with("def critique(attempt):\n    return None\n", tmp_path)
    assert r.guided == [0, 0, 0, 0]
    r = _refine_with("def critique(attempt):\n    return ''\n", tmp_path)
    assert r.guided == [0, 0, 0, 2]


# ----------------------------------------------------------------------------- inside training (slow)
REWARD_AND_BUILDER = '''
from pathlib import Path

MARK = Path(__file__).with_name("step1.flag")


def reward(prompts, completions, trainer_state=None, **kw):
    """Every completion fails (so every group is refined); from step 1 on, the builder's trouble starts."""
    if trainer_state is not None and trainer_state.global_step >= 1:
        MARK.touch()
    return [0.0] * len(completions)


def critique(attempt):
    if MARK.exists():
        return {BAD}
    return "#### " + str(attempt.answer)
'''


@pytest.mark.slow
@pytest.mark.parametrize("bad, needles", [
    ("1 / 0", ("critique", "ZeroDivisionError")),
    ("3", ("critique", "returned int 3")),
    ("'7 ' * 2500", ("critique", "5000 characters", "64 positions")),  # the tiny model's context: 64 positions (x is not in its vocabulary)
], ids=["raises", "returns a number", "returns 5000 characters"])
def test_probe_feedback_failure_during_training_stops_with_the_checkpoint_saved(bad, needles, fast_overrides, tmp_path):
    """A feedback builder that fails at step 2 of a run: one line naming it and what it did, the
    checkpoint of step 1 saved (as a reward that stops the run, or a non-finite loss), the run marked
    FAILED, exit 2; ``resume=`` continues from that checkpoint."""
    code = tmp_path / "user.py"
    code.write_text(REWARD_AND_BUILDER.replace("{BAD}", bad))
    run = tmp_path / "run"
    res = runner.invoke(app, ["train", *fast_overrides, "algo=critique_grpo", "trainer.max_steps=3", "trainer.save_steps=0",
                              f"reward.name={code}:reward", f"algo.inject.feedback={code}:critique",
                              "algo.inject.template='{feedback} {prompt}'"])
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert res.exit_code == 2, res.output[-3000:]
    assert lines[-1].startswith("error:") and sum(ln.startswith("error:") for ln in lines) == 1 and TRACEBACK not in res.output, res.output[-3000:]
    for n in (*needles, "stopped at step 2", "checkpoint of step 1 saved in", f"resume={run}"):
        assert n in lines[-1], lines[-1]
    assert (run / "trainer" / "checkpoint-1" / "trainer_state.json").is_file() or any(run.rglob("checkpoint-1/trainer_state.json"))
    assert (run / "FAILED").is_file()


def test_probe_docs_site_removes_only_the_recipe_pages_it_wrote(tmp_path):
    """``mixrl docs site`` clears docs/reference/recipes/ before writing (a removed recipe's page goes):
    only the pages it wrote (they carry its note); a page of the user's own there stays (it removed the
    whole folder)."""
    from mixrl.cli.reference import GENERATED_NOTE, remove_generated

    recipes = tmp_path / "docs" / "reference" / "recipes"
    (recipes / "gone").mkdir(parents=True)
    (recipes / "gone" / "arith-tiny.md").write_text(f"# `gone/arith-tiny`\n\n{GENERATED_NOTE}\n\ntext\n")
    (recipes / "index.md").write_text(f"# Recipes\n\n{GENERATED_NOTE}\n")
    (recipes / "mine").mkdir()
    (recipes / "mine" / "notes.md").write_text("# my notes on the recipes\n")
    (recipes / "odd.md").write_bytes(b"\xff\xfe not UTF-8\n")
    remove_generated(recipes)
    assert sorted(str(p.relative_to(recipes)) for p in recipes.rglob("*")) == ["mine", "mine/notes.md", "odd.md"]


def test_probe_a_write_cut_short_leaves_the_earlier_file(tmp_path, monkeypatch):
    """Every --out file is written whole or not at all (mixrl.options.replace_text): a failure
    mid-write (a kill, a full disk) leaves the earlier file as it was and no stray temporary file
    that a later run would refuse as foreign."""
    from mixrl import options

    out = tmp_path / "cmp"
    out.mkdir()
    (out / "compare.json").write_text('{"metric": "accuracy", "methods": []}')
    real_fdopen = os.fdopen

    class Cut(Exception):
        pass

    def cut_fdopen(fd, *a, **k):
        f = real_fdopen(fd, *a, **k)
        f.write = lambda text: (_ for _ in ()).throw(Cut("killed mid-write"))
        return f

    monkeypatch.setattr(options.os, "fdopen", cut_fdopen)
    with pytest.raises(Cut):
        options.replace_text(out / "compare.json", '{"metric": "pass@4"}')
    monkeypatch.undo()
    assert (out / "compare.json").read_text() == '{"metric": "accuracy", "methods": []}'
    assert sorted(p.name for p in out.iterdir()) == ["compare.json"]
    (out / ".compare.md.x1.tmp").write_text("")  # left by a SIGKILL (no cleanup runs): still an earlier compare's folder
    (out / "compare.json").unlink()
    options.check_out_folder(out, "--out", command="mixrl compare", writes=("compare.json", "compare.md"), marker="compare.json")


def test_check_number_bounds_by_hand():
    """mixrl.options.check_number: inclusive and open bounds, whole numbers, NaN and infinities, one line each."""
    from mixrl.errors import ConfigError
    from mixrl.options import check_number

    assert check_number(None, "--x", low=1) is None and check_number(1, "--x", low=1, integer=True) == 1
    assert check_number(0.5, "--x", low=0, high=1) == 0.5 and check_number(1.0, "--x", low=0, high=1) == 1.0
    for value, kw, words in [(0, {"low": 0, "low_open": True}, "--x=0 is out of range: it must be > 0"),
                             (1.5, {"low": 1, "integer": True}, "--x must be a whole number, got 1.5"),
                             (float("nan"), {"low": 0}, "--x must be a finite number, got nan; it must be >= 0"),
                             (float("-inf"), {}, "--x must be a finite number, got -inf"),
                             (2, {"low": 0, "high": 1}, "--x=2 is out of range: it must be >= 0 and <= 1"),
                             ("abc", {}, "--x must be a number, got 'abc'")]:
        with pytest.raises(ConfigError) as e:
            check_number(value, "--x", **kw)
        assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
