"""Off-policy sources and injections: the registries and the hook points.

A **source** produces off-policy material (expert demonstrations today; a replay buffer, a
teacher model or the policy itself with a hint later). An **injection** decides where that
material enters a generation batch. The trainer calls every injection's hooks at four
named points, in the order TRL runs them:

=====================  ===================================================================
hook                   what it may do
=====================  ===================================================================
``before_generation``  rewrite the prompts about to be generated from
``after_generation``   replace completions before scoring (LUFFY, SFT; hinted regeneration)
``after_rewards``      see the gathered rewards before advantages (refill failed groups)
``after_advantages``   append scored rows with their own provenance (CHORD)
=====================  ===================================================================

Between the first two, ``generation_prefixes`` may give each rollout a prefix to continue
from (Prefix-RFT, POPE, UFT, PrefixRL); it is a method, not a hook point of its own.
One more call, not a batch hook: ``after_forward(ctx, inputs, old_logp)`` runs on the first
optimisation pass over each micro-batch with the behaviour log-probs the policy term uses
for its rollouts (a replay buffer records them there). During ``after_rewards``,
``ctx.batch`` is the scored local batch, which an injection may rewrite in place (refill a
group with past rollouts) while returning the changed global rewards.

Hooks receive an :class:`InjectContext` (what they may know of the trainer: tokenizer,
process, step; never the trainer itself) and return what they were given, changed. Every
row an injection adds or rewrites carries its provenance (:mod:`mixrl.core.provenance`),
per token where it differs within a row, and its behaviour log-probs where they exist.
A source with state (a buffer) implements ``state_dict`` / ``load_state_dict``; the trainer
saves it with each checkpoint.

Registered entries are classes whose keyword-only constructor parameters are their config
parameters (checked like every other component).
"""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from mixrl.core.registry import Registry
from mixrl.errors import ConfigError

SOURCES = Registry("off-policy source")
INJECTIONS = Registry("injection", runtime=("source", "geometry", "seed"))

#: the hook points, in the order the trainer calls them
HOOKS = ("before_generation", "after_generation", "after_rewards", "after_advantages")


@dataclass
class InjectContext:
    """The trainer, as far as an injection may see it (built per generation batch)."""

    tokenizer: Any
    process_index: int
    num_processes: int
    num_generations: int
    max_completion_length: int
    global_step: int
    micro_step: int
    device: torch.device
    tokenize_prompts: Callable[[list], list[list[int]]]
    gather: Callable[[torch.Tensor], torch.Tensor]
    # what an injection that generates more may call (set by the trainer; None in unit tests
    # that do not need them). Every process must call ``generate`` and ``score`` together.
    #: ``generate(prompt_ids) -> (completion_ids, logprobs)``: one completion per prompt, sampled by the policy
    generate: Callable[[list[list[int]]], tuple[list[list[int]], list | None]] | None = None
    #: ``score(inputs, completion_ids) -> [N_global, F]``: reward functions on local rows, gathered
    score: Callable[[list[dict], list[list[int]]], torch.Tensor] | None = None
    #: ``behaviour_logps(prompt_ids, completion_ids) -> per-token log-probs`` of the policy now (no grad)
    behaviour_logps: Callable[[list[list[int]], list[list[int]]], list[list[float]]] | None = None
    #: ``ref_logps(prompt_ids, completion_ids) -> per-token log-probs`` under the reference model (no grad;
    #: set when the run computes reference log-probs, i.e. a term reads ``ref_logp``)
    ref_logps: Callable[[list[list[int]], list[list[int]]], list[list[float]]] | None = None
    #: ``log(key, value)``: a training metric for this generation batch (already global)
    log: Callable[[str, float], None] | None = None
    #: at ``after_rewards``: the first reward function's value per global row (success is read from it)
    primary_rewards: torch.Tensor | None = None
    # teachers (mixrl.sources.teacher): the loaded teacher models and what an injection may do with them
    teachers: list = field(default_factory=list)
    policy: Any = None  # the policy being trained (score it under no_grad only)
    #: env=tools: (end-of-turn id, assistant-header ids) of the chat template, what
    #: :func:`mixrl.core.turns.written_spans` reads a multi-turn expert trajectory's tool turns with; None otherwise
    turn_marks: tuple[int, list[int]] | None = None
    #: local rewards of (input rows, completion ids), no gather: [n] float
    rewards: Callable[[list, list[list[int]]], torch.Tensor] | None = None
    #: sample n completions (token ids, eos included) of one prompt with a model, at the run's temperature
    generate_with: Callable[[Any, list[int], int], list[list[int]]] | None = None
    #: per-token log-probs of completions under a model (no_grad): score_tokens(model, prompt_ids, completion_ids)
    score_tokens: Callable[[Any, list[list[int]], list[list[int]]], list[list[float]]] | None = None
    batch: dict | None = None  # the scored local batch, during after_rewards only
    #: ``prompt_hard(row) -> bool``: the sampler's per-prompt history marks the row's prompt hard
    #: (seen, accuracy estimate below ``sampler.hard_below``); None without a sampler
    prompt_hard: Callable[[dict], bool] | None = None
    #: the policy's context length in tokens (``max_position_embeddings``): a context an injection
    #: builds must leave room for ``max_completion_length`` new tokens within it; None: unknown
    max_positions: int | None = None
    #: ``policy_calls(who) -> PolicyCalls``: the policy's generation for a builder configured at ``who``
    #: (:mod:`mixrl.trainer.parts.policy_calls`); None in unit tests that do not need it
    policy_calls: Callable[[str], Any] | None = None
    #: the reference model (frozen; score it under no_grad only), None without a separate one (no KL, or LoRA)
    ref_model: Any = None

    def completion_ids(self, text: str) -> list[int]:
        """Token ids of a written completion, ended by eos and cut to max_completion_length."""
        ids = self.tokenizer(text=text, add_special_tokens=False)["input_ids"]
        return (list(ids) + [self.tokenizer.eos_token_id])[: self.max_completion_length]


