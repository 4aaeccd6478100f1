"""Measure mixrl's import graph from the source text (``ast``; nothing is imported).

    python scripts/import_graph.py                 # the report for ./mixrl
    python scripts/import_graph.py --json          # the same numbers as JSON
    python scripts/import_graph.py --root DIR      # another package folder (its name is the folder's)

What it prints, and how each number is defined:

* **modules**: the ``.py`` files of the package (a package's ``__init__.py`` is the package).
* **import edges**: distinct ordered pairs (A, B) of package modules where A imports B, by any
  import statement anywhere in A (module level or inside a function). ``from P import n`` is an
  edge to the submodule ``P.n`` when that file exists, else to ``P`` itself; ``import P.Q.R`` is an
  edge to ``P.Q.R``; relative imports are resolved against A's package. Importing a submodule
  also runs its parents' ``__init__``; that implicit edge is not counted.
* **import cycles**: the strongly connected components with more than one module (or a module
  importing itself), listed with their members, computed twice: over all edges (the design's
  cycles: a function-level import dodges the import-time error, not the dependency) and over
  module-level edges only (the cycles Python itself must resolve at import time).
* **upward imports**: edges from a lower layer to a higher one in the intended order (``LAYERS``
  below; higher numbers may import lower ones and their own layer, never higher ones).
* **folder pairs importing each other** (the stricter reading of the layer order): two different
  folders of one layer (the first path component below the package; a top-level module is its own
  folder) where each imports the other. A layer holds folders side by side, so one of the two
  directions is an upward arrow the layer table hides; it counts the edges of the direction with
  fewer edges (on a tie, the direction made only of function-level imports, if one is; else both). **upward imports, strict** = the upward imports plus those.
* **function-level imports**: import statements inside a function or method body (module-level
  ``if``/``try`` blocks and class bodies run at import time and count as module level), split into
  mixrl-internal, standard library and third-party (one per statement; ``import a, b`` is
  counted once, by its first module). Each must carry ``# deferred: <why>`` on its line
  (:func:`undeferred_imports` lists those that do not).

The intended layer order (the architecture step's plan), with where the modules outside the
named packages are put, and why:

=====  =====================================================================================
layer  modules
=====  =====================================================================================
0      ``core`` (pure tensor math); ``errors`` (exception types, imported everywhere); ``progress``
       (the progress display of every long command: Rich only, used from ``models`` up to ``cli``);
       ``jsonl`` (the reader of a run's JSON-lines logs: the standard library only); ``options`` (the
       command line's output paths and numbers, checked before any work: the standard library and ``errors``);
       ``registry`` (the one registry type every registry is: the standard library and ``errors``)
1      ``sources``, ``sampler``, ``data``, ``rewards``, ``models``, ``tasks``; ``tools`` (the built-in
       tools a tool-calling rollout calls and the sandbox that runs model-written code: the standard
       library, ``errors`` and ``registry`` only); ``envs`` (stateful multi-turn environments and their episode
       loop on token ids: ``errors``, ``registry`` and ``tasks``); ``evaluation`` (a model's
       accuracy and pass@k on held-out rows, the held-out split, the periodic callback, saved
       model folders, the eval cache, the built-in models' held-out accuracy: it needs
       torch/transformers, ``errors``, ``tasks`` and ``models`` (never the reverse: the command that
       builds the shipped models and measures them is ``cli.ship_models``), reads configs by their
       fields, and is called by the trainer, so it sits below ``config``; ``mixrl eval``'s glue,
       which needs the trainer's assembly, is ``trainer.saved_eval``)
2      ``config`` (compose and validate)
3      ``trainer``; ``vllm_cpu``, ``vllm_file_transfer`` (vLLM's side of generation on its CPU build:
       the plugin, the CPU server, the file weight-transfer backend; TRL's side is ``trainer.trl_vllm``);
       ``explain`` (reads a composed config and renders its objective: a consumer of config
       and core, beside the trainer); ``benchmarks`` (the papers' benchmarks as config, their
       scoring and metrics, the trainer's periodic benchmark evaluation: the trainer's assembly
       loads the benchmarks a run scores; the command ``mixrl eval benchmarks=``, which loads
       saved models with the trainer's assembly, is ``cli.benchmarks``)
4      ``launch`` (``launch_configs``: the accelerate / DeepSpeed configs and the vLLM server command it writes); ``slurm`` (the sbatch job of a hardware config: the multi-node launch per node);
       ``plan`` (renders the launch command with ``launch``'s own functions, so it
       sits beside it; ``planning``, its code: shape, memory, evaluation, render); ``experiments`` (compare, claims, stats, suites, reproduce, methods: they
       run, launch or read runs; ``experiments.stats`` is pure numbers and imports nothing of
       mixrl, but only ``experiments`` reads it, so it lives in that package, at its layer)
5      ``cli``
=====  =====================================================================================

The package's ``__init__`` (``mixrl``) is layer 0 and its own imports are reported like any other.
A module the table does not name is reported as ``unplaced`` (so a new top-level module shows up).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import Counter
from pathlib import Path

#: first path component below the package -> layer (see the module docstring)
LAYERS = {
    "": 0, "core": 0, "errors": 0, "progress": 0, "jsonl": 0, "options": 0, "registry": 0,
    "sources": 1, "sampler": 1, "data": 1, "rewards": 1, "models": 1, "tasks": 1, "evaluation": 1,
    "tools": 1, "envs": 1,
    "config": 2,
    "trainer": 3, "vllm_cpu": 3, "vllm_file_transfer": 3, "explain": 3,
    "launch": 4, "launch_configs": 4, "slurm": 4, "plan": 4, "planning": 4, "experiments": 4, "benchmarks": 3,
    "cli": 5,
}


# --------------------------------------------------------------------------- parsing
def module_files(root: Path) -> dict[str, Path]:
    """``{dotted name: file}`` for every ``.py`` file under the package folder ``root``."""
    pkg = root.name
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([pkg, *parts])] = path
    return out


def _is_package(name: str, files: dict[str, Path]) -> bool:
    return files[name].name == "__init__.py"


def _imports(tree: ast.Module):
    """Yield ``(node, function_level)`` for every import statement."""

    def walk(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            yield from walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    yield from walk(tree, False)


def _resolve(module: str, node: ast.ImportFrom | ast.Import, files: dict[str, Path], pkg: str) -> tuple[list[str], str]:
    """(package modules the statement imports, the first imported name's top-level module)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
        targets = []
        for n in names:
            if n == pkg or n.startswith(pkg + "."):
                parts = n.split(".")  # the longest existing prefix (``import mixrl.x.y`` names a module)
                while parts and ".".join(parts) not in files:
                    parts.pop()
                if parts:
                    targets.append(".".join(parts))
        return targets, names[0].split(".")[0]
    if node.level:  # relative: against the importing module's package
        base = module.split(".") if _is_package(module, files) else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        src = ".".join(base + ([node.module] if node.module else []))
    else:
        src = node.module or ""
    top = src.split(".")[0]
    if top != pkg:
        return [], top
    targets = []
    for a in node.names:
        sub = f"{src}.{a.name}"
        if sub in files:
            targets.append(sub)
        elif src in files:
            targets.append(src)
    return sorted(set(targets)), top


def layer_of(module: str, pkg: str) -> int | None:
    parts = module.split(".")[1:]
    return LAYERS.get(parts[0] if parts else "")


DEFERRED = "# deferred:"


def undeferred_imports(root: Path) -> list[str]:
    """``"path:line: statement"`` for every function-level import under the package folder ``root``
    with no ``# deferred: <why>`` comment on one of its lines (issue 23's rule: an import stays
    inside a function only to defer a heavy or optional package, and says so where it stands)."""
    root = Path(root).resolve()
    missing = []
    for path in module_files(root).values():
        text = path.read_text()
        lines = text.splitlines()
        for node, function_level in _imports(ast.parse(text, filename=str(path))):
            if function_level and not any(DEFERRED in lines[i] for i in range(node.lineno - 1, node.end_lineno)):
                rel = path.relative_to(root.parent)
                missing.append(f"{rel}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return missing


#: rooms inside a layer, with the modules (prefix match) they must not import, at module level or
#: in a function: the trainer's parts and generation modules are handed what they need of TRL and
#: of the trainer (mixrl.trainer.grpo, its .trl_hooks and .assembly are the TRL glue that builds and calls them);
#: the run's state on disk (run directory, resume, checkpoint files) is read and written by the
#: glue and the run, and knows neither TRL nor a part (a checkpoint gets parts as ``Stateful``);
#: the vLLM plugin and the file weight-transfer backend run inside vLLM's own processes, which must
#: load neither TRL nor the trainer (what touches TRL's vLLM objects is mixrl.trainer.trl_vllm)
ROOMS = {
    "mixrl.trainer.parts": ("trl", "transformers", "mixrl.trainer.grpo", "mixrl.trainer.trl_hooks", "mixrl.trainer.assembly",
                            "mixrl.trainer.build", "mixrl.trainer.run"),
    "mixrl.trainer.generation": ("trl", "transformers", "mixrl.trainer.grpo", "mixrl.trainer.trl_hooks", "mixrl.trainer.assembly",
                                 "mixrl.trainer.build", "mixrl.trainer.run", "mixrl.trainer.parts"),
    "mixrl.trainer.state": ("trl", "transformers", "mixrl.trainer.grpo", "mixrl.trainer.trl_hooks", "mixrl.trainer.assembly",
                            "mixrl.trainer.build", "mixrl.trainer.run", "mixrl.trainer.parts", "mixrl.trainer.generation"),
    "mixrl.vllm_cpu": ("trl", "mixrl.trainer"),
    "mixrl.vllm_file_transfer": ("trl", "mixrl.trainer"),
}


def room_violations(root: Path, rooms: dict[str, tuple[str, ...]] = ROOMS) -> list[str]:
    """``"module imports name"`` for every import statement of a module in one of ``rooms`` that
    names a module the room forbids (resolved like :func:`analyse`; a third-party import by its
    dotted name)."""
    root = Path(root).resolve()
    files = module_files(root)
    out = []
    for module, path in files.items():
        forbidden = next((f for room, f in rooms.items() if module == room or module.startswith(room + ".")), None)
        if forbidden is None:
            continue
        for node, _ in _imports(ast.parse(path.read_text(), filename=str(path))):
            targets, top = _resolve(module, node, files, root.name)
            names = targets or ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or top])
            for name in names:
                if any(name == f or name.startswith(f + ".") for f in forbidden):
                    out.append(f"{module} imports {name}")
    return sorted(set(out))


