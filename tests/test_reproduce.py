"""`mixrl reproduce toy` runs its grid as separate training processes, then compares."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mixrl.experiments.reproduce import TOY_RECIPES, job_overrides, reproduce_toy


def test_every_toy_recipe_composes_for_every_seed(tmp_path):
    from mixrl.config.compose import compose_config

    for recipe in TOY_RECIPES:
        cfg = compose_config(job_overrides(recipe, 2, tmp_path, []))
        assert cfg.seed == 2 and cfg.trainer.eval_every == 10
        assert cfg.run_dir.endswith(recipe.replace("/", "-") + "-s2")


@pytest.mark.slow
def test_reproduce_runs_the_grid_resumes_and_compares(tmp_path, fast_overrides):
    extra = [o for o in fast_overrides if not o.startswith("run_dir=")]
    recipes = ("grpo/arith-tiny", "sft/arith-tiny")
    logs = []
    result = reproduce_toy(tmp_path, seeds=[0], jobs=2, extra=extra, recipes=recipes, log=logs.append)
    for r in recipes:
        summary = json.loads((tmp_path / "runs" / f"{r.replace('/', '-')}-s0" / "summary.json").read_text())
        assert summary["steps"] == 2
    table = (tmp_path / "compare.md").read_text()
    assert "grpo/arith-tiny" in table and "sft/arith-tiny" in table
    assert json.loads((tmp_path / "reproduce.json").read_text())["seeds"] == [0]
    assert result["compare"].endswith("compare.md")
    # a second call finds every run done and only compares again
    logs.clear()
    reproduce_toy(tmp_path, seeds=[0], jobs=1, extra=extra, recipes=recipes, log=logs.append)
    assert "(2 already done)" in logs[0] and len(logs) == 1


def test_no_seeds_is_a_one_line_error(tmp_path):
    from mixrl.errors import ConfigError

    with pytest.raises(ConfigError, match="--seeds N with N >= 1"):
        reproduce_toy(tmp_path, seeds=[], jobs=1)


# --------------------------------------------------------------------------- suites
def test_shipped_suites_load_and_compose(tmp_path):
    from mixrl.config.compose import compose_config
    from mixrl.experiments.suites import load_suite, suite_names

    assert {"toy", "hard"} <= set(suite_names())
    toy = load_suite("toy")
    assert toy.recipes == list(TOY_RECIPES) and toy.seeds == 3
    hard = load_suite("hard")
    assert hard.seeds == 5 and len(hard.methods) >= 8
    assert {"luffy/arith-tiny", "luffy/authors-arith-tiny"} <= set(hard.recipes)
    assert all(c.method in hard.recipes and c.baseline in hard.recipes for c in hard.claims)
    assert all(c.paper and "arXiv" not in c.paper for c in hard.claims)  # titles, no ids
    cfg = compose_config(job_overrides("luffy/authors-arith-tiny", 4, tmp_path, hard.overrides))
    assert list(cfg.data.levels) == [3, 4, 5, 6] and cfg.trainer.eval_samples == 32 and cfg.seed == 4
    assert cfg.algo.loss.name == "reinforce" and cfg.algo.aggregation.max_len == cfg.trainer.max_completion_length


def test_every_shipped_claim_quotes_its_paper():
    """A suite claims only what its paper says: every claim of conf/suites/ carries the paper's words
    in double quotes and where they are ((abstract), (Section ...), (Table ...))."""
    from mixrl.experiments.claims import QUOTE
    from mixrl.experiments.suites import load_suite, suite_names

    claims = [(name, c) for name in suite_names() for c in load_suite(name).claims]
    assert len(claims) >= 40
    missing = [f"{name}: {c.claim}" for name, c in claims if not c.quote]
    assert not missing, f"claims without the paper's words (add quote: '\"...\" (abstract)'): {missing}"
    assert all(QUOTE.match(c.quote) for _, c in claims)


@pytest.mark.parametrize("text, match", [
    ("methods: {a: grpo/nope}\n", "unknown recipe 'grpo/nope'"),
    ("methods: {a: grpo/arith-tiny}\nseeds: 0\n", "seeds must be an integer >= 1"),
    ("methods: {a: grpo/arith-tiny}\ncolour: red\n", "unknown key"),
    ("methods: {a: grpo/arith-tiny}\nclaims: [{paper: P, claim: c, method: a, baseline: b}]\n", "baseline 'b' is not a method"),
    ("seeds: 2\n", "'methods' must map labels"),
    ("methods: {a: grpo/arith-tiny}\noverrides: [trainer.max_steps]\n", "key=value"),
    ("methods: {a: grpo/arith-tiny}\nclaims: [{paper: P, claim: c, quote: somewhere it says so, method: a, baseline: a}]\n",
     "quote must be the paper's words in double quotes"),
])
def test_bad_suites_are_one_line_errors(tmp_path, text, match):
    from mixrl.errors import ConfigError
    from mixrl.experiments.suites import load_suite

    p = tmp_path / "s.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match) as e:
        load_suite(p)
    assert "\n" not in str(e.value)


def test_cli_reproduce_unknown_suite_or_method_exits_2(tmp_path):
    from typer.testing import CliRunner

    from mixrl.cli.main import app

    res = CliRunner().invoke(app, ["reproduce", "hrad", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "unknown suite 'hrad'" in res.output and "hard" in res.output
    res = CliRunner().invoke(app, ["reproduce", "hard", "--only", "grpo,lufy", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "'lufy' is not a method of suite hard" in res.output


@pytest.mark.slow
def test_reproduce_suite_runs_compares_and_judges(tmp_path, fast_overrides):
    from mixrl.experiments.reproduce import reproduce_suite

    suite = tmp_path / "mini.yaml"
    suite.write_text(
        "name: mini\ntitle: Mini suite\nseeds: 2\njobs: 2\n"
        "methods: {grpo: grpo/arith-tiny, sft: sft/arith-tiny}\n"
        "overrides: [trainer.eval_samples=2, 'trainer.eval_pass_at=[1,2]']\n"
        "compare: {metric: accuracy, target: 0.1}\n"
        "claims:\n  - {paper: Some Paper, claim: GRPO beats SFT, method: grpo, baseline: sft, metric: pass@2}\n"
    )
    extra = [o for o in fast_overrides if not o.startswith("run_dir=")]
    out = tmp_path / "out"
    result = reproduce_suite(suite, out, extra=extra, log=lambda *_: None, plots=False)
    readme = (out / "README.md").read_text()
    assert readme.startswith("# Mini suite") and "**Command:**" in readme and "commit:" in readme
    assert "| grpo | `grpo/arith-tiny` | 0, 1 | 2 |" in readme and "## Claims" in readme and "GRPO beats SFT" in readme
    assert "runs in this folder: 4 (4 trained by this command" in readme and "| 2 of 2 |" in readme
    assert "**Not the suite's full grid:** overrides beyond the suite's: `trainer.max_steps=2`" in readme
    (claim,) = result["claims"]
    assert claim["n_a"] == claim["n_b"] == 2
    assert claim["verdict"] in ("agrees", "disagrees", "not resolved at this budget")
    meta = json.loads((out / "reproduce.json").read_text())
    assert meta["seeds"] == [0, 1] and meta["methods"] == {"grpo": "grpo/arith-tiny", "sft": "sft/arith-tiny"}
    assert meta["run_cpu_seconds"] > 0
    summary = json.loads((out / "runs" / "grpo-arith-tiny-s0" / "summary.json").read_text())
    assert summary["generated_tokens"] > 0 and "pass@2/level1" in summary["eval_after"]
    # the runs of one seed share the starting model's evaluation: one cache entry per seed
    assert len(list((out / "runs" / "eval_before_cache").glob("*.json"))) == 2
    sft = json.loads((out / "runs" / "sft-arith-tiny-s0" / "summary.json").read_text())
    assert sft["eval_before"] == summary["eval_before"]


# --------------------------------------------------------------------------- where reproduce writes
def test_reproduce_writes_a_fresh_folder_by_default_never_docs_results(tmp_path, monkeypatch):
    """Without --out, `mixrl reproduce` writes under runs/reproduce/SUITE-<time>/ (committed results stay untouched)."""
    from typer.testing import CliRunner

    import mixrl.experiments.reproduce
    from mixrl.cli.main import app

    calls = []

    def fake(suite, out_dir, **kw):
        calls.append(Path(out_dir))
        out_dir.mkdir(parents=True)
        (out_dir / "compare.md").write_text("# table\n")
        return {"compare": str(out_dir / "compare.md")}

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(mixrl.experiments.reproduce, "reproduce_suite", fake)
    res = CliRunner().invoke(app, ["reproduce", "toy", "--only", "grpo", "--seeds", "1"])
    assert res.exit_code == 0, res.output
    (out,) = calls
    assert out.parent == Path("runs/reproduce") and out.name.startswith("toy-") and "docs" not in out.parts
    assert f"writing to {out}" in " ".join(res.output.split())
    res = CliRunner().invoke(app, ["reproduce", "toy", "--out", "mine"])
    assert res.exit_code == 0 and calls[-1] == Path("mine")


def test_default_out_dir_is_stamped():
    from datetime import datetime, timezone

    from mixrl.experiments.reproduce import default_out_dir

    when = datetime(2026, 11, 25, 9, 8, 7, tzinfo=timezone.utc)
    assert default_out_dir("hard", when) == Path("runs/reproduce/hard-20261125-090807")


def _meta(runs, now, extra=(), seeds=(0,)):
    return {"command": "mixrl reproduce toy", "commit": "abc", "machine": "m", "date": "d", "grid_seconds": 12,
            "jobs": 2, "methods": {"grpo": "grpo/arith-tiny"}, "seeds": list(seeds), "overrides": list(extra),
            "extra_overrides": list(extra), "suite_methods": 7, "suite_seeds": 3, "trained_now": now, "runs": runs,
            "run_cpu_seconds": 20}


def test_readme_describes_the_runs_in_the_folder_and_how_the_grid_is_partial():
    from mixrl.experiments.reproduce import render_readme
    from mixrl.experiments.suites import load_suite

    toy = load_suite("toy")
    runs = [{"run": "grpo-arith-tiny-s0", "label": "grpo", "recipe": "grpo/arith-tiny", "seed": 0, "steps": 2, "wall_seconds": 7.4},
            {"run": "sft-arith-tiny-s0", "label": "sft", "recipe": "sft/arith-tiny", "seed": 0, "steps": 2, "wall_seconds": 3.1}]
    text = render_readme(toy, _meta(runs, ["grpo-arith-tiny-s0"], extra=["trainer.max_steps=2"]), "# compare\nbody")
    assert ("**Not the suite's full grid:** 2 of the suite's 7 methods; 1 of its 3 seeds; "
            "overrides beyond the suite's: `trainer.max_steps=2`") in text
    assert "runs in this folder: 2 (1 trained by this command in 12 s" in text and "1 found already done" in text
    assert "the runs' own wall times add up to 10 s" in text
    assert "| grpo | `grpo/arith-tiny` | 0 | 2 | 7 s | 1 of 1 |" in text
    assert "| sft | `sft/arith-tiny` | 0 | 2 | 3 s | 0 of 1 |" in text
    assert "body" in text


def test_readme_of_the_full_grid_has_no_partial_line():
    from mixrl.experiments.reproduce import render_readme
    from mixrl.experiments.suites import load_suite

    toy = load_suite("toy")
    runs = [{"run": f"{r.replace('/', '-')}-s{s}", "label": toy.label(r), "recipe": r, "seed": s, "steps": 60, "wall_seconds": 10}
            for r in toy.recipes for s in range(3)]
    text = render_readme(toy, _meta(runs, [r["run"] for r in runs], seeds=(0, 1, 2)), "# compare\nbody")
    assert "Not the suite's full grid" not in text and "runs in this folder: 21 (21 trained" in text
