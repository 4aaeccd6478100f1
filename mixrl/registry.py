"""Name -> component registries: the one registry type of mixrl.

Every registry is a :class:`Registry`: the core axes below, the off-policy sources and injections,
the sampler's pickers and filters, the rewards (``mixrl.rewards.REWARDS``), the reward models, the
stateful environments (``mixrl.envs.ENVIRONMENTS``), the built-in tools (``mixrl.tools.builtin.TOOLS``)
and the feedback builders (``mixrl.sources.feedback.BUILDERS``). A name is registered once: a second, different
component under a taken name is refused with one line naming both (registering the same object
again, as a re-imported module does, changes nothing). It imports only the standard library and
:mod:`mixrl.errors` (the torch-free packages use it; ``mixrl.core.registry`` re-exports it).

Each axis of a mixrl method (policy loss, token weight, aggregation, advantage, KL
estimator, schedule, controller) is a :class:`Registry` of small pure functions (or, for
controllers, classes). A component's *config parameters* are its keyword-only
parameters (after ``*``); each has a default and a simple annotation (``float``,
``int``, ``bool``, ``str``, ``float | None``, ``int | None``). Config validation and the
generated docs read them through :meth:`Registry.params`.

A component also *declares* what it computes, in its docstring: the first sentence is its
summary, a ``Formula:`` line its math (``{param}`` placeholders name its config
parameters), a ``Paper:`` line where it comes from. :meth:`Registry.declaration` reads
them and :meth:`Registry.formula` fills the placeholders with a config's values;
``mixrl explain`` and ``docs/components.md`` print nothing else about a component, so a
new one shows up in both without editing either.

A component declares the valid *range* of each numeric parameter next to its formula, as
``bounds=`` of :meth:`Registry.register` (e.g. ``{"gamma": "> 0"}``, ``{"mu": "[0, 1]"}``),
derived from what the formula does with it. :meth:`Registry.check_ranges` is the one check
that reads them: config validation (``mixrl train``, ``explain``, ``config show``) calls it
for every component section, so a value outside the range is refused with the range in the
message, before anything runs.
"""

from __future__ import annotations

import inspect
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mixrl.errors import ConfigError, did_you_mean


class UnknownComponentError(ConfigError, KeyError):
    """A component name that is not registered.

    ``str(e)`` is one line, e.g.
    ``unknown policy loss 'ppo_clp' (did you mean: ppo_clip?); choices: cispo, gspo, ...``.
    It is a ``KeyError`` (lookup failed) and a :class:`mixrl.errors.ConfigError`
    (the CLI prints it without a traceback).
    """

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:  # KeyError would print repr(message)
        return self.message


class ComponentParamError(ConfigError, TypeError):
    """Bad parameters for a component (unknown key, wrong type); one-line message."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Bound:
    """The valid range of one numeric parameter: ``lo``/``hi`` (None: unbounded), each end
    open or closed; ``why`` says what goes wrong outside it. Written as text
    (:func:`parse_bound`): ``"> 0"``, ``">= 1"``, ``"< 1"``, ``"[0, 1]"``, ``"(0, 1]"``."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    why: str = ""

    def contains(self, value: float) -> bool:
        v = float(value)
        if not math.isfinite(v):
            return False
        if self.lo is not None and (v < self.lo or (self.lo_open and v == self.lo)):
            return False
        if self.hi is not None and (v > self.hi or (self.hi_open and v == self.hi)):
            return False
        return True

    def __str__(self) -> str:
        if self.lo is not None and self.hi is not None:
            return f"in {'(' if self.lo_open else '['}{format_value(self.lo)}, {format_value(self.hi)}{')' if self.hi_open else ']'}"
        if self.lo is not None:
            return f"{'>' if self.lo_open else '>='} {format_value(self.lo)}"
        if self.hi is not None:
            return f"{'<' if self.hi_open else '<='} {format_value(self.hi)}"
        return "finite"


_INTERVAL = re.compile(r"^([\[(])\s*([^,]+?)\s*,\s*([^\])]+?)\s*([\])])$")
_COMPARE = re.compile(r"^(>=|>|<=|<)\s*(\S+)$")


def parse_bound(spec: str | tuple[str, str] | Bound) -> Bound:
    """A :class:`Bound` from ``"> 0"``, ``"[0, 1)"``... or ``(text, why)``."""
    if isinstance(spec, Bound):
        return spec
    text, why = (spec, "") if isinstance(spec, str) else spec
    text = text.strip()
    m = _INTERVAL.match(text)
    if m:
        lo, hi = float(m.group(2)), float(m.group(3))
        if lo > hi:
            raise ValueError(f"bound {text!r}: lower end above upper end")
        return Bound(lo, hi, m.group(1) == "(", m.group(4) == ")", why)
    m = _COMPARE.match(text)
    if m:
        op, x = m.group(1), float(m.group(2))
        if op.startswith(">"):
            return Bound(lo=x, lo_open=op == ">", why=why)
        return Bound(hi=x, hi_open=op == "<", why=why)
    raise ValueError(f"bound {text!r}: write '> x', '>= x', '< x', '<= x' or an interval '[a, b]', '(a, b]'")


