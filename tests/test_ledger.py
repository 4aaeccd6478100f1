"""The fidelity ledger (mixrl.config.ledger): its validation, its drift check, and every shipped
recipe's ledger against the config the recipe resolves to (so a ledger cannot drift from what runs)."""

from __future__ import annotations

import copy

import pytest
from omegaconf import open_dict

from mixrl.config.compose import compose_config, recipes_dir
from mixrl.config.ledger import FIELDS, drift, ledger_of, render_differences, render_markdown
from mixrl.config.recipe_index import recipe_summary
from mixrl.errors import ConfigError

SOURCES = {"authors": "someone/somerepo@0123456789abcdef0123456789abcdef01234567"}


def _full(**override) -> dict:
    """A ledger with one 'same' row per field, each checking trainer.learning_rate (5e-5 on the default)."""
    rows = [{"field": f, "authors": 5e-5, "source": "authors train.sh:1", "ours": {"trainer.learning_rate": 5e-5},
             "verdict": "same"} for f in FIELDS]
    ledger = {"sources": dict(SOURCES), "rows": rows}
    ledger.update(override)
    return {"ledger": ledger}


def test_a_complete_ledger_is_read_and_counted():
    led = ledger_of(_full())
    assert led.counts() == {"rows": len(FIELDS), "same": len(FIELDS), "differs": 0}
    assert ledger_of({"name": "x"}) is None


@pytest.mark.parametrize("mutate, message", [
    (lambda l: l["rows"].pop(), "has no row for evaluation"),
    (lambda l: l["rows"][0].update(verdict="similar"), "must be same or differs"),
    (lambda l: l["rows"][0].update(field="lr"), "is not a ledger field"),
    (lambda l: l["rows"][0].update(ours="the same lr"), "must be config keys -> values"),
    (lambda l: l["rows"][0].update(verdict="differs"), "say why"),
    (lambda l: l["rows"][0].update(source="elsewhere train.sh:1"), "must start with a name from the ledger's sources"),
    (lambda l: l["sources"].update(authors="someone/somerepo"), "owner/repo@COMMIT"),
    (lambda l: l["sources"].update(authors="pypi:transformers"), "pypi:PACKAGE==VERSION"),
    (lambda l: l["rows"][0].pop("authors"), "must have keys field, authors"),
])
def test_a_malformed_ledger_is_refused_in_one_line(mutate, message):
    info = _full()
    mutate(info["ledger"])
    with pytest.raises(ConfigError, match=message) as e:
        ledger_of(info)
    assert "\n" not in str(e.value)


def test_drift_names_each_row_whose_value_is_not_what_runs():
    cfg = compose_config([])
    info = _full()
    assert drift(cfg, ledger_of(info)) == []
    rows = info["ledger"]["rows"]
    rows[0]["ours"] = {"trainer.learning_rate": 1e-6}
    rows[1]["ours"] = {"trainer.no_such_key": 1}
    lines = drift(cfg, ledger_of(info))
    assert lines == ["base_model: trainer.learning_rate is 5e-05, the ledger says 1e-06",
                     "data: trainer.no_such_key is not a config key"]
    # numbers compare as numbers (an int 0 and a float 0.0 are one value), other values exactly
    rows[0]["ours"] = {"trainer.weight_decay": 0, "model.path": "builtin:tiny", "trainer.eval_pass_at": [1, 8, 32]}
    rows[1]["ours"] = {"trainer.learning_rate": 5e-5}
    assert drift(cfg, ledger_of(info)) == []


def test_explain_and_the_page_show_what_differs():
    info = _full()
    row = info["ledger"]["rows"][3]
    row.update(verdict="differs", ours="the whole split", why="the authors' filter script needs the network")
    led = ledger_of(info)
    lines = render_differences(led, compose_config(["trainer.learning_rate=1e-6"]))
    assert lines[0].endswith(f"{len(FIELDS) - 1} the same, 1 differ:")
    assert "  data_size: authors 5e-05; here the whole split (the authors' filter script needs the network)" in lines
    assert sum("changed by your overrides" in l for l in lines) == len(FIELDS) - 1
    page = render_markdown(led)
    assert "**differs**: the authors' filter script needs the network" in page
    assert page.count("\n| ") == len(FIELDS) + 1  # header + one line per row


def _recipes_with_ledgers() -> list[str]:
    root = recipes_dir()
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml")
                  if "\n  ledger:" in p.read_text())


@pytest.mark.parametrize("name", _recipes_with_ledgers())
def test_every_shipped_ledger_matches_the_config_its_recipe_resolves_to(name):
    cfg = compose_config([f"recipe={name}"])
    led = ledger_of(cfg.recipe_info, f"recipe {name}: recipe_info.ledger")
    assert led is not None
    assert drift(cfg, led) == [], f"recipe {name}: the ledger no longer says what runs"
    c = led.counts()
    assert recipe_summary(name)["ledger"] == f"{c['differs']}/{c['rows']} differ"


def test_config_show_leaves_the_ledger_out():
    from mixrl.benchmarks.paper import without_unset

    cfg = compose_config([])
    with open_dict(cfg):
        cfg.recipe_info.ledger = copy.deepcopy(_full()["ledger"])
    assert "ledger" in cfg.recipe_info and "ledger" not in without_unset(cfg).recipe_info


def test_the_optimizer_and_sampling_keys_a_ledger_checks_reach_trl(tmp_path):
    """trainer.adam_epsilon and trainer.top_k (added so that recipes can state the authors' values)
    are what TRL's GRPOConfig receives; the defaults are transformers' eps and TRL's 'no top-k'."""
    from mixrl.trainer.build import grpo_args

    default = grpo_args(compose_config([]), tmp_path)
    assert (default.adam_epsilon, default.top_k) == (1e-8, 0)
    args = grpo_args(compose_config(["trainer.adam_epsilon=1e-6", "trainer.top_k=50", "trainer.adam_beta2=0.999"]), tmp_path)
    assert (args.adam_epsilon, args.top_k, args.adam_beta2) == (1e-6, 50, 0.999)
    with pytest.raises(ConfigError, match="trainer.top_k"):
        compose_config(["trainer.top_k=-1"])