# --------------------------------------------------------------------------- graph
def strongly_connected(nodes: list[str], edges: set[tuple[str, str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative); components with a cycle only, members sorted, largest first."""
    adj: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        adj[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(adj[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(adj[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or (v, v) in edges:
                    out.append(sorted(comp))
    return sorted(out, key=lambda c: (-len(c), c))


def folder_of(module: str) -> str:
    """The first path component below the package (``""`` for the package's ``__init__``)."""
    parts = module.split(".")[1:]
    return parts[0] if parts else ""


def folder_pairs_importing_each_other(edges: dict[tuple[str, str], bool], pkg: str) -> list[dict]:
    """Pairs of different folders on one layer where each imports the other: ``{"folders": [a, b],
    "edges": {a: [...], b: [...]}, "against": [...]}`` with each folder's edges into the other and the
    edges counted against the layer order (the direction with fewer edges; on a tie the one made only of
    function-level imports if exactly one is, else both). ``edges``: (a, b) -> some import is at module level."""
    by_pair: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for a, b in edges:
        fa, fb = folder_of(a), folder_of(b)
        if fa != fb and layer_of(a, pkg) is not None and layer_of(a, pkg) == layer_of(b, pkg):
            by_pair.setdefault((fa, fb), []).append((a, b))
    out = []
    for (fa, fb), ab in sorted(by_pair.items()):
        ba = by_pair.get((fb, fa))
        if fa > fb or not ba:
            continue
        ab, ba = sorted(ab), sorted(ba)
        deferred_ab, deferred_ba = not any(edges[e] for e in ab), not any(edges[e] for e in ba)
        if len(ab) != len(ba):
            against = ab if len(ab) < len(ba) else ba
        else:
            against = ab if deferred_ab and not deferred_ba else ba if deferred_ba and not deferred_ab else ab + ba
        out.append({"folders": [fa, fb], "edges": {fa: [list(e) for e in ab], fb: [list(e) for e in ba]},
                    "against": [list(e) for e in against]})
    return out


def analyse(root: Path) -> dict:
    root = Path(root).resolve()
    pkg = root.name
    files = module_files(root)
    stdlib = set(getattr(sys, "stdlib_module_names", ())) | {"__future__"}
    edges: dict[tuple[str, str], bool] = {}  # (a, b) -> some import of b in a is at module level
    fn_imports = Counter()
    for module, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, function_level in _imports(tree):
            targets, top = _resolve(module, node, files, pkg)
            if function_level:
                fn_imports["mixrl-internal" if top == pkg else "stdlib" if top in stdlib else "third-party"] += 1
            for t in targets:
                if t != module or isinstance(node, ast.Import):
                    edges[(module, t)] = edges.get((module, t), False) or not function_level
    nodes = list(files)
    all_edges = set(edges)
    top_edges = {e for e, module_level in edges.items() if module_level}
    upward = []
    unplaced = sorted({m for m in nodes if layer_of(m, pkg) is None})
    for a, b in sorted(all_edges):
        la, lb = layer_of(a, pkg), layer_of(b, pkg)
        if la is not None and lb is not None and lb > la:
            upward.append({"from": a, "to": b, "layers": [la, lb], "module_level": edges[(a, b)]})
    mutual = folder_pairs_importing_each_other(edges, pkg)
    strict = upward + [{"from": a, "to": b, "layers": [layer_of(a, pkg), layer_of(b, pkg)], "module_level": edges[(a, b)]}
                       for pair in mutual for a, b in pair["against"]]
    return {
        "package": pkg,
        "modules": len(nodes),
        "import_edges": len(all_edges),
        "module_level_edges": len(top_edges),
        "cycles": strongly_connected(nodes, all_edges),
        "module_level_cycles": strongly_connected(nodes, top_edges),
        "upward_imports": upward,
        "folder_pairs_importing_each_other": mutual,
        "upward_imports_strict": strict,
        "function_level_imports": dict(sorted(fn_imports.items())),
        "function_level_imports_total": sum(fn_imports.values()),
        "unplaced": unplaced,
    }


def report(r: dict) -> str:
    lines = [f"package {r['package']}: {r['modules']} modules, {r['import_edges']} import edges "
             f"({r['module_level_edges']} with a module-level import)"]
    for title, key in (("import cycles (all imports)", "cycles"), ("import cycles (module-level imports only)", "module_level_cycles")):
        lines.append(f"{title}: {len(r[key])}")
        lines += [f"  {len(c)} modules: {', '.join(c)}" for c in r[key]]
    up = r["upward_imports"]
    lines.append(f"upward imports: {len(up)} ({sum(u['module_level'] for u in up)} at module level)")
    lines += [f"  {u['from']} (layer {u['layers'][0]}) -> {u['to']} (layer {u['layers'][1]})"
              + ("" if u["module_level"] else "  [in a function]") for u in up]
    mutual, strict = r["folder_pairs_importing_each_other"], r["upward_imports_strict"]
    lines.append(f"folder pairs importing each other (one layer): {len(mutual)}; "
                 f"upward imports, strict (counting them): {len(strict)}")
    for pair in mutual:
        a, b = pair["folders"]
        lines.append(f"  {a} <-> {b}: {len(pair['edges'][a])} edges {a} -> {b}, {len(pair['edges'][b])} edges {b} -> {a}; "
                     "against the order: " + ", ".join(f"{x} -> {y}" for x, y in pair["against"]))
    fl = r["function_level_imports"]
    lines.append(f"function-level imports: {r['function_level_imports_total']} ("
                 + ", ".join(f"{k} {v}" for k, v in fl.items()) + ")")
    if r["unplaced"]:
        lines.append(f"modules with no layer (add them to LAYERS): {', '.join(r['unplaced'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent / "mixrl")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    r = analyse(a.root)
    print(json.dumps(r, indent=1) if a.json else report(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
