"""``docs/methods.md``, generated from the algo presets, the recipes and the suites.

For every method mixrl ships (an algo preset, ``conf/algo/NAME.yaml``): the paper and the
mechanism from the preset's header comment, the objective it composes to (rendered from the
components, as ``mixrl explain`` does), the recipes that use it, and the claims the suites
(``conf/suites/*.yaml``) make about its recipes, each with the latest measured verdict from
``docs/results/<suite>/compare.json`` when that file holds judged claims, else
"not measured yet", and, per recipe with a fidelity ledger (``recipe_info.ledger``,
:mod:`mixrl.config.ledger`), whether it runs as the authors' code or which fields differ and why.

``python -m mixrl.experiments.methods > docs/methods.md`` or ``mixrl docs methods`` writes it; a test
keeps the committed page current.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
import sys
from pathlib import Path

from omegaconf import OmegaConf

from mixrl.config.compose import compose_config, conf_dir, group_options, list_recipe_names
from mixrl.config.ledger import Ledger, ledger_of
from mixrl.config.recipe_index import recipe_summary, recipes_dir
from mixrl.explain.render import objective_equation
from mixrl.sampler import GROUP_FILTERS, PICKERS, ROW_FILTERS
from mixrl.experiments.suites import load_suite, suite_names

HEADER = "# Methods mixrl ships"


def _header_comment(path: Path) -> str:
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(x for x in lines if x)


def split_header(text: str) -> tuple[str, str]:
    """(paper, mechanism) from a preset's header comment: ``NAME (citation): mechanism...`` or
    ``NAME: mechanism``; the mechanism is its first clause (up to '.', ';' or ':' ending it)."""
    paper, rest = text, ""
    m = re.match(r"^[^(:]*\(", text)
    if m:  # NAME ( ... ) with balanced parentheses
        depth, i = 0, m.end() - 1
        for i in range(m.end() - 1, len(text)):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            if depth == 0:
                break
        paper, rest = text[: i + 1], text[i + 1 :].lstrip(":").strip()
    elif ":" in text:
        paper, rest = (s.strip() for s in text.split(":", 1))
    return paper.strip(), _first_clause(rest)


def _first_clause(text: str) -> str:
    """``text`` up to the first '.', ';' or ':' that ends a clause outside parentheses."""
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(ch, 0)
        ends = i + 1 == len(text) or text[i + 1] == " "
        if depth == 0 and ch in ".;:" and ends and i > 0 and (text[i - 1].isalnum() or text[i - 1] in ")]"):
            return text[:i].strip()
    return text.strip()


def abstract_and_reading(text: str) -> list[str]:
    """Bullets for what the paper's abstract fixes and what is mixrl's reading, from a preset's
    header comment sentences ``Abstract fixes: ...`` and ``Our reading: ...`` (none when absent)."""
    fixes = re.search(r"Abstract fixes:\s*(.*?)\s*(?=Our reading:|$)", text)
    reading = re.search(r"Our reading:\s*(.*)$", text)
    out = [f"- **the abstract fixes**: {fixes.group(1)}"] if fixes else []
    return out + ([f"- **our reading**: {reading.group(1).strip()}"] if reading else [])


@lru_cache(maxsize=None)
def _objective(name: str) -> str:
    cfg = compose_config([f"algo={name}"])
    a = cfg.algo
    if a.stages:
        return "stages: " + " -> ".join(f"{s.algo} ({s.max_steps or 'trainer.max_steps'} steps)" for s in a.stages)
    eq = objective_equation(cfg)
    shaped = f" shaped by `{a.shaping.name}` (algo.shaping)" if a.get("shaping") and a.shaping.name != "none" else ""
    return (f"`{eq}`; policy loss `{a.loss.name}`, advantage `{a.advantage.name}`{shaped}, aggregation "
            f"`{a.aggregation.name}`, injection `{a.inject.name}`")


@lru_cache(maxsize=None)
def _recipes_by_algo() -> dict[str, list[tuple[str, str]]]:
    """algo name -> [(recipe, its description and hardware)]."""
    out: dict[str, list[tuple[str, str]]] = {}
    for r in list_recipe_names():  # read from the recipe files (tests/test_recipes_list.py checks them against the composed configs)
        info = recipe_summary(r)
        out.setdefault(str(info["algo"]), []).append((r, f"{info['description']} ({info['hardware']})"))
    return out


def _show(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={_show(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


def recipe_ledger(name: str) -> Ledger | None:
    """The fidelity ledger of a shipped recipe (``recipe_info.ledger``, read from its file), or None."""
    info = OmegaConf.load(recipes_dir() / f"{name}.yaml").get("recipe_info") or {}
    return ledger_of(info, f"recipe {name}: recipe_info.ledger") if info.get("ledger") is not None else None


def fidelity_lines(ledgers: list[tuple[str, Ledger | None]]) -> list[str]:
    """``- **against the authors' code**:`` with one line per recipe that has a ledger: "as the authors'
    code" when every field is the same, else each differing field (authors' value; ours; why). Recipes
    without a ledger are named together at the end; nothing when no recipe has one."""
    have = [(r, led) for r, led in ledgers if led is not None]
    if not have:
        return []
    out = ["- **against the authors' code** (the recipes' fidelity ledgers, `recipe_info.ledger`):"]
    cell = lambda v: _show(v).replace("\n", " ")  # noqa: E731
    for recipe, led in have:
        c = led.counts()
        sources = "; ".join(f"{k}: {v}" for k, v in led.sources.items())
        if not c["differs"]:
            out.append(f"  - `{recipe}`: as the authors' code, all {c['rows']} fields the same (read from {sources})")
            continue
        out.append(f"  - `{recipe}`: {c['differs']} of {c['rows']} fields differ from the authors' code (read from {sources}):")
        out += [f"    - {r.label}: authors {cell(r.authors)}; here {cell(r.ours)}; why: {cell(r.why)}" for r in led.differing()]
    missing = [r for r, led in ledgers if led is None]
    if missing:
        out.append("  - no ledger yet: " + ", ".join(f"`{r}`" for r in missing))
    return out


def _measured(results_root: Path, suite: str) -> list[dict] | None:
    """The judged claims of ``docs/results/<suite>/``, then those of its variants
    ``docs/results/<suite>-*/`` (the same suite run on part of its grid or another budget, e.g.
    ``hard-50steps``), each variant claim tagged with its folder; the first match wins."""
    out = []
    for folder in [results_root / suite, *sorted(results_root.glob(f"{suite}-*"))]:
        p = folder / "compare.json"
        if not p.is_file():
            continue
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        variant = None if folder.name == suite else folder.name
        out += [{**c, "results": variant} for c in data.get("claims") or []]
    return out or None


def _verdict(claim, measured: list[dict] | None) -> str:
    for m in measured or []:
        if (m.get("paper"), m.get("claim"), m.get("method"), m.get("baseline")) == (claim.paper, claim.claim, claim.method, claim.baseline):
            if m.get("verdict") == "not measured":
                continue
            diff = m.get("diff")
            lo, hi = m.get("low"), m.get("high")
            detail = f"difference {diff:.3f}" if isinstance(diff, (int, float)) else ""
            if lo is not None and hi is not None:
                detail += f" [{lo:.3f}, {hi:.3f}]"
            if m.get("p") is not None:
                detail += f", p = {m['p']:.3g}"
            holm = m.get("verdict_holm")
            if holm is not None and m.get("p_holm") is not None:
                detail += f", Holm p = {m['p_holm']:.3g}" + (f", **{holm}** under Holm" if holm != m["verdict"] else "")
            where = f"; in docs/results/{m['results']}" if m.get("results") else ""
            return f"**{m['verdict']}** ({m.get('test', '')}; {detail}{where})"
    return "not measured yet"


def render_methods(results_root: str | Path = "docs/results") -> str:
    results_root = Path(results_root)
    recipes = _recipes_by_algo()
    suites = [load_suite(n) for n in suite_names()]
    claims_by_recipe: dict[str, list[tuple[str, object]]] = {}
    for s in suites:
        for c in s.claims:
            claims_by_recipe.setdefault(c.method, []).append((s.name, c))
    measured = {s.name: _measured(results_root, s.name) for s in suites}
    out = [
        HEADER, "",
        "Generated by `mixrl docs methods` (`python -m mixrl.experiments.methods`) from `conf/algo/*.yaml` (paper, mechanism, "
        "objective), `recipes/` and `conf/suites/*.yaml` (claims). A verdict is the latest measured one in "
        "`docs/results/<suite>/compare.json` (a stated test over seeds, see `mixrl/experiments/stats.py`; with the Holm-adjusted p-value over the suite's claims, and the verdict under Holm where it differs); \"not measured yet\" "
        "when no results file holds it. Do not edit by hand.", "",
    ]
    for name in group_options("algo"):
        paper, mech = split_header(_header_comment(conf_dir() / "algo" / f"{name}.yaml"))
        rs = recipes.get(name, [])
        out += [f"## `{name}`", "",
                f"- **paper**: {paper}",
                f"- **mechanism**: {mech}" if mech else "- **mechanism**: see `conf/algo/" + name + ".yaml`",
                *abstract_and_reading(_header_comment(conf_dir() / "algo" / f"{name}.yaml")),
                f"- **objective**: {_objective(name)}",
                "- **recipes**:" + ("" if rs else f" none (use `algo={name}`)")]
        out += [f"  - `{r}`: {desc}" for r, desc in rs]
        out += fidelity_lines([(r, recipe_ledger(r)) for r, _ in rs])
        claims = [(sname, c) for r, _ in rs for sname, c in claims_by_recipe.get(r, [])]
        if claims:
            out += ["- **claims**:", ""]
            out += ["  | suite | paper | claim | measure | method vs baseline | verdict |", "  |---|---|---|---|---|---|"]
            for sname, c in claims:
                out.append(f"  | {sname} | {c.paper} | {c.claim} | {c.describe()} ({c.better} is better) | "
                           f"`{c.method}` vs `{c.baseline}` | {_verdict(c, measured[sname])} |")
        out.append("")
    out += _sampler_section()
    return "\n".join(out).rstrip() + "\n"


def _sampler_section() -> list[str]:
    """``## Samplers``: each ``conf/sampler`` option (its header comment) and each sampler
    component with its formula and paper (``mixrl.sampler`` registries); samplers compose with every algo."""

    out = ["## Samplers (`sampler=NAME`)", "",
           "Which prompts a step trains on, which generated groups it keeps and which rows train "
           "(`conf/sampler/`, `mixrl/sampler/`); a sampler composes with every algo (`mixrl train algo=grpo sampler=dynamic`).", ""]
    out += [f"- `{name}`: {_header_comment(conf_dir() / 'sampler' / f'{name}.yaml')}" for name in group_options("sampler")]
    out += ["", "Components (`sampler.pick`, `sampler.keep`, `sampler.rows.<label>`):", ""]
    for reg in (PICKERS, GROUP_FILTERS, ROW_FILTERS):
        for name in reg.names():
            d = reg.declaration(name)
            paper = f" ({d['paper'].rstrip('.')})" if d["paper"] else ""
            out.append(f"- {reg.kind} `{name}`: `{reg.formula(name)}`{paper}")
    return out + [""]


def main() -> None:  # pragma: no cover
    sys.stdout.write(render_methods())


if __name__ == "__main__":  # pragma: no cover
    main()
