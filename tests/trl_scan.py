"""The TRL contract test's scan (``tests/test_trl_contract.py``): where in a package an attribute named
like a TRL private is read, written or called on an object that may be TRL's.

The receiver is resolved where the source says what it is:

* ``self.X`` / ``cls.X`` / ``super().X`` inside a class: a TRL object only if the class derives from
  ``trl`` or ``transformers`` (through the package's own classes, followed across its modules), or is a
  base (a mixin) of such a class. An unrelated class's own ``self._save`` is not TRL's.
* every other receiver (``trainer.X``, ``t.X``, ``self.vg.X``, ``GRPOTrainer.X``, ``self`` in a function
  outside a class, as in a method patched onto a TRL class) cannot be told apart from a TRL object by
  its source, so it counts.

:func:`assignment_sites` (the assignments to the TRL attributes mixrl patches) resolves the receiver
further, by the attribute's owner: ``self.generate = ...`` in a ``TrainerCallback`` is not
``VLLMGeneration.generate``, and ``model.generation_config = ...`` after ``model = Qwen2ForCausalLM(...)``
is not ``GRPOTrainer.generation_config``.

Only the standard library (``ast``); nothing of the scanned package is imported (the owner check
imports the TRL / transformers classes a class derives from or a local name is built as).
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
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
        """Each base as :meth:`resolve` names it."""
        for base in cls.bases:
            yield self.resolve(module, base)

    def resolve(self, module: str, expr: ast.expr):
        """The class ``expr`` names in ``module``: ``("trl", dotted)`` (a TRL / transformers class, dotted as
        imported), ``("class", key)`` (a package class) or None."""
        root, attrs = expr, []
        while isinstance(root, ast.Attribute):
            attrs.insert(0, root.attr)
            root = root.value
        while isinstance(root, ast.Subscript):  # Generic[...] and the like
            root = root.value
        if not isinstance(root, ast.Name):
            return None
        if not attrs and (module, root.id) in self.classes:
            return "class", (module, root.id)
        src, attr = self.names[module].get(root.id, (None, None))
        if src is None:
            return None
        if src.split(".")[0] in TRL_PACKAGES:
            return "trl", ".".join([src, *([attr] if attr else []), *attrs])
        if attr is not None and not attrs:
            return ("class", (src, attr)) if (src, attr) in self.classes else None
        if attr is None and len(attrs) == 1:
            return ("class", (src, attrs[0])) if (src, attrs[0]) in self.classes else None
        return None

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

    @functools.cached_property
    def _trl_bases(self) -> dict[tuple[str, str], set[str]]:
        return self._find_trl_bases()

    def trl_bases(self) -> dict[tuple[str, str], set[str]]:
        """For each class of :meth:`trl_classes`: the TRL / transformers classes (dotted) it derives from,
        with those of every class it is mixed into."""
        return self._trl_bases

    def _find_trl_bases(self) -> dict[tuple[str, str], set[str]]:

        def up(key, seen: frozenset) -> set[str]:
            out: set[str] = set()
            for b in self._bases(key[0], self.classes[key]):
                if b is not None and b[0] == "trl":
                    out.add(b[1])
                elif b is not None and b[1] not in seen:
                    out |= up(b[1], seen | {key})
            return out

        found = {k: bases for k in self.classes if (bases := up(k, frozenset()))}
        todo = list(found)
        while todo:  # a mixin takes the TRL bases of the classes it is mixed into
            key = todo.pop()
            for b in self._bases(key[0], self.classes[key]):
                if b is not None and b[0] == "class" and not found[key] <= found.get(b[1], set()):
                    found.setdefault(b[1], set()).update(found[key])
                    todo.append(b[1])
        return found


def _is_own_receiver(node: ast.expr) -> bool:
    """``self``, ``cls``, ``super()`` or ``super(C, self)``."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def _sites(root: Path, hits, counts=None) -> list[tuple[str, str]]:
    """``(name, "path:line")`` for every ``(name, receiver)`` that ``hits(node)`` yields on a node of the
    package whose receiver may be a TRL object (module docstring), or, with ``counts``, for which
    ``counts(name, receiver, where)`` says so (``where``: a :class:`_Where`); paths relative to ``root``'s
    parent, sorted."""
    root = Path(root).resolve()
    paths = {_module_name(root, p): p for p in sorted(root.rglob("*.py"))}
    trees = {m: ast.parse(p.read_text(), filename=str(p)) for m, p in paths.items()}
    classes = _Classes(root, trees)
    trl = classes.trl_classes()
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST, where: _Where) -> None:
        for child in ast.iter_child_nodes(node):
            for name, receiver in hits(child):
                if counts is not None:
                    hit = counts(name, receiver, where)
                else:
                    own = where.klass is not None and _is_own_receiver(receiver)
                    hit = not own or (where.module, where.klass.name) in trl
                if hit:
                    found.append((name, f"{paths[where.module].relative_to(root.parent).as_posix()}:{child.lineno}"))
            inner = where
            if isinstance(child, ast.ClassDef):
                inner = _Where(classes, where.module, child, where.scope)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                inner = _Where(classes, where.module, where.klass, child)
            visit(child, inner)

    for module, tree in trees.items():
        visit(tree, _Where(classes, module, None, tree))
    return sorted(set(found))