@dataclass
class Rollouts:
    """The local completions of one generation batch, one entry per row.

    ``row_source``: provenance code of each row; ``token_source``: per-token codes where a
    row mixes provenances (None: every token has its row's); ``behaviour_logp``: per-token
    log-probs recorded at sampling time for ``stored`` provenances (None: none recorded).
    ``guided``: per row, 0 for a free rollout, 1 for one continued from a prefix, 2 for one
    generated with a hint (held out of the unguided ``accuracy``); ``prompt_ids``: the
    prompts the rows are trained under (the trainer's own list: an injection that trains a
    row under another prompt replaces its entry); ``discarded_tokens``: the length of every
    completion the policy generated for this batch that is no longer in it (a failed group
    regenerated with a hint), so the rollout budget counts it.
    """

    completion_ids: list[list[int]]
    logprobs: list | None
    row_source: list[int]
    token_source: list[list[int] | None] = field(default_factory=list)
    behaviour_logp: list[list[float] | None] = field(default_factory=list)
    guided: list[int] = field(default_factory=list)
    prompt_ids: list[list[int]] | None = None
    discarded_tokens: list[int] = field(default_factory=list)

    def __post_init__(self):
        n = len(self.completion_ids)
        self.token_source = self.token_source or [None] * n
        self.behaviour_logp = self.behaviour_logp or [None] * n
        self.guided = self.guided or [0] * n


