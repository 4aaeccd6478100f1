"""Write the text snapshots of ``mixrl explain``, ``mixrl plan`` and ``mixrl config show`` for
every shipped recipe (``recipes/**/*.yaml``), so a refactor can prove their output did not change.

    python tests/pins/make_snapshots.py            # rewrite tests/pins/snapshots/
    python tests/pins/make_snapshots.py --check    # compare only (what the test does), exit 1 on a difference

Regenerate ONLY when a change of this output is intended, and say in the commit message which
output changed and why; a refactor that should change nothing must leave these files as they are
(``tests/pins/test_snapshots.py`` recomputes them all and compares them exactly).

One file per recipe and command: ``snapshots/<command>/<recipe>.txt`` (``<command>`` is
``explain``, ``plan`` or ``config-show``), holding what the CLI prints for::

    mixrl explain recipe=<recipe>
    mixrl plan <recipe>
    mixrl config show recipe=<recipe>

run in-process through Typer's ``CliRunner`` (the real command functions, argument parsing and
printing included; no process spawned per recipe), stdout then stderr, with a last line
``[exit N]``. What legitimately varies between machines is fixed or stripped:

* ``$MIXRL_CACHE`` points at an empty folder while rendering, so ``plan`` takes the built-in
  models' shapes from ``mixrl.models.known.KNOWN_MODELS`` whether or not this machine built them;
* the repository root, the temporary folder and the home folder are written ``<repo>``,
  ``<tmp>`` and ``~``;
* ``HF_HUB_OFFLINE=1``; the rendering width is the CLI's non-terminal width (160 columns).

No line of these outputs measures time, so nothing else is stripped.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SNAPSHOTS = HERE / "snapshots"
COMMANDS = {
    "explain": lambda r: ["explain", f"recipe={r}"],
    "plan": lambda r: ["plan", r],
    "config-show": lambda r: ["config", "show", f"recipe={r}"],
}

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def recipes() -> list[str]:
    """Every shipped recipe name (``chord/arith-tiny``), sorted."""
    from mixrl.config.compose import recipes_dir

    root = recipes_dir()
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml"))


def snapshot_path(command: str, recipe: str) -> Path:
    return SNAPSHOTS / command / f"{recipe}.txt"


def _normalise(text: str, cache: str) -> str:
    for path, name in ((cache, "<cache>"), (str(REPO), "<repo>"), (tempfile.gettempdir(), "<tmp>"), (str(Path.home()), "~")):
        text = text.replace(path, name)
    return text


@contextlib.contextmanager
def memoised_composition():
    """While active, ``mixrl.config.compose.compose_config`` composes each distinct argument
    list once and hands out deep copies (Hydra's composition is ~0.3 s, and the three commands
    compose the same recipe). Used by the test for speed; the snapshots are written without it,
    so the test also checks that a copy renders as a fresh composition does."""
    from mixrl.config import compose

    original = compose.compose_config
    memo: dict = {}

    def compose_config(overrides=None, *args, **kwargs):
        key = (tuple(overrides or ()), args, tuple(sorted(kwargs.items())))
        if key not in memo:
            memo[key] = original(overrides, *args, **kwargs)
        return copy.deepcopy(memo[key])

    compose.compose_config = compose_config
    try:
        yield
    finally:
        compose.compose_config = original


def render_all(only: list[str] | None = None, memoise: bool = False) -> dict[tuple[str, str], str]:
    """``{(command, recipe): normalised text}`` for every recipe (or those in ``only``)."""
    from typer.testing import CliRunner

    from mixrl.cli.main import app

    runner = CliRunner()
    out = {}
    old = os.environ.get("MIXRL_CACHE")
    with tempfile.TemporaryDirectory(prefix="mixrl-snap-cache-") as cache, \
            (memoised_composition() if memoise else contextlib.nullcontext()):
        os.environ["MIXRL_CACHE"] = cache
        try:
            for recipe in only or recipes():
                for command, args in COMMANDS.items():
                    res = runner.invoke(app, args(recipe))
                    if res.exception is not None and not isinstance(res.exception, SystemExit):
                        raise RuntimeError(f"{command} {recipe}: {res.exception!r}") from res.exception
                    stderr = res.stderr if res.stderr_bytes is not None else ""
                    text = res.stdout + stderr + f"[exit {res.exit_code}]\n"
                    out[(command, recipe)] = _normalise(text, cache)
        finally:
            if old is None:
                os.environ.pop("MIXRL_CACHE", None)
            else:
                os.environ["MIXRL_CACHE"] = old
    return out


def differences(rendered: dict[tuple[str, str], str], complete: bool = True) -> list[str]:
    """Every snapshot that is missing or differs from ``rendered``, and (``complete``: rendered
    holds every recipe) every stored snapshot no recipe renders any more (removed or renamed)."""
    bad = []
    for (command, recipe), text in rendered.items():
        path = snapshot_path(command, recipe)
        if not path.is_file():
            bad.append(f"{path.relative_to(HERE)}: missing")
        elif path.read_text() != text:
            bad.append(f"{path.relative_to(HERE)}: differs")
    if not complete:
        return bad
    stored = set(SNAPSHOTS.rglob("*.txt"))
    bad += [f"{p.relative_to(HERE)}: no such recipe any more"
            for p in sorted(stored - {snapshot_path(c, r) for c, r in rendered})]
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the stored snapshots; write nothing")
    ap.add_argument("--missing", action="store_true",
                    help="write the snapshots of recipes that have none (a new recipe); leave every existing one as it is")
    a = ap.parse_args(argv)
    if a.missing:
        new = [r for r in recipes() if not all(snapshot_path(c, r).exists() for c in COMMANDS)]
        rendered = render_all(only=new) if new else {}
        for (command, recipe), text in rendered.items():
            path = snapshot_path(command, recipe)
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
        print(f"new recipes: {', '.join(new) or 'none'}", file=sys.stderr)
        return 0
    rendered = render_all()
    if a.check:
        bad = differences(rendered)
        for line in bad:
            print(line, file=sys.stderr)
        return 1 if bad else 0
    for p in SNAPSHOTS.rglob("*.txt"):
        p.unlink()
    for (command, recipe), text in rendered.items():
        path = snapshot_path(command, recipe)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"{len(rendered)} snapshots written under {SNAPSHOTS.relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