class Registry:
    """A named collection of components of one kind (e.g. ``"policy loss"``).

    ``runtime``: keyword-only parameter names that the *caller* supplies at run time
    (e.g. an advantage's ``include`` mask, an aggregation's ``num_items``); they are not
    config parameters and :meth:`params` leaves them out.
    """

    def __init__(self, kind: str, runtime: tuple[str, ...] = ()):
        self.kind = kind
        self.runtime = tuple(runtime)
        self._items: dict[str, Callable[..., Any]] = {}
        self._bounds: dict[str, dict[str, Bound]] = {}

    def register(self, name: str, *, bounds: Mapping[str, Any] | None = None):
        """Decorator: register ``fn`` under ``name``; returns ``fn`` unchanged.

        ``bounds``: ``{param: range}`` for numeric config parameters (see :func:`parse_bound`;
        a ``(range, why)`` pair adds the reason); each must name a parameter of ``fn``."""
        parsed = {k: parse_bound(v) for k, v in (bounds or {}).items()}

        def deco(fn):
            self.add(name, fn)
            self._bounds[name] = parsed
            unknown = set(parsed) - set(self.params(name)) if parsed else set()  # (signatures read only when needed)
            if unknown:
                raise ValueError(f"{self.kind} '{name}': bounds for unknown parameter(s) {', '.join(sorted(unknown))}")
            return fn

        return deco

    def add(self, name: str, item: Any) -> Any:
        """Register ``item`` under ``name`` (what :meth:`register` does); returns ``item``. A name
        taken by another object is refused: ``ValueError``, one line naming both and the fix."""
        old = self._items.get(name, item)
        if old is not item:
            raise ValueError(f"{self.kind} {name!r} is already registered ({_label(old)}), so {_label(item)} cannot "
                             "take it; choose another name")
        self._items[name] = item
        return item

    def get(self, name: str) -> Callable[..., Any]:
        """Return the component, or raise :class:`UnknownComponentError` (one line)."""
        try:
            return self._items[name]
        except (KeyError, TypeError):
            pass
        choices = self.names()
        hint = did_you_mean(str(name), choices)
        raise UnknownComponentError(
            f"unknown {self.kind} {str(name)!r}{hint}; choices: {', '.join(choices)}"
        )

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._items)

    def params(self, name: str) -> dict[str, inspect.Parameter]:
        """The keyword-only parameters (= config parameters) of a component, in order.

        Runtime parameters (see ``runtime``) are left out. Annotations are evaluated
        (``float | None`` is a ``types.UnionType``, not a string). For a class, the
        parameters of its constructor.
        """
        fn = self.get(name)
        sig = inspect.signature(fn, eval_str=True)
        return {
            p.name: p
            for p in sig.parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in self.runtime
        }

    def defaults(self, name: str) -> dict[str, Any]:
        """``{param: default}`` for the config parameters of a component."""
        return {k: p.default for k, p in self.params(name).items()}

    def bounds(self, name: str) -> dict[str, Bound]:
        """``{param: Bound}``: the declared valid ranges of a component's parameters."""
        self.get(name)
        return dict(self._bounds.get(name, {}))

    def range_violation(self, name: str, params: Mapping[str, Any]) -> tuple[str, Any, Bound] | None:
        """The first ``(param, value, bound)`` of ``params`` outside its declared range (a
        NaN or infinite number is outside every range), or None. Values that are not plain
        numbers (None, a schedule, a list) are left to the component."""
        for key, bound in self.bounds(name).items():
            value = params.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if not bound.contains(value):
                return key, value, bound
        return None

    def check_ranges(self, name: str, params: Mapping[str, Any], where: str | None = None) -> None:
        """Raise :class:`ComponentParamError` (one line: the key, its value, the range and
        why) for the first parameter outside its declared range."""
        bad = self.range_violation(name, params)
        if bad is None:
            return
        key, value, bound = bad
        path = f"{where}.{key}" if where else key
        why = f" ({bound.why})" if bound.why else ""
        what = "is out of range" if math.isfinite(float(value)) else "is not a finite number"
        raise ComponentParamError(
            f"{path}={format_value(value)} {what}: {self.kind} '{name}' needs {key} {bound}{why}; "
            f"set {path} to a value {bound}"
        )

    def declaration(self, name: str) -> dict[str, str | None]:
        """What a component declares in its docstring: ``summary`` (its first sentence),
        ``formula`` (after ``Formula:``) and ``paper`` (after ``Paper:``), each ``None`` when
        absent. A section runs to the next blank line or the next ``Formula:`` /
        ``Paper:`` / ``Parameters:`` line; its lines are joined by spaces and backticks
        are removed."""
        return {"name": name, "kind": self.kind, **parse_declaration(inspect.getdoc(self.get(name)) or "")}

    def formula(self, name: str, params: dict[str, Any] | None = None) -> str:
        """The declared formula with ``{param}`` placeholders filled in from ``params``
        (missing ones from the defaults); braces that name no parameter stay as they are.
        ``{param|TEXT}`` reads TEXT when the parameter is unset (None), its value otherwise;
        a plain placeholder or a listed parameter that is unset reads ``unset``: the rendered
        formula never says ``None``.
        Parameters that no placeholder shows are listed after it: ``... [k=v, ...]``.
        Without a ``Formula:`` line, the summary stands in for the formula."""
        decl = self.declaration(name)
        text = decl["formula"] or decl["summary"] or name
        values = {**self.defaults(name), **{k: v for k, v in (params or {}).items() if k != "name"}}
        used: set[str] = set()

        def fill(m: re.Match) -> str:
            key, unset = m.group(1), m.group(2)
            if key not in values:
                return m.group(0)
            used.add(key)
            if values[key] is None:
                return unset if unset is not None else UNSET
            return format_value(values[key])

        text = _PLACEHOLDER.sub(fill, text)
        rest = [f"{k}={UNSET if v is None else format_value(v)}" for k, v in values.items() if k not in used]
        return f"{text} [{', '.join(rest)}]" if rest else text

    def check_params(self, name: str, overrides: dict[str, Any]) -> None:
        """Raise :class:`ComponentParamError` for unknown keys or clearly wrong types."""
        params = self.params(name)
        for key, value in overrides.items():
            if key not in params:
                hint = did_you_mean(str(key), params)
                raise ComponentParamError(
                    f"{self.kind} '{name}' has no parameter {key!r}{hint}; "
                    f"parameters: {', '.join(params) or '(none)'}"
                )
            if not _value_matches(value, params[key].annotation):
                raise ComponentParamError(
                    f"{self.kind} '{name}': parameter {key!r} must be "
                    f"{_annotation_text(params[key].annotation)}, got {value!r}"
                )

    def __contains__(self, name) -> bool:
        return name in self._items

    def __getitem__(self, name: str) -> Any:
        """``registry[name]``: :meth:`get` (an unknown name is :class:`UnknownComponentError`, a ``KeyError``)."""
        return self.get(name)

    def items(self) -> list[tuple[str, Any]]:
        """``(name, component)`` pairs, by name."""
        return [(n, self._items[n]) for n in self.names()]

    def __iter__(self):
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


