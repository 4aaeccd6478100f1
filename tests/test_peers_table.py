"""``docs/peers.md`` cannot rot: every overrides cell of its tables composes and validates
(``compose_config``), and every table row has a peer, an option and an overrides cell.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from mixrl.config import compose
from mixrl.config.compose import compose_config
from mixrl.config.schema import GROUPS

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "peers.md"


def _rows() -> list[tuple[str, str, str, str]]:
    rows = []
    for line in DOC.read_text().splitlines():
        if not line.startswith("| ") or line.startswith("| peer ") or set(line) <= set("|- "):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 4, f"a table row needs 4 cells (peer, option, overrides, note): {line}"
        rows.append(tuple(cells))
    return rows


ROWS = _rows()


def _overrides(cell: str) -> list[str]:
    if cell == "—":
        return []
    m = re.fullmatch(r"`([^`]+)`", cell)
    assert m, f"an overrides cell is one code span or '—', got {cell!r}"
    return m.group(1).split()


def test_table_covers_every_peer_and_every_asked_option():
    peers = {r[0] for r in ROWS}
    assert peers == {"verl", "TRL", "Trinity-RFT", "LUFFY"}
    text = DOC.read_text()
    for option in ("seq-mean-token-sum-norm", "loss_mode=cispo", "loss_mode=clip_cov", "adv_estimator=gae",
                   "kl_loss_type=low_var_kl", "loss_type=bnpo", "importance_sampling_level", "top_entropy_quantile",
                   "vllm_importance_sampling_mode", "`sapo`", "`cispo`", "sft_phi cutoff_prob", "off_policy_max_clip",
                   "on_policy_reshape", "p_div_p_0.5"):
        assert option in text, option


@pytest.fixture(scope="module")
def shared_base():
    """Speed (Hydra's composition is ~0.25 s, twice per row): the defaults of a row's group
    overrides (e.g. ``algo=luffy``) are composed by Hydra once per distinct set and copied;
    the row's value overrides are then applied to the copy by Hydra's own override step
    (``ConfigLoaderImpl._apply_overrides_to_config``, what ``hydra.compose`` runs after the
    defaults). Everything else, mixrl's checks included, is ``compose_config`` unchanged."""
    original, memo = compose._compose_raw, {}
    parser = OverridesParser.create()

    def compose_raw(overrides):
        groups = [o for o in overrides if o.split("=", 1)[0] in GROUPS or o.split("=", 1)[0] == compose.RECIPE_GROUP]
        values = [o for o in overrides if o not in groups]
        key = tuple(groups)
        if key not in memo:
            memo[key] = original(list(groups))
        cfg = copy.deepcopy(memo[key])
        if values:
            OmegaConf.set_struct(cfg, True)
            ConfigLoaderImpl._apply_overrides_to_config(parser.parse_overrides(values), cfg)
        return cfg

    compose._compose_raw = compose_raw
    yield
    compose._compose_raw = original


@pytest.mark.parametrize("peer, option, cell", [(r[0], r[1], r[2]) for r in ROWS if r[2] != "—"],
                         ids=[f"{r[0]}:{r[1]}" for r in ROWS if r[2] != "—"])
def test_every_override_in_the_table_composes(peer, option, cell, shared_base):
    overrides = _overrides(cell)
    compose_config(overrides)  # raises ConfigError (one line) for an unknown key, name or value
