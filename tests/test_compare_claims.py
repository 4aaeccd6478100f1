"""compare on the hard-regime additions: generated tokens to a target, collapsed runs,
pass@k by level, and claims judged over seeds (numbers checked by hand)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mixrl.experiments.claims import parse_claim, run_value
from mixrl.experiments.compare import compare
from mixrl.experiments.runs import load_run
from mixrl.errors import ConfigError
from mixrl.experiments.stats import AGREES, UNRESOLVED


def make_run(path: Path, *, recipe: str, seed: int, after: dict, before: dict, evals: list[tuple[int, float]],
             steps: int = 20, per_step: int = 100, tokens_per_rollout: int = 10) -> Path:
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({
        "recipe": recipe, "algo": recipe.split("/")[0], "seed": seed, "steps": steps, "rollouts": steps * per_step,
        "generated_tokens": steps * per_step * tokens_per_rollout,
        "eval_before": {**before, "n": 8.0}, "eval_after": {**after, "n": 8.0, "samples": 32.0},
    }))
    (path / "eval.jsonl").write_text("".join(json.dumps({
        "step": s, "rollouts": s * per_step, "generated_tokens": s * per_step * tokens_per_rollout, "accuracy": a,
    }) + "\n" for s, a in evals))
    (path / "config.yaml").write_text(f"seed: {seed}\nalgo: {{name: x}}\n")
    return path


@pytest.fixture
def runs(tmp_path) -> Path:
    root = tmp_path / "runs"
    before = {"accuracy": 0.1, "accuracy/level5": 0.0, "pass@8/level5": 0.0, "pass@8": 0.2}
    # A learns level 5 (final 0.40, 0.42, 0.44); reaches accuracy 0.3 at step 10 (1,000 rollouts, 10,000 tokens)
    for i, acc5 in enumerate((0.40, 0.42, 0.44)):
        make_run(root / f"a{i}", recipe="a/x", seed=i, before=before,
                 after={"accuracy": 0.5, "accuracy/level5": acc5, "pass@8/level5": acc5 + 0.1, "pass@8": 0.6},
                 evals=[(10, 0.3), (20, 0.5)])
    # B does not; seed 2 collapses (best 0.4 at step 10, final 0.1 < 0.2)
    for i, (acc, mid) in enumerate(((0.25, 0.2), (0.2, 0.2), (0.1, 0.4))):
        make_run(root / f"b{i}", recipe="b/x", seed=i, before=before,
                 after={"accuracy": acc, "accuracy/level5": 0.0, "pass@8/level5": 0.0, "pass@8": 0.3},
                 evals=[(10, mid), (20, acc)])
    return root


def test_tokens_collapse_and_levels(runs, tmp_path):
    claims = [
        parse_claim({"paper": "P", "claim": "A beats B on level 5", "method": "a/x", "baseline": "b/x",
                     "metric": "accuracy/level5"}),
        parse_claim({"paper": "P", "claim": "A is faster", "method": "a/x", "baseline": "b/x", "metric": "accuracy",
                     "stat": "rollouts_to", "target": 0.3, "better": "lower"}),
    ]
    res = compare([runs], tmp_path / "out", target=0.3, plots=False, claims=claims)
    rows = {r.method: r for r in res.rows}
    a, b = rows["a/x"], rows["b/x"]
    assert a.tokens_mean == 10_000 and a.tokens_reached == 3
    assert b.tokens_reached == 1 and b.tokens_mean == 10_000  # only seed 2 reached 0.3 (0.4 at step 10)
    assert (a.collapsed, b.collapsed) == (0, 1)
    data = json.loads((tmp_path / "out" / "compare.json").read_text())
    lvl5 = next(e for e in data["by_level"] if e["method"] == "a/x" and e["level"] == "5")
    assert lvl5["measures"]["accuracy"]["after_mean"] == pytest.approx(0.42)
    assert lvl5["measures"]["accuracy"]["before_mean"] == 0.0
    lo, hi = lvl5["measures"]["accuracy"]["after_ci95"]
    # t-interval: 0.42 -+ t_{0.975,2} * 0.02 / sqrt(3), t_{0.975,2} = 4.302653
    assert (lo, hi) == (pytest.approx(0.42 - 4.302653 * 0.02 / 3 ** 0.5, abs=1e-5), pytest.approx(0.42 + 4.302653 * 0.02 / 3 ** 0.5, abs=1e-5))
    assert lvl5["measures"]["pass@8"]["after_mean"] == pytest.approx(0.52)
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "## Held-out accuracy and pass@k by level" in md and "0.000 → 0.420 [" in md
    # claim 1: level-5 accuracy 0.42 vs 0.0 with spread only in A: Welch agrees
    c1, c2 = data["claims"]
    assert c1["verdict"] == AGREES and c1["diff"] == pytest.approx(0.42)
    # claim 2: rollouts to 0.3: A 1000 each; B: 2000 (never, counted at its budget), 2000, 1000
    assert c2["method_values"] == [1000.0] * 3 and sorted(c2["baseline_values"]) == [1000.0, 2000.0, 2000.0]
    assert c2["verdict"] == UNRESOLVED  # B's spread is too large for 3 seeds
    assert "**agrees**" in md and "not resolved at this budget" in md


def test_run_values_per_stat(runs):
    run = load_run(runs / "b2")
    c = dict(paper="P", claim="c", method="b/x", baseline="a/x", metric="accuracy")
    assert run_value(run, parse_claim({**c, "stat": "drop"})) == pytest.approx(0.4 - 0.1)
    assert run_value(run, parse_claim({**c, "stat": "best"})) == pytest.approx(0.4)
    assert run_value(run, parse_claim({**c, "stat": "tokens_to", "target": 0.35})) == 10_000


@pytest.mark.parametrize("bad, match", [
    ({"paper": "P", "claim": "c", "method": "a", "baseline": "b", "stat": "median"}, "stat 'median'"),
    ({"paper": "P", "claim": "c", "method": "a", "baseline": "b", "stat": "rollouts_to"}, "needs a target"),
    ({"paper": "P", "claim": "c", "method": "a"}, "missing baseline"),
    ({"paper": "P", "claim": "c", "method": "a", "baseline": "b", "colour": 1}, "unknown key"),
    ({"paper": "P", "claim": "c", "method": "zzz", "baseline": "b"}, "not a method of the suite"),
])
def test_bad_claims_are_one_line_errors(bad, match):
    with pytest.raises(ConfigError, match=match) as e:
        parse_claim(bad, aliases={"a": "a/x", "b": "b/x"})
    assert "\n" not in str(e.value)


def _runs_to_target(root: Path, recipe: str, steps_reached: list[int | None], budget_steps: int = 20) -> list:
    """Runs of 100 rollouts per step that reach accuracy 0.3 at the given step (None: never)."""
    out = []
    for i, s in enumerate(steps_reached):
        evals = [(k, 0.3 if s is not None and k >= s else 0.1) for k in range(2, budget_steps + 1, 2)]
        out.append(load_run(make_run(root / f"{recipe.replace('/', '-')}{i}", recipe=recipe, seed=i, before={"accuracy": 0.1},
                                     after={"accuracy": evals[-1][1]}, evals=evals, steps=budget_steps)))
    return out


def test_fewer_rollouts_verdict_needs_every_run_of_the_faster_side_to_reach_the_target(tmp_path):
    """A run that never reaches the target counts at its budget (a lower bound): 'fewer
    rollouts' can only be concluded for a side whose runs all reached it."""
    from mixrl.experiments.claims import judge_claims

    claim = parse_claim({"paper": "P", "claim": "c", "method": "m", "baseline": "b", "metric": "accuracy",
                         "stat": "rollouts_to", "target": 0.3, "better": "lower"})
    base = _runs_to_target(tmp_path / "b", "b/x", [18, 18, 20, 18, 20])  # 1,800-2,000 rollouts
    # every method run reaches the target at step 4-6: agrees
    fast = _runs_to_target(tmp_path / "f", "f/x", [4, 4, 6, 4, 6])
    assert judge_claims([claim], {"m": fast, "b": base})[0]["verdict"] == AGREES
    # the same, but one method run never reaches it (counted at its budget: a lower bound, here
    # 10 steps = 1,000 rollouts, still below the baseline): not resolved, and the table says why
    short = fast[:4] + _runs_to_target(tmp_path / "s", "s/x", [None], budget_steps=10)
    row = judge_claims([claim], {"m": short, "b": base})[0]
    assert row["method_values"][-1] == 1000.0 and row["verdict"] == UNRESOLVED
    assert "censored: m did not reach the target in 1/5 runs" in row["test"]
    # neither side reaches the target: the budgets decide nothing
    never_m = _runs_to_target(tmp_path / "nm", "nm/x", [None] * 5, budget_steps=10)
    never_b = _runs_to_target(tmp_path / "nb", "nb/x", [None] * 5, budget_steps=20)
    assert judge_claims([claim], {"m": never_m, "b": never_b})[0]["verdict"] == UNRESOLVED
    # the slower side may be censored: a method that needs more than the baseline still disagrees
    assert judge_claims([claim], {"m": base, "b": fast})[0]["verdict"] == "disagrees"