def _label(obj: Any) -> str:
    """An object as a double-registration message names it: ``module.qualname`` of a function or class."""
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    module = getattr(obj, "__module__", None) or type(obj).__module__
    return f"{module}.{name}"


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?:\|([^{}]*))?\}")
#: how :meth:`Registry.formula` shows a parameter left unset (None) without a text of its own
UNSET = "unset"
_SECTIONS = ("Formula:", "Paper:", "Parameters:")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def parse_declaration(doc: str) -> dict[str, str | None]:
    """``{summary, formula, paper}`` of a docstring (see :meth:`Registry.declaration`)."""
    lines = inspect.cleandoc(doc).splitlines()
    para: list[str] = []
    for line in lines:
        if not line.strip():
            if para:
                break
            continue
        if line.strip().startswith(_SECTIONS):
            break
        para.append(line.strip())
    # the first sentence of the first paragraph (a summary line may wrap)
    summary = _SENTENCE_END.split(" ".join(para), maxsplit=1)[0].replace("`", "") or None

    def section(key: str) -> str | None:
        for i, line in enumerate(lines):
            if not line.strip().startswith(key):
                continue
            parts = [line.strip()[len(key):].strip()]
            for nxt in lines[i + 1:]:
                t = nxt.strip()
                if not t or t.startswith(_SECTIONS):
                    break
                parts.append(t)
            return " ".join(p for p in parts if p).replace("`", "") or None
        return None

    return {"summary": summary, "formula": section("Formula:"), "paper": section("Paper:")}


def format_value(value: Any) -> str:
    """A config value as it reads in a formula: ``0.2``, ``1e-06``, ``3``, ``None``; a nested
    component (a mapping with a ``name``) by its name."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value == int(value) and abs(value) < 1e16:
            return str(int(value))
        return f"{value:.6g}"
    if isinstance(value, Mapping) and "name" in value:
        return str(value["name"])
    return str(value)


def _annotation_text(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return "any"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("NoneType", "None")


def _value_matches(value: Any, annotation: Any) -> bool:
    """Loose type check for the simple annotations used by core components."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return True
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return any(_value_matches(value, a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True
