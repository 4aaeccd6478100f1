"""mixrl.core: pure tensor math (losses, weights, advantages, regularisers, schedules).

Imports only torch and the standard library. Importing this package registers every
component in its registry:

======================  ================================  ===================
registry                 kind                              module
======================  ================================  ===================
``POLICY_LOSSES``        policy loss                       ``policy_base`` (the registry), ``clip_losses``,
                                                           ``reinforce_losses``, ``sequence_losses``,
                                                           ``cov_losses``, ``gmpo``, ``offpolicy_reinforce``,
                                                           ``vespo``, ``stability_losses`` (all but the last
                                                           re-exported by ``policy_losses``)
``TOKEN_WEIGHTS``        token weight                      ``token_weights``
``AGGREGATIONS``         aggregation                       ``aggregation``
``ADVANTAGES``           advantage                         ``advantages``, ``reinforce_pp``, ``gae``, ``turn_advantages``,
                                                           ``process_advantages``
``SHAPINGS``             advantage shaping                 ``advantage_shaping``
``KL_ESTIMATORS``        KL estimator                      ``regularizers``
``SCHEDULES``            schedule                          ``schedules``
``CONTROLLERS``          controller                        ``controllers``, ``stability_controllers``
``VALUE_LOSSES``         value loss (the critic's)         ``gae``
======================  ================================  ===================
"""

from mixrl.core import (  # noqa: F401  (import = registration)
    advantage_shaping,
    aspo,
    advantages,
    aggregation,
    alol,
    calibrl,
    clip_losses,
    controllers,
    cov_losses,
    distill,
    egpo,
    entropic_shaping,
    gae,
    gepo,
    gmpo,
    offpolicy_reinforce,
    palu,
    polychromic,
    policy_base,
    policy_losses,
    preference,
    preference_losses,
    process_advantages,
    provenance,
    regularizers,
    reinforce_losses,
    reinforce_pp,
    rlplus,
    schedules,
    sequence_losses,
    srpo,
    stability_controllers,
    stability_losses,
    turn_advantages,
    turns,
    tempsamp,
    terms,
    token_weights,
    uis1,
    unio4,
    vespo,
)
from mixrl.core.advantage_shaping import SHAPINGS
from mixrl.core.advantages import ADVANTAGES
from mixrl.core.aggregation import AGGREGATIONS, aggregate
from mixrl.core.controllers import CONTROLLERS, BapoClipController, EntropicController
from mixrl.core.gae import VALUE_LOSSES, gae_advantage_return
from mixrl.core.policy_losses import POLICY_LOSSES, PolicyLossOutput
from mixrl.core.registry import ComponentParamError, Registry, UnknownComponentError
from mixrl.core.regularizers import (
    KL_ESTIMATORS,
    entropy_bonus,
    kl_penalty,
    teacher_kl,
)
from mixrl.core.schedules import SCHEDULES, describe_schedule, resolve_schedule
from mixrl.core.terms import TERMS
from mixrl.core.token_weights import TOKEN_WEIGHTS, luffy_shaped_ratio

#: every registry, keyed by the name used in docs and config groups
REGISTRIES: dict[str, Registry] = {
    "policy_loss": POLICY_LOSSES,
    "token_weight": TOKEN_WEIGHTS,
    "aggregation": AGGREGATIONS,
    "advantage": ADVANTAGES,
    "advantage_shaping": SHAPINGS,
    "kl_estimator": KL_ESTIMATORS,
    "schedule": SCHEDULES,
    "controller": CONTROLLERS,
    "term": TERMS,
    "value_loss": VALUE_LOSSES,
}

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "CONTROLLERS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "REGISTRIES",
    "SCHEDULES",
    "SHAPINGS",
    "TERMS",
    "TOKEN_WEIGHTS",
    "VALUE_LOSSES",
    "BapoClipController",
    "ComponentParamError",
    "EntropicController",
    "PolicyLossOutput",
    "Registry",
    "UnknownComponentError",
    "aggregate",
    "describe_schedule",
    "entropy_bonus",
    "gae_advantage_return",
    "kl_penalty",
    "luffy_shaped_ratio",
    "resolve_schedule",
    "teacher_kl",
]
