"""Compare the old hand-written ``math`` reward with the ``math-verify`` one on labelled answers.

    python scripts/compare_math_reward.py                 # prints the summary and the disagreements
    python scripts/compare_math_reward.py --out docs/math_reward_comparison.md

The old reward (mixrl/rewards/{extract,mathnorm,builtin}.py before it was replaced) is loaded
from git (``--old-ref``, the last commit that had it), so nothing of it stays in the package.
Each case is a (completion, gold, label) triple: ``label`` is what a careful grader says
(1 correct, 0 wrong, None ambiguous, e.g. gold 50% vs 0.5). Cases are every spelling of
each answer (correct and wrong) in several completion templates (``\\boxed{}``, ``$...$``
after "final answer", GSM8K's ``####``, plain text, a boxed answer between distractor
numbers), over LaTeX fractions, mixed numbers, radicals, units, degrees, percentages,
intervals, unions, tuples, sets, equations, expressions, matrices, multiple choice and
dollar amounts.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import types
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OLD_REF = "bda3830"  # the last commit with the hand-written math reward

# (category, gold, correct spellings, wrong spellings, ambiguous spellings); "plain" spellings
# also go into the plain-text templates (no LaTeX in them)
ANSWERS = [
    ("integer", "72", ["72", "72.0", "72.00", "072"], ["73", "7.2", "-72", "720"], []),
    ("thousands", "1234", ["1,234", "1234.00"], ["1,243", "123"], []),
    ("thousands-latex", "1234", ["1{,}234", "1\\,234"], ["1{,}243"], []),
    ("fraction", "\\frac{3}{4}", ["\\frac{3}{4}", "\\dfrac{3}{4}", "\\tfrac34", "0.75", "3/4", "\\frac{6}{8}"],
     ["\\frac{4}{3}", "0.7", "\\frac{3}{5}"], []),
    ("negative-fraction", "-\\frac{1}{2}", ["-\\frac12", "-0.5", "\\frac{-1}{2}", "-1/2"], ["\\frac{1}{2}", "0.5"], []),
    ("mixed-number", "2\\frac{1}{2}", ["\\frac{5}{2}", "2.5", "5/2"], ["2", "\\frac{1}{2}"], []),
    ("radical", "\\frac{\\sqrt{3}}{2}", ["\\frac{\\sqrt3}{2}", "\\frac{1}{2}\\sqrt{3}", "\\sqrt{3}/2"],
     ["\\frac{\\sqrt{2}}{2}", "0.866"], []),
    ("radical-simplify", "3\\sqrt{2}", ["\\sqrt{18}", "3 \\sqrt 2", "3\\sqrt{2}"], ["2\\sqrt{3}", "\\sqrt{6}"], []),
    ("units", "10", ["10\\text{ cm}", "10 \\mbox{ cm}", "10\\,\\text{cm}", "10\\text{ centimeters}"], ["100\\text{ cm}", "1\\text{ cm}"], []),
    ("units-plain", "10", ["10 cm", "10 meters"], ["11 cm"], []),
    ("degrees", "90^\\circ", ["90", "90^\\circ", "90^{\\circ}", "90\\text{ degrees}"], ["45^\\circ", "180"], []),
    ("percent", "50\\%", ["50\\%", "50", "50 \\%"], ["25\\%", "5\\%"], ["0.5"]),
    ("percent-gold-plain", "50", ["50\\%", "50"], ["5"], ["0.5"]),
    ("interval", "[1, 3)", ["[1,3)", "[1, 3)", "\\left[1, 3\\right)"], ["(1,3)", "[1,3]", "(1,3]"], []),
    ("interval-union", "(-\\infty, 2] \\cup [5, \\infty)", ["(-\\infty,2]\\cup[5,\\infty)", "(-\\infty, 2] \\cup [5, +\\infty)"],
     ["(-\\infty,2)\\cup(5,\\infty)", "[2, 5]"], []),
    ("interval-inequality", "(2, \\infty)", ["x > 2", "(2,\\infty)"], ["x \\ge 2", "[2,\\infty)"], []),
    ("tuple", "(1, 2)", ["(1,2)", "\\left(1, 2\\right)"], ["(2,1)", "(1,3)"], []),
    ("set", "\\{1, 2, 3\\}", ["\\{3,2,1\\}", "\\{1,2,3\\}"], ["\\{1,2\\}", "\\{1,2,4\\}"], ["1, 2, 3"]),
    ("pi", "9\\pi", ["9\\pi", "\\pi \\cdot 9", "9 \\pi"], ["9", "28.27", "3\\pi"], []),
    ("equation", "x = 3", ["3", "x=3"], ["x=4", "4"], []),
    ("expression", "2x + 1", ["1 + 2x", "2x+1", "x + x + 1"], ["2x-1", "2x"], []),
    ("power", "\\sqrt{2}", ["\\sqrt2", "2^{1/2}", "\\sqrt{2}"], ["2", "\\sqrt{3}"], []),
    ("scientific", "1500", ["1.5 \\times 10^{3}", "1500", "1.5\\cdot 10^3"], ["150", "1.5 \\times 10^{2}"], []),
    ("choice", "B", ["(B)", "\\text{(B)}", "B", "\\text{B}"], ["C", "(A)"], []),
    ("dollars", "18", ["\\$18", "18", "18.00", "\\$18.00"], ["\\$19", "1.8"], []),
    ("thirds", "\\frac{1}{3}", ["\\frac13", "1/3", "\\dfrac{1}{3}"], ["0.33", "0.3"], ["0.333333"]),
    ("matrix", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", ["\\begin{pmatrix}1\\\\2\\end{pmatrix}"],
     ["\\begin{pmatrix}2\\\\1\\end{pmatrix}"], []),
    ("exp", "e^{2}", ["e^2", "e^{2}"], ["2e", "e"], []),
    ("gsm8k-gold", "She sells 16 - 3 - 4 = 9 eggs, 9 * 2 = $18.\n#### 18", ["18", "18.00", "\\$18"], ["9", "16"], []),
    ("math-gold", "Completing the square, $x = \\boxed{5}$.", ["5", "x = 5", "5.0"], ["-5", "25"], []),
]

LATEX_TEMPLATES = {
    "boxed": "We simplify step by step.\n\nThe answer is $\\boxed{{{a}}}$.",
    "final-dollar": "Combining the steps above, the final answer is ${a}$.",
    "boxed-distractors": "First try 7, which fails. So $\\boxed{{{a}}}$. Check: 2 + 2 = 4 holds.",
}
PLAIN_TEMPLATES = {
    "marker": "Natalia adds the numbers: 48 + 24 = 72.\n#### {a}",
    "plain": "Adding it all up, the answer is {a}",
}


def _is_plain(text: str) -> bool:
    return "\\" not in text and "{" not in text and "^" not in text


def cases() -> list[dict]:
    out = []
    for category, gold, good, bad, unsure in ANSWERS:
        for spellings, label in ((good, 1), (bad, 0), (unsure, None)):
            for a in spellings:
                templates = dict(LATEX_TEMPLATES)
                if _is_plain(a):
                    templates.update(PLAIN_TEMPLATES)
                for tname, template in templates.items():
                    out.append({"category": category, "template": tname, "answer": a, "gold": gold,
                                "completion": template.format(a=a), "label": label})
    return out


def _git_show(ref: str, path: str) -> str:
    try:
        return subprocess.run(["git", "show", f"{ref}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        raise SystemExit(f"cannot read {path} at git ref {ref} ({e}); run inside the mixrl git checkout or pass --old-ref") from None


def load_old_reward(ref: str = OLD_REF):
    """The old ``math`` reward built from its three files at ``ref`` (in a private package)."""
    pkg = types.ModuleType("legacy_math")
    pkg.__path__ = []
    sys.modules["legacy_math"] = pkg
    for name in ("extract", "mathnorm"):
        mod = types.ModuleType(f"legacy_math.{name}")
        sys.modules[mod.__name__] = mod
        exec(compile(_git_show(ref, f"mixrl/rewards/{name}.py"), f"{ref}:{name}.py", "exec"), mod.__dict__)
    src = _git_show(ref, "mixrl/rewards/builtin.py")
    src = src.replace("from mixrl.rewards.extract", "from legacy_math.extract").replace("from mixrl.rewards.mathnorm", "from legacy_math.mathnorm")
    src = src.replace("from mixrl.rewards.registry import register_reward", "register_reward = lambda name: (lambda f: f)")
    mod = types.ModuleType("legacy_math.builtin")
    sys.modules[mod.__name__] = mod
    exec(compile(src, f"{ref}:builtin.py", "exec"), mod.__dict__)
    return mod.math_reward()


def compare(old_ref: str = OLD_REF) -> tuple[list[dict], dict]:
    from mixrl.rewards import build_reward  # deferred: imports torch and math-verify

    old, new = load_old_reward(old_ref), build_reward("math")
    rows = cases()
    for r in rows:
        r["old"] = old(prompts=["q"], completions=[r["completion"]], answer=[r["gold"]])[0]
        r["new"] = new(prompts=["q"], completions=[r["completion"]], answer=[r["gold"]])[0]
    labelled = [r for r in rows if r["label"] is not None]
    stats = {
        "cases": len(rows),
        "labelled": len(labelled),
        "old_correct": sum(r["old"] == r["label"] for r in labelled),
        "new_correct": sum(r["new"] == r["label"] for r in labelled),
        "disagree": sum(r["old"] != r["new"] for r in rows),
    }
    return rows, stats


def _md(text: str) -> str:
    return "`" + text.replace("\n", "\\n").replace("|", "\\|").replace("`", "'") + "`"


def report(rows: list[dict], stats: dict, old_ref: str) -> str:
    lab = stats["labelled"]
    lines = [
        "# math reward: hand-written parser vs math-verify",
        "",
        f"Generated by `python scripts/compare_math_reward.py --out docs/math_reward_comparison.md` "
        f"(old reward from git ref `{old_ref}`). {stats['cases']} completions "
        f"({lab} with a clear label, {stats['cases'] - lab} ambiguous) over {len(ANSWERS)} answers x their correct, "
        f"wrong and ambiguous spellings x up to {len(LATEX_TEMPLATES) + len(PLAIN_TEMPLATES)} completion templates.",
        "",
        "| reward | agrees with the label |",
        "|---|---|",
        f"| old (hand-written) | {stats['old_correct']}/{lab} ({stats['old_correct'] / lab:.1%}) |",
        f"| new (math-verify) | {stats['new_correct']}/{lab} ({stats['new_correct'] / lab:.1%}) |",
        "",
        f"They disagree on {stats['disagree']} completions.",
        "",
        "## Per category (labelled cases: old right / new right / n)",
        "",
        "| category | old | new | n |",
        "|---|---|---|---|",
    ]
    per = defaultdict(Counter)
    for r in rows:
        if r["label"] is None:
            continue
        c = per[r["category"]]
        c["n"] += 1
        c["old"] += r["old"] == r["label"]
        c["new"] += r["new"] == r["label"]
    for cat, c in per.items():
        lines.append(f"| {cat} | {c['old']} | {c['new']} | {c['n']} |")
    lines += ["", "## Disagreements", "", "| category | template | answer | gold | label | old | new | right |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["old"] == r["new"]:
            continue
        right = "?" if r["label"] is None else ("new" if r["new"] == r["label"] else "old")
        label = "?" if r["label"] is None else int(r["label"])
        lines.append(f"| {r['category']} | {r['template']} | {_md(r['answer'])} | {_md(r['gold'])} | {label} | "
                     f"{r['old']:.0f} | {r['new']:.0f} | {right} |")
    lines += ["", "## Both wrong (same score, against the label)", "", "| category | template | answer | gold | label | score |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r["label"] is not None and r["old"] == r["new"] != r["label"]:
            lines.append(f"| {r['category']} | {r['template']} | {_md(r['answer'])} | {_md(r['gold'])} | {int(r['label'])} | {r['new']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-ref", default=OLD_REF, help="git ref with the old mixrl/rewards/mathnorm.py")
    ap.add_argument("--out", type=Path, help="write the markdown report here (default: print it)")
    args = ap.parse_args(argv)
    rows, stats = compare(args.old_ref)
    text = report(rows, stats, args.old_ref)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        sys.stdout.write(text)
    print(f"{stats['cases']} cases; old right {stats['old_correct']}/{stats['labelled']}, "
          f"new right {stats['new_correct']}/{stats['labelled']}; {stats['disagree']} disagreements", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