class Source:
    """Base of registered sources: off-policy material for injections to place.

    ``provenances``: what its material is (config validation checks that a term trains on it).
    ``reads_expert_column``: whether it reads the training data's ``expert`` column (mapped from
    ``data.expert_column``); when no configured source does, that column may be absent from the data.
    """

    provenances: tuple[str, ...] = ()
    reads_expert_column: bool = False
    #: what :meth:`prepare` changed that a user should know (e.g. pairs dropped); printed once
    #: by ``mixrl train`` before the run starts
    notes: tuple[str, ...] = ()

    def prepare(self, train_ds, data_cfg) -> Any:
        """Called once before training with the training dataset; returns the dataset to
        train on (a source may drop or annotate rows). ``mixrl train`` calls it before the run
        directory exists (:func:`mixrl.trainer.build.prepare_inputs`), so its ``DataError`` is
        one line and leaves nothing behind."""
        return train_ds

    def texts(self) -> list[str]:
        """Every text this source puts in front of the tokenizer beyond the training rows'
        prompt, answer and expert columns (after :meth:`prepare`): its own data file's
        prompts and completions, a template's literal text. The character check (and the tiny
        model's vocabulary) covers them as it covers the training rows."""
        return []

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class Injection:
    """Base of registered injections: every hook passes its input through unchanged."""

    #: True when every completion is written by the source (the trainer skips generation)
    skips_generation = False
    #: False for an injection that places nothing from a source (config validation reads it)
    needs_source = True
    #: provenances of the tokens it puts in the batch (None: its source's); config validation
    #: checks that a term trains on each, except those in ``may_leave_untrained``
    provenances: tuple[str, ...] | None = None
    may_leave_untrained: tuple[str, ...] = ()
    #: True when it generates completions beyond the rollouts (``ctx.generate``); the trainer
    #: then adds the completions it discarded (``Rollouts.discarded_tokens``) to the rollout budget
    may_generate_more = False
    #: True when its state is large (a buffer): saved with torch.save, one file per process
    state_in_file = False
    #: True when ``after_advantages`` appends rows (with their own advantages) to the batch; a
    #: learned critic (``algo.critic``) values rows at scoring time and refuses such an injection
    appends_rows_after_advantages = False

    def __init__(self, *, source: Source | None = None, geometry: Any = None, seed: int = 0):
        self.source = source
        self.geometry = geometry
        self.seed = seed  # the run's seed, for injections that draw

    def texts(self) -> list[str]:
        """Text the injection itself adds to prompts or completions (a hint template's literal
        text), for the character check; see :meth:`Source.texts`."""
        return []

    def check_budget(self, max_completion_length: int) -> None:
        """Config time: refuse (one-line ConfigError) settings whose writing cannot fit
        ``trainer.max_completion_length`` (called by :func:`mixrl.config.rules.validate_rules`)."""

    def before_generation(self, ctx: InjectContext, inputs: list[dict]) -> list[dict]:
        return inputs

    def generation_prefixes(self, ctx: InjectContext, inputs: list[dict]) -> list[list[int]] | None:
        """Token ids each local row's rollout continues from (``[]``: none), or None for no
        prefixes. Called once per generation batch, between ``before_generation`` and the
        generation itself; the prefix tokens join the completion with their own provenance."""
        return None

    def after_generation(self, ctx: InjectContext, inputs: list[dict], rollouts: Rollouts) -> Rollouts:
        return rollouts

    def after_rewards(self, ctx: InjectContext, inputs: list[dict], rewards: torch.Tensor) -> torch.Tensor:
        return rewards

    def after_advantages(self, ctx: InjectContext, inputs: list[dict], out: dict) -> dict:
        return out

    def after_forward(self, ctx: InjectContext, inputs: dict, old_logp: torch.Tensor) -> None:
        """First optimisation pass over a micro-batch: ``old_logp`` [B, T] are the behaviour
        log-probs of its rollout rows (the policy that sampled them)."""

    def state_dict(self) -> dict:
        return self.source.state_dict() if self.source is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.source is not None:
            self.source.load_state_dict(state)

    # what the injection adds per optimizer step, for the batch geometry and explain
    def extra_rows_per_step(self, rollouts_per_step: int, unit: int) -> int:
        """Rows added beside the rollouts each optimizer step (all processes)."""
        return 0


@SOURCES.register("none")
class NoSource(Source):
    """No off-policy material: pure on-policy training.

    Formula: (nothing)
    """


@INJECTIONS.register("none")
class NoInjection(Injection):
    """Nothing enters the batch but the policy's own rollouts.

    Formula: group(x) = {y_1..y_G ~ pi_old(.|x)}
    """

    needs_source = False


def check_template(template: Any, fields: tuple[str, ...], key: str, example: str) -> str:
    """``template`` as a ``str.format`` template that uses only the named ``fields``; raises ConfigError naming ``key`` otherwise: an unknown or
    positional placeholder (``{answer}``, ``{}``), a conversion or format spec, or an unmatched
    brace would otherwise fail mid-run with a KeyError, IndexError or ValueError. Literal braces
    are written doubled (``{{`` and ``}}``)."""

    if not isinstance(template, str):
        raise ConfigError(f"{key} must be a string, got {template!r}; e.g. {key}={example!r}")
    allowed = ", ".join("{" + f + "}" for f in fields)
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ConfigError(f"{key}={template!r} is not a valid template ({e}); write a literal brace as {{{{ or }}}}, "
                          f"placeholders: {allowed}") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in fields:
            what = "a positional placeholder {}" if name == "" else f"an unknown placeholder {{{name}}}"
            raise ConfigError(f"{key}={template!r} has {what}; it may use only {allowed} "
                              "(write a literal brace as {{ or }})")
        if spec or conversion:
            raise ConfigError(f"{key}={template!r}: {{{name}}} takes no conversion or format spec; write it as {{{name}}}")
    return template


def template_text(template: str) -> str:
    """The literal text of a ``str.format`` template (its placeholders removed)."""

    return "".join(literal for literal, _, _, _ in string.Formatter().parse(template))
