"""Render ``docs/components.md`` from the registries.

``mixrl docs components`` writes the page; a test checks the committed file is current.

Every entry is rendered from what it declares (:meth:`mixrl.core.registry.Registry.declaration`:
summary, ``Formula:``, ``Paper:``), its docstring and its signature, for every registry it is
given (default :data:`mixrl.core.REGISTRIES`), and every registered token provenance. A new
component or registry shows up here without editing this module. The page's off-policy sources
and injections are added by :mod:`mixrl.sources.docs`: core (pure tensor math) imports no layer
above it.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Mapping

from mixrl.core import REGISTRIES, Registry
from mixrl.core import provenance as prov

_TITLES = {
    "policy_loss": ("Policy losses", "fn(logp, old_logp, advantages, mask, *, params) -> PolicyLossOutput"),
    "token_weight": ("Token weights", "fn(logp, *, cutoff=None, params) -> Tensor [B, T], detached"),
    "aggregation": ("Aggregations", "fn(per_token_loss, mask, *, max_len=None, num_items=None) -> scalar"),
    "advantage": ("Advantages", "fn(rewards [N], group_ids [N], *, include=None, params) -> Tensor [N]"),
    "kl_estimator": ("KL estimators", "fn(logp, ref_logp) -> Tensor [B, T]"),
    "schedule": ("Schedules", "fn(step, *, params) -> float"),
    "controller": ("Controllers", "class(*, params) with step(stats), knobs(), check(objective), state_dict()"),
    "term": ("Terms", "fn(x: TermInputs, *, params) -> TermOutput (per-token loss on the selected tokens)"),
}
_SECTIONS = ("Formula:", "Paper:", "Parameters:")


def _annotation(a) -> str:
    if a is inspect.Parameter.empty:
        return ""
    if isinstance(a, type):
        return a.__name__
    return str(a).replace("NoneType", "None")


def _docstring_body(obj) -> str:
    """The docstring without its declared sections (``Formula:``, ``Paper:``,
    ``Parameters:``), which are rendered separately."""
    lines = (inspect.getdoc(obj) or "").splitlines()
    out: list[str] = []
    skipping = False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith(_SECTIONS):
            skipping = True
            continue
        if skipping and stripped:
            continue
        skipping = False
        out.append(line)
    text = "\n".join(out).strip()
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text


def _param_docs(obj) -> dict[str, str]:
    """``name -> description`` parsed from the docstring's ``Parameters:`` section."""
    doc = inspect.getdoc(obj) or ""
    out: dict[str, str] = {}
    in_params = False
    current = None
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped.startswith("Parameters"):
            in_params = True
            continue
        if not in_params or not stripped:
            continue
        head, sep, rest = stripped.partition(":")
        name = head.split("(")[0].strip()
        if sep and name.isidentifier() and "(" in head:
            current = name
            out[name] = rest.strip()
        elif current:
            out[current] += " " + stripped
    return out


def _render_entry(registry: Registry, name: str) -> list[str]:
    obj = registry.get(name)
    decl = registry.declaration(name)
    lines = [f"### `{name}`", ""]
    body = _docstring_body(obj)
    if body:
        lines += [body, ""]
    if decl["formula"]:
        lines += [f"Formula: `{decl['formula']}`", ""]
    if decl["paper"]:
        lines += [f"Paper: {decl['paper']}", ""]
    params = registry.params(name)
    descriptions = _param_docs(obj)
    if params:
        bounds = registry.bounds(name)
        lines += ["| parameter | type | default | valid range | meaning |", "|---|---|---|---|---|"]
        for pname, p in params.items():
            default = "—" if p.default is inspect.Parameter.empty else f"`{p.default!r}`"
            desc = descriptions.get(pname, "").replace("|", "\\|")
            kind = _annotation(p.annotation).replace("|", "\\|")
            valid = f"`{bounds[pname]}`" if pname in bounds else ""
            lines.append(f"| `{pname}` | `{kind}` | {default} | {valid} | {desc} |")
    else:
        lines.append("No parameters.")
    lines.append("")
    return lines


def _render_registry(key: str, registry: Registry, titles: Mapping[str, tuple[str, str]]) -> list[str]:
    title, signature = titles.get(key, (registry.kind, ""))
    lines = [f"## {title}", ""]
    lines.append(f"Registry `{key}` ({registry.kind})." + (f" Signature: `{signature}`." if signature else ""))
    if registry.runtime:
        names = ", ".join(f"`{n}`" for n in registry.runtime)
        lines.append(f"Runtime arguments (supplied by the trainer, not config): {names}.")
    lines.append("")
    for name in registry.names():
        lines += _render_entry(registry, name)
    return lines


def _render_provenances() -> list[str]:
    lines = [
        "## Token provenances",
        "",
        "Where each completion token came from (`mixrl.core.provenance`); terms select their tokens by",
        "these names. Behaviour: `policy` (the rollout's old log-probs), `stored` (log-probs recorded",
        "at sampling time), `unknown` (no importance ratio may be taken).",
        "",
        "| provenance | behaviour | description |",
        "|---|---|---|",
    ]
    for name in prov.provenance_names():
        p = prov.provenance(name)
        lines.append(f"| `{p.name}` | `{p.behaviour}` | {p.description.replace('|', chr(92) + '|')} |")
    lines.append("")
    return lines


def render_components_markdown(registries: Mapping[str, Registry] | None = None,
                               titles: Mapping[str, tuple[str, str]] | None = None) -> str:
    """The text of ``docs/components.md`` for ``registries`` (default: core's), in order; ``titles``:
    ``key -> (section title, signature)`` for registries this module has no title for."""
    lines = [
        "# mixrl components",
        "",
        "<!-- Generated by `mixrl docs components`; do not edit by hand. -->",
        "",
        "Every component below is a small pure function or class, registered by name (tensor math",
        "in `mixrl/core/`, off-policy sources and injections in `mixrl/sources/`). Its config",
        "parameters are its keyword-only parameters; a config may override any of them, and unknown",
        "keys are rejected. Each entry's summary, formula and paper are what the component declares",
        "in its docstring; `{param}` in a formula stands for that parameter's value (`mixrl explain`",
        "fills it in). Notation: `r = exp(clamp(logp - old_logp, -20, 20))` the importance ratio,",
        "`A` the advantage, `p = exp(logp)`, `sg` stop-gradient, `l_t` a per-token loss.",
        "",
    ]
    titles = {**_TITLES, **(titles or {})}
    for key, registry in (REGISTRIES if registries is None else registries).items():
        lines += _render_registry(key, registry, titles)
    lines += _render_provenances()
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":  # the old entry point: refuse loudly rather than write a page without the sources
    sys.exit("docs/components.md also covers mixrl.sources, which mixrl.core does not import; "
             "regenerate it with: mixrl docs components")
