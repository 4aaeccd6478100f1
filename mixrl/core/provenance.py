"""Token provenance: where each completion token came from, and what is known of the
probability it was produced with.

Every completion token of a batch carries a provenance code (``token_source``, [B, T]),
every row a row provenance (``row_source``, [B]: the kind of row, e.g. an expert row or a
rollout). Terms of the objective select their tokens by provenance name. Each provenance
declares its *behaviour* (the distribution the token was drawn from):

* ``policy``: sampled by the policy being trained, as it was when the batch was generated;
  its behaviour log-prob is the rollout's ``old_logp`` (the policy at generation time).
* ``stored``: sampled by another distribution whose per-token log-prob was recorded at
  sampling time (``behaviour_logp``: a replayed rollout, a lagged policy, a hinted prompt).
* ``unknown``: written by someone else (a demonstration); no behaviour probability exists,
  so no importance ratio may be taken on such tokens.

``environment`` marks the tokens of a multi-turn row that no policy wrote (a tool's result,
an environment's observation): they stay in the sequence (later turns attend to them) but no
term selects them, so every loss, KL term, token weight and normaliser leaves them out.

A new source registers its own provenance with :func:`register_provenance` in its module;
codes are given in registration order (the same in every process).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

BEHAVIOURS = ("policy", "stored", "unknown")


@dataclass(frozen=True)
class Provenance:
    name: str
    code: int
    behaviour: str  # policy | stored | unknown
    description: str


_BY_NAME: dict[str, Provenance] = {}


def register_provenance(name: str, *, behaviour: str, description: str) -> Provenance:
    """Register (or return the identical existing) provenance ``name``."""
    if behaviour not in BEHAVIOURS:
        raise ValueError(f"provenance {name!r}: behaviour must be one of {BEHAVIOURS}, got {behaviour!r}")
    old = _BY_NAME.get(name)
    if old is not None:
        if (old.behaviour, old.description) != (behaviour, description):
            raise ValueError(f"provenance {name!r} is registered twice with different declarations")
        return old
    prov = Provenance(name, len(_BY_NAME), behaviour, description)
    _BY_NAME[name] = prov
    return prov


def provenance(name: str) -> Provenance:
    """The registered provenance ``name`` (``KeyError`` with the choices otherwise)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown provenance {name!r}; registered: {', '.join(provenance_names())}") from None


def provenance_names() -> list[str]:
    return list(_BY_NAME)


def code(name: str) -> int:
    return provenance(name).code


def select(token_source: Tensor, names: tuple[str, ...] | list[str]) -> Tensor:
    """Bool [B, T] (or [B]): positions whose provenance is one of ``names``."""
    codes = torch.tensor([code(n) for n in names], dtype=token_source.dtype, device=token_source.device)
    return torch.isin(token_source, codes)


ON_POLICY = register_provenance(
    "on_policy", behaviour="policy", description="sampled by the policy being trained (a rollout)"
).code
EXPERT = register_provenance(
    "expert", behaviour="unknown", description="an off-policy demonstration (behaviour probability unknown)"
).code
ENVIRONMENT = register_provenance(
    "environment", behaviour="unknown",
    description="written by a tool or an environment inside a multi-turn row (a tool result, an observation): never trained",
).code
PATCHED = register_provenance(
    "patched", behaviour="unknown",
    description="an assistant turn an episode injection wrote into an environment's episode (an expert's action "
                "replacing a diverging one, UI-S1's patch): later turns attend to it; trained only by a term that names it",
).code
REACHABLE = register_provenance(
    "reachable", behaviour="policy",
    description="the policy's turns of an earlier episode of its own placed in a failed group (BEPA's cached reachable "
                "trajectory): old log-prob recomputed under the row's prompt, as a rollout's",
).code
