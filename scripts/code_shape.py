"""Measure the shape of mixrl's code from the source text (``ast``; nothing is imported).

    python scripts/code_shape.py           # the report for ./mixrl
    python scripts/code_shape.py --json    # the same numbers as JSON
    python scripts/code_shape.py --root DIR

What it prints, and how each number is defined (issue 47's closing note reads them):

* **modules over 400 lines** (:data:`MAX_MODULE_LINES`): ``.py`` files under the package with more
  lines than that (``len(text.splitlines())``).
* **functions over 80 lines** (:data:`MAX_FUNCTION_LINES`): every ``def`` (module level, method or
  nested) from its ``def`` line to its last line (``end_lineno - lineno + 1``; decorators not counted).
* **import arrows and upward arrows**: from ``scripts/import_graph.py`` (edges between package
  modules; upward imports by the layer table, loose; and strict, counting folder pairs of one layer
  that import each other).
* **closures handed to parts**: in ``trainer/assembly.py`` and ``trainer/build.py``, call arguments
  (positional or keyword) that are a ``lambda`` or the name of a function defined inside the calling
  function; each with its line and the call it goes to.
* **the cfg path**: starting at ``trainer/run.py:train_stages``, every call that passes the config
  (a *cfg expression*: a cfg name, or an attribute / subscript chain on one such as ``cfg.algo.loss``)
  to a function of the package that the call can be resolved to (a function of the same module, a
  name imported from a package module, ``module.f`` on an imported module, ``Class(...)`` (its
  ``__init__``), ``Class.method``, ``self.method`` inside a class). A *cfg name* inside a function is
  a parameter that received a cfg expression at some followed call, any parameter or local variable
  named ``cfg`` or ending in ``cfg`` (``stage_cfg``, ``scfg``: mixrl's naming of its config
  objects), and a local name assigned a cfg expression. Each function is analysed once per set of
  cfg parameters it is reached with (a fixpoint, so the result does not depend on the order);
  **calls** = distinct call sites followed, **functions** = functions reached, **entries into
  trainer/build.py** = call sites in another module that land in ``mixrl.trainer.build`` (calls
  inside build.py are counted apart); cfg-passing call sites not followed: **library calls** (a
  builtin such as ``int(cfg.x)``, or a name imported from another package such as ``OmegaConf``) and
  **unresolved** ones (a method of an object of unknown type, such as ``source.prepare(cfg)``).
"""

from __future__ import annotations

import argparse
import ast
import builtins
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import import_graph  # noqa: E402  (the sibling script: arrows and layers)

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
START = ("mixrl.trainer.run", "train_stages")
BUILD = "mixrl.trainer.build"
CLOSURE_FILES = ("trainer/assembly.py", "trainer/build.py")

FuncDef = (ast.FunctionDef, ast.AsyncFunctionDef)


# --------------------------------------------------------------------------- sizes
def long_modules(root: Path, limit: int = MAX_MODULE_LINES) -> list[tuple[str, int]]:
    """``(path relative to root's parent, lines)`` of every module over ``limit`` lines, longest first."""
    root = Path(root).resolve()
    out = [(p.relative_to(root.parent).as_posix(), len(p.read_text().splitlines())) for p in sorted(root.rglob("*.py"))]
    return sorted(((p, n) for p, n in out if n > limit), key=lambda x: (-x[1], x[0]))


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, str, int]]:
    """``(path:line, qualified name, lines)`` of every function over ``limit`` lines, longest first."""
    root = Path(root).resolve()
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        for qual, node in _functions(ast.parse(path.read_text(), filename=str(path))):
            n = node.end_lineno - node.lineno + 1
            if n > limit:
                out.append((f"{rel}:{node.lineno}", qual, n))
    return sorted(out, key=lambda x: (-x[2], x[0]))


