"""The TRL contract test's scan (``tests/test_trl_contract.py``): where in a package an attribute named
like a TRL private is read, written or called on an object that may be TRL's.

The receiver is resolved where the source says what it is:

* ``self.X`` / ``cls.X`` / ``super().X`` inside a class: a TRL object only if the class derives from
  ``trl`` or ``transformers`` (through the package's own classes, followed across its modules), or is a
  base (a mixin) of such a class. An unrelated class's own ``self._save`` is not TRL's.
* every other receiver (``trainer.X``, ``t.X``, ``self.vg.X``, ``GRPOTrainer.X``, ``self`` in a function
  outside a class, as in a method patched onto a TRL class) cannot be told apart from a TRL object by
  its source, so it counts.

Only the standard library (``ast``); nothing of the scanned package is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

TRL_PACKAGES = ("trl", "transformers")


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([root.name, *parts])


class _Classes:
    """Every class of the package, and what each module's names refer to."""

    def __init__(self, root: Path, trees: dict[str, ast.Module]):
        self.pkg = root.name
        self.classes: dict[tuple[str, str], ast.ClassDef] = {}
        self.names: dict[str, dict[str, tuple[str, str | None]]] = {}  # module -> name -> (module, attr or None)
        for module, tree in trees.items():
            self.names[module] = {}
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    self.classes.setdefault((module, node.name), node)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    for a in node.names:
                        self.names[module][a.asname or a.name] = (node.module, a.name)
                elif isinstance(node, ast.Import):
                    for a in node.names:
                        self.names[module][a.asname or a.name.split(".")[0]] = (a.name if a.asname else a.name.split(".")[0], None)
        self._trl: dict[tuple[str, str], bool] = {}

    def _bases(self, module: str, cls: ast.ClassDef):
        """Each base as ``("trl", None)`` (a TRL / transformers name), ``("class", key)`` (a package class) or None."""
        for base in cls.bases:
            root, attrs = base, []
            while isinstance(root, ast.Attribute):
                attrs.insert(0, root.attr)
                root = root.value
            while isinstance(root, ast.Subscript):  # Generic[...] and the like
                root = root.value
            if not isinstance(root, ast.Name):
                yield None
                continue
            if not attrs and (module, root.id) in self.classes:
                yield "class", (module, root.id)
                continue
            src, attr = self.names[module].get(root.id, (None, None))
            if src is None:
                yield None
            elif src.split(".")[0] in TRL_PACKAGES:
                yield "trl", None
            elif attr is not None and not attrs:
                yield ("class", (src, attr)) if (src, attr) in self.classes else None
            elif attr is None and len(attrs) == 1:
                yield ("class", (src, attrs[0])) if (src, attrs[0]) in self.classes else None
            else:
                yield None

    def derives_from_trl(self, key: tuple[str, str], seen: frozenset = frozenset()) -> bool:
        if key not in self._trl:
            if key in seen:
                return False
            found = False
            for b in self._bases(key[0], self.classes[key]):
                if b is not None and (b[0] == "trl" or self.derives_from_trl(b[1], seen | {key})):
                    found = True
                    break
            self._trl[key] = found
        return self._trl[key]

    def trl_classes(self) -> set[tuple[str, str]]:
        """Classes deriving from TRL / transformers, and the package classes they mix in."""
        out = {k for k in self.classes if self.derives_from_trl(k)}
        todo = list(out)
        while todo:
            key = todo.pop()
            for b in self._bases(key[0], self.classes[key]):
                if b is not None and b[0] == "class" and b[1] not in out:
                    out.add(b[1])
                    todo.append(b[1])
        return out


def _is_own_receiver(node: ast.expr) -> bool:
    """``self``, ``cls``, ``super()`` or ``super(C, self)``."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def private_use_sites(root: Path, private: set[str], listed: set[str] = frozenset()) -> list[tuple[str, str]]:
    """``(name, "path:line")`` of every use of an attribute in ``private`` and not in ``listed`` whose
    receiver may be a TRL object (module docstring); paths relative to ``root``'s parent, sorted."""
    root = Path(root).resolve()
    paths = {_module_name(root, p): p for p in sorted(root.rglob("*.py"))}
    trees = {m: ast.parse(p.read_text(), filename=str(p)) for m, p in paths.items()}
    trl = _Classes(root, trees).trl_classes()
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST, module: str, klass: ast.ClassDef | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Attribute) and child.attr in private and child.attr not in listed:
                own = klass is not None and _is_own_receiver(child.value)
                if not own or (module, klass.name) in trl:
                    found.append((child.attr, f"{paths[module].relative_to(root.parent).as_posix()}:{child.lineno}"))
            visit(child, module, child if isinstance(child, ast.ClassDef) else klass)

    for module, tree in trees.items():
        visit(tree, module, None)
    return sorted(set(found))


def private_uses(root: Path, private: set[str], listed: set[str] = frozenset()) -> dict[str, str]:
    """``{name: "path:line"}``: the first of :func:`private_use_sites` for each name."""
    out: dict[str, str] = {}
    for name, where in private_use_sites(root, private, listed):
        out.setdefault(name, where)
    return out