class _Where:
    """Where a node sits: the package's classes, its module, its class (or None) and its scope (the
    innermost function, or the module)."""

    def __init__(self, classes: _Classes, module: str, klass: ast.ClassDef | None, scope: ast.AST):
        self.classes, self.module, self.klass, self.scope = classes, module, klass, scope

    def built_as(self, name: str):
        """The class the local name ``name`` is built as, when every binding of it in the scope is
        ``name = C(...)`` of one class (as :meth:`_Classes.resolve` names it); else None (a parameter, an
        import, anything else: it may be anything)."""
        scope = self.scope
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = scope.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x is not None)]
            if any(p.arg == name for p in params):
                return None
        built, stores = [], 0
        for node in ast.walk(scope):
            if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
                stores += 1
            elif isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return None
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                return None
            elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                  and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)):
                built.append(self.classes.resolve(self.module, node.value.func))
        if not built or len(built) != stores or None in built or len(set(built)) != 1:
            return None
        return built[0]


def private_use_sites(root: Path, private: set[str], listed: set[str] = frozenset()) -> list[tuple[str, str]]:
    """``(name, "path:line")`` of every use of an attribute in ``private`` and not in ``listed`` whose
    receiver may be a TRL object (module docstring); paths relative to ``root``'s parent, sorted."""

    def hits(node: ast.AST):
        if isinstance(node, ast.Attribute) and node.attr in private and node.attr not in listed:
            yield node.attr, node.value

    return _sites(root, hits)


#: calls that set or delete the attribute their second argument names on their first:
#: ``setattr`` / ``delattr`` (also as a method, like pytest's ``monkeypatch.setattr``) and ``patch.object``
_SETTERS = ("setattr", "delattr")


def _is_setter(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in _SETTERS
    if not isinstance(func, ast.Attribute):
        return False
    if func.attr in _SETTERS:
        return True
    owner = func.value.attr if isinstance(func.value, ast.Attribute) else getattr(func.value, "id", None)
    return func.attr == "object" and owner == "patch"


@functools.lru_cache(maxsize=None)
def _load(dotted: str):
    """The module or class ``dotted`` names (TRL's or transformers', never the scanned package's), or None."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def _is_a(dotted: str, owner: str) -> bool:
    """Whether an instance of the TRL / transformers class ``dotted`` may be ``owner`` (a class: it is or
    derives from it; a module: never). True when either does not import: counted, to be safe."""
    cls, own = _load(dotted), _load(owner)
    if cls is None or own is None:
        return True
    return inspect.isclass(cls) and inspect.isclass(own) and issubclass(cls, own)


def assignment_sites(root: Path, owners: dict[str, set[str]]) -> list[tuple[str, str]]:
    """``(name, "path:line")`` of every assignment to (or deletion of) an attribute named in ``owners``
    (``{name: the dotted classes or modules whose attribute it is}``) on a receiver that may be one of its
    owners: ``X.name = ...`` (also augmented, annotated, in a tuple, a ``for`` or a ``with ... as``),
    ``del X.name``, and ``setattr(X, "name", ...)`` / ``delattr`` / ``patch.object(X, "name", ...)`` with the
    name written out. The receiver is resolved as for :func:`private_use_sites`, and further by its owner:
    ``self.name`` in a class that derives from TRL but not from an owner (a callback's own ``generate``) is
    not an owner's, nor is a local name that the scope only ever builds as a class that is no owner
    (``model = Qwen2ForCausalLM(config)``); every other receiver counts. Paths relative to ``root``'s
    parent, sorted."""

    def hits(node: ast.AST):
        if isinstance(node, ast.Attribute) and node.attr in owners and isinstance(node.ctx, (ast.Store, ast.Del)):
            yield node.attr, node.value
        elif (isinstance(node, ast.Call) and _is_setter(node.func) and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and node.args[1].value in owners):
            yield node.args[1].value, node.args[0]

    def counts(name: str, receiver: ast.expr, where: _Where) -> bool:
        bases = where.classes.trl_bases()
        if where.klass is not None and _is_own_receiver(receiver):
            cls = ("class", (where.module, where.klass.name))
        else:
            cls = where.built_as(receiver.id) if isinstance(receiver, ast.Name) else None
        if cls is None:
            return True
        dotted = [cls[1]] if cls[0] == "trl" else bases.get(cls[1], ())
        return any(_is_a(d, o) for d in dotted for o in owners[name])

    return _sites(root, hits, counts)


def private_uses(root: Path, private: set[str], listed: set[str] = frozenset()) -> dict[str, str]:
    """``{name: "path:line"}``: the first of :func:`private_use_sites` for each name."""
    out: dict[str, str] = {}
    for name, where in private_use_sites(root, private, listed):
        out.setdefault(name, where)
    return out