def _functions(tree: ast.AST, prefix: str = ""):
    """``(qualified name, node)`` for every function under ``tree``, nested ones included."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, FuncDef):
            qual = f"{prefix}{child.name}"
            yield qual, child
            yield from _functions(child, f"{qual}.<locals>.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


# --------------------------------------------------------------------------- closures
def closures_to_parts(root: Path, files: tuple[str, ...] = CLOSURE_FILES) -> list[dict]:
    """Lambdas and nested functions passed as call arguments in ``files`` (relative to ``root``)."""
    root = Path(root).resolve()
    out = []
    for rel in files:
        path = root / rel
        if not path.exists():
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for qual, fn in _functions(tree):
            nested = {n.name for n in ast.walk(fn) if isinstance(n, FuncDef) and n is not fn}
            for call in _own_nodes(fn, ast.Call):
                for arg in [*call.args, *(k.value for k in call.keywords)]:
                    if isinstance(arg, ast.Lambda) or (isinstance(arg, ast.Name) and arg.id in nested):
                        out.append({"file": f"{root.name}/{rel}", "line": arg.lineno, "function": qual,
                                    "call": ast.unparse(call.func), "what": "lambda" if isinstance(arg, ast.Lambda) else arg.id})
    return sorted(out, key=lambda c: (c["file"], c["line"]))


def _own_nodes(fn: ast.AST, kind):
    """Nodes of type ``kind`` in ``fn``'s body, not inside a nested function or class (those are walked on their own)."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, kind):
            yield node
        if not isinstance(node, (*FuncDef, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


# --------------------------------------------------------------------------- the cfg path
class Package:
    """The package's functions and each module's imported names, for resolving a call."""

    def __init__(self, root: Path):
        root = Path(root).resolve()
        self.pkg = root.name
        self.files = import_graph.module_files(root)
        self.defs: dict[tuple[str, str], ast.AST] = {}  # (module, "f" | "Class.m") -> def node
        self.classes: dict[tuple[str, str], ast.ClassDef] = {}
        self.owner: dict[int, str] = {}  # id(def node) -> its class name
        self.imports: dict[str, dict[str, tuple[str, str | None]]] = {}
        self.external: dict[str, set[str]] = {}  # module -> names its imports bind to other packages
        for module, path in self.files.items():
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in tree.body:
                if isinstance(node, FuncDef):
                    self.defs[(module, node.name)] = node
                elif isinstance(node, ast.ClassDef):
                    self.classes[(module, node.name)] = node
                    for b in node.body:
                        if isinstance(b, FuncDef):
                            self.defs[(module, f"{node.name}.{b.name}")] = b
                            self.owner[id(b)] = node.name
            self.imports[module] = self._imports(module, tree)
            bound = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                     for a in n.names}
            self.external[module] = bound - set(self.imports[module])

    def _imports(self, module: str, tree: ast.Module) -> dict[str, tuple[str, str | None]]:
        """name -> (package module, attribute or None), from every import statement (deferred ones too)."""
        out: dict[str, tuple[str, str | None]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                targets, _ = import_graph._resolve(module, node, self.files, self.pkg)
                if not targets:
                    continue
                src = node.module or ""
                if node.level:
                    base = module.split(".") if self.files[module].name == "__init__.py" else module.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    src = ".".join(base + ([node.module] if node.module else []))
                for a in node.names:
                    full = f"{src}.{a.name}"
                    out[a.asname or a.name] = (full, None) if full in self.files else (src, a.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == self.pkg and a.name in self.files:
                        out[a.asname or a.name.split(".")[0]] = (a.name, None) if a.asname else (a.name.split(".")[0], None)
        return out

    def _callable(self, module: str, name: str) -> tuple[str, str] | None:
        """``module.name`` as a function, or a class's ``__init__``."""
        if (module, name) in self.defs:
            return module, name
        if (module, name) in self.classes and (module, f"{name}.__init__") in self.defs:
            return module, f"{name}.__init__"
        return None

    def is_library(self, module: str, func: ast.expr) -> bool:
        """A builtin, or a name (or ``name.attr...``) imported from another package."""
        while isinstance(func, ast.Attribute):
            func = func.value
        return isinstance(func, ast.Name) and (func.id in self.external[module] or
                                               (hasattr(builtins, func.id) and func.id not in self.imports[module]))

    def resolve(self, module: str, klass: str | None, func: ast.expr) -> tuple[str, str] | None:
        imports = self.imports[module]
        if isinstance(func, ast.Name):
            if func.id in imports:
                mod, attr = imports[func.id]
                return self._callable(mod, attr) if attr else None
            return self._callable(module, func.id)
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
            return None
        base, attr = func.value.id, func.attr
        if base == "self" and klass:
            return self._callable(module, f"{klass}.{attr}")
        if base in imports:
            mod, name = imports[base]
            if name is None:  # a module
                return self._callable(mod, attr)
            return self._callable(mod, f"{name}.{attr}")  # Class.method
        return self._callable(module, f"{base}.{attr}")


def _is_cfg_name(name: str, names: set[str]) -> bool:
    return name in names or name == "cfg" or name.endswith("cfg")


def _is_cfg_expr(node: ast.expr, names: set[str]) -> bool:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return isinstance(node, ast.Name) and _is_cfg_name(node.id, names)


def _local_cfg_names(fn: ast.AST, params: set[str]) -> set[str]:
    """``params`` plus the local names assigned a cfg expression (repeated until nothing is added)."""
    names = set(params)
    while True:
        added = {t.id for a in _own_nodes(fn, ast.Assign) if _is_cfg_expr(a.value, names)
                 for t in a.targets if isinstance(t, ast.Name) and t.id not in names}
        if not added:
            return names
        names |= added


def _receiving_params(fn: ast.AST, call: ast.Call, names: set[str], bound: bool) -> set[str]:
    """The callee's parameters that receive a cfg expression at ``call`` (``bound``: a method called
    on an instance or a class call, so the first positional parameter is ``self``)."""
    a = fn.args
    positional = [p.arg for p in [*a.posonlyargs, *a.args]][1 if bound else 0:]
    out = set()
    for i, arg in enumerate(call.args):
        if _is_cfg_expr(arg, names) and i < len(positional):
            out.add(positional[i])
    every = {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
    out |= {k.arg for k in call.keywords if k.arg in every and _is_cfg_expr(k.value, names)}
    return out


def cfg_path(root: Path, start: tuple[str, str] = START, build: str = BUILD) -> dict:
    """Follow the config from ``start`` (module docstring: what is followed and counted)."""
    package = Package(root)
    reached: dict[tuple[str, str], set[str]] = {start: set()}  # its cfg names: by the naming rule
    work = [start]
    sites: dict[tuple[str, int, int], tuple[str, str]] = {}  # (caller module, line, col) -> target
    unresolved: set[tuple[str, int, int]] = set()
    library: set[tuple[str, int, int]] = set()
    while work:
        key = work.pop()
        fn = package.defs[key]
        klass = package.owner.get(id(fn))
        names = _local_cfg_names(fn, reached[key])
        for call in _own_nodes(fn, ast.Call):
            if not any(_is_cfg_expr(x, names) for x in [*call.args, *(k.value for k in call.keywords)]):
                continue
            target = package.resolve(key[0], klass, call.func)
            site = (key[0], call.lineno, call.col_offset)
            if target is None:
                (library if package.is_library(key[0], call.func) else unresolved).add(site)
                continue
            sites[site] = target
            callee = package.defs[target]
            bound = target[1].endswith(".__init__") or (isinstance(call.func, ast.Attribute) and call.func.value.id == "self")
            params = _receiving_params(callee, call, names, bound) | reached.get(target, set())
            if target not in reached or params != reached[target]:
                reached[target] = params
                work.append(target)
    into_build = [s for s, t in sites.items() if t[0] == build]
    return {
        "start": ".".join(start),
        "calls": len(sites),
        "functions": len(reached),
        "build_entries": sum(1 for s in into_build if s[0] != build),
        "build_internal_calls": sum(1 for s in into_build if s[0] == build),
        "build_functions_reached": sorted(k[1] for k in reached if k[0] == build),
        "library_calls": len(library),
        "unresolved": len(unresolved),
    }


# --------------------------------------------------------------------------- report
def analyse(root: Path) -> dict:
    root = Path(root).resolve()
    graph = import_graph.analyse(root)
    return {
        "package": root.name,
        "modules_over_400": long_modules(root),
        "functions_over_80": long_functions(root),
        "import_edges": graph["import_edges"],
        "upward_imports_loose": len(graph["upward_imports"]),
        "upward_imports_strict": len(graph["upward_imports_strict"]),
        "closures_to_parts": closures_to_parts(root),
        "cfg_path": cfg_path(root),
    }


def report(r: dict) -> str:
    lines = [f"package {r['package']}"]
    lines.append(f"modules over {MAX_MODULE_LINES} lines: {len(r['modules_over_400'])}")
    lines += [f"  {p}: {n}" for p, n in r["modules_over_400"]]
    lines.append(f"functions over {MAX_FUNCTION_LINES} lines: {len(r['functions_over_80'])}")
    lines += [f"  {where} {name}: {n}" for where, name, n in r["functions_over_80"]]
    lines.append(f"import arrows (edges): {r['import_edges']}; upward arrows: {r['upward_imports_loose']} loose, "
                 f"{r['upward_imports_strict']} strict")
    c = r["closures_to_parts"]
    lines.append(f"lambdas/closures handed on in {' and '.join(CLOSURE_FILES)}: {len(c)}")
    lines += [f"  {x['file']}:{x['line']} {x['function']}: {x['what']} -> {x['call']}" for x in c]
    p = r["cfg_path"]
    lines.append(f"cfg path from {p['start']}: {p['calls']} calls into {p['functions']} functions; "
                 f"{p['build_entries']} entries into trainer/build.py (+{p['build_internal_calls']} calls inside it; "
                 f"{len(p['build_functions_reached'])} of its functions reached); not followed: {p['library_calls']} calls into builtins "
                 f"and other packages, {p['unresolved']} calls on objects of unknown type")
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
