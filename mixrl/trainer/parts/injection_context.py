"""The injections (``mixrl.sources``) and what the trainer offers them: the :class:`~mixrl.sources.base.InjectContext`.

An injection sees the trainer only through this context: the tokenizer, the process layout, the
step counters, and callables to generate with the policy (TRL's own generation path, so vLLM,
sampling settings and EOS handling are the rollouts'), to score completions with the run's reward
functions, to compute the policy's behaviour log-probs, to log a metric, a builder's handle on the
policy (:mod:`mixrl.trainer.parts.policy_calls`: what a self-hint or self-critique is written
with), and the teacher service's callables (:mod:`mixrl.trainer.parts.teacher`). :class:`Injections` holds the
configured injections in order, builds that context, and runs each hook over all of them.

Owns: the injections (their state: a JSON entry each in ``mixrl_state.json``, written once by the
saving process, or, with ``state_in_file`` such as a replay buffer, one ``torch.save`` file per
process). Receives at construction the process layout, TRL's one-completion generation and the
reference log-probs as callables, and the shared parts (``Forwards``, ``Scoring``, teachers,
sampler); per call: the policy as it is now, the step counters and a metric logger.
Returns the hooks' results and the injections' metrics.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mixrl.sources.base import InjectContext
from mixrl.trainer.parts.policy_calls import PolicyCalls


class Injections:
    """The configured injections, in order, and their context."""

    def __init__(self, injections: list, *, tokenizer, process_index: int, num_processes: int, num_generations: int,
                 max_completion_length: int, device, tokenize_prompts: Callable, gather: Callable,
                 generate_one: Callable, gathers_prompts: bool, forwards, scoring, teachers=None, sampler=None,
                 ref_logps: Callable | None = None, max_positions: int | None = None,
                 max_new_tokens: Callable | None = None, ref_model=None):
        self.injections = list(injections)
        self.tokenizer = tokenizer
        self.process_index, self.num_processes = int(process_index), int(num_processes)
        self.num_generations, self.max_completion_length = num_generations, max_completion_length
        self.device = device
        self.tokenize_prompts, self.gather = tokenize_prompts, gather
        self.generate_one = generate_one  # TRL's generation of one completion per prompt: prompts -> (ids, logprobs)
        self.gathers_prompts = bool(gathers_prompts)  # vLLM server mode gathers prompts over processes
        self.forwards, self.scoring, self.teachers, self.sampler = forwards, scoring, teachers, sampler
        self.ref_logps = ref_logps  # (policy, prompt_ids, completion_ids) -> log-probs; None: no reference model
        self.max_positions = max_positions  # the policy's context length (InjectContext.max_positions)
        self.limit_new_tokens = max_new_tokens  # n -> context in which TRL's generation stops after n tokens (None: unlimited)
        self.ref_model = ref_model  # the reference model when the trainer holds a separate one (InjectContext.ref_model)
        self.turn_marks = None  # env=tools: the template's turn marks (set by the trainer), InjectContext.turn_marks

    def use_turn_marks(self, turn_marks: tuple[int, list[int]] | None) -> None:
        """env=tools: the chat template's turn marks (end-of-turn id, assistant-header ids), handed to
        every injection's context so appended expert rows mask their tool turns."""
        self.turn_marks = turn_marks

    def __bool__(self) -> bool:
        return bool(self.injections)

    def __iter__(self):
        return iter(self.injections)

    # ------------------------------------------------------------------ the context
    def context(self, *, policy, global_step: int, micro_step: int, log: Callable, trainer_state=None) -> InjectContext:
        """The :class:`InjectContext` of this moment: ``policy`` as it is now, TRL's step counters."""
        ref = self.ref_logps
        behaviour = lambda p, c: self.forwards.score_token_lists(policy, p, c, is_policy=True)  # noqa: E731
        return InjectContext(
            tokenizer=self.tokenizer,
            process_index=self.process_index,
            num_processes=self.num_processes,
            num_generations=self.num_generations,
            max_completion_length=self.max_completion_length,
            global_step=global_step,
            micro_step=micro_step,
            device=self.device,
            tokenize_prompts=self.tokenize_prompts,
            gather=self.gather,
            generate=self.generate,
            score=self.scoring.gathered,
            behaviour_logps=behaviour,
            ref_logps=(lambda p, c: ref(policy, p, c)) if ref is not None else None,
            log=log,
            teachers=self.teachers.frozen if self.teachers is not None else [],
            policy=policy,
            rewards=lambda rows, ids: self.scoring.local(rows, ids, trainer_state=trainer_state),
            generate_with=self.teachers.sample if self.teachers is not None else None,
            score_tokens=lambda model, p, c: self.forwards.score_token_lists(model, p, c, is_policy=model is policy),
            prompt_hard=self.sampler.hard if self.sampler is not None else None,
            turn_marks=self.turn_marks,
            max_positions=self.max_positions,
            policy_calls=lambda who: PolicyCalls(
                who=who, tokenizer=self.tokenizer, tokenize_prompts=self.tokenize_prompts, generate=self.generate,
                behaviour_logps=behaviour, max_new_tokens=self.max_completion_length, max_positions=self.max_positions,
                limit=self.limit_new_tokens),
            ref_model=self.ref_model,
        )

    def generate(self, prompt_ids: list[list[int]]):
        """``InjectContext.generate``: one completion per prompt, sampled by the policy (TRL's own
        generation path). A process with no prompt skips the call unless vLLM server mode gathers
        prompts over processes, or the policy is sharded (``Forwards.collective``): then it
        generates from a one-token dummy prompt and drops the result, so that it joins every
        forward of the others."""
        if not prompt_ids and not self.gathers_prompts:
            if self.forwards.collective:
                self.generate_one([[self.forwards.dummy_token]])
            return [], None
        return self.generate_one([list(p) for p in prompt_ids])

    # ------------------------------------------------------------------ the hooks, in order
    @property
    def skips_generation(self) -> bool:
        return any(inj.skips_generation for inj in self.injections)

    @property
    def may_generate_more(self) -> bool:
        return any(inj.may_generate_more for inj in self.injections)

    def before_generation(self, ctx: InjectContext, inputs: list[dict]) -> list[dict]:
        for inj in self.injections:
            inputs = inj.before_generation(ctx, inputs)
        return inputs

    def generation_prefixes(self, ctx: InjectContext, inputs: list[dict], n: int) -> list[list[int]] | None:
        """The one injection's per-row prefixes (None when no injection sets any)."""
        found = None
        for inj in self.injections:
            p = inj.generation_prefixes(ctx, inputs)
            if p is None:
                continue
            if found is not None:
                raise RuntimeError("two injections set generation prefixes; configure one")
            if len(p) != n:
                raise RuntimeError(f"{type(inj).__name__}.generation_prefixes returned {len(p)} prefixes for {n} rows")
            found = [list(x) for x in p]
        return found

    def after_generation(self, ctx: InjectContext, inputs: list[dict], rollouts):
        for inj in self.injections:
            rollouts = inj.after_generation(ctx, inputs, rollouts)
        return rollouts

    def after_rewards(self, ctx: InjectContext, inputs: list[dict], rewards: torch.Tensor) -> torch.Tensor:
        for inj in self.injections:
            rewards = inj.after_rewards(ctx, inputs, rewards)
        return rewards

    def after_advantages(self, ctx: InjectContext, inputs: list[dict], out: dict) -> dict:
        for inj in self.injections:
            out = inj.after_advantages(ctx, inputs, out)
        return out

    def after_forward(self, ctx: InjectContext, inputs: dict, old_logp: torch.Tensor) -> None:
        for inj in self.injections:
            inj.after_forward(ctx, inputs, old_logp)

    def metrics(self) -> dict[str, float]:
        """The injections' ``metrics``: a dict one keeps, or a method returning one."""
        out: dict[str, float] = {}
        for inj in self.injections:
            metrics = getattr(inj, "metrics", None)
            for key, value in ((metrics() if callable(metrics) else metrics) or {}).items():
                out[key] = float(value)
        return out

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """``shared``: one entry per injection (its state, or ``{"state_file": ...}`` for one
        whose state is per process); ``per_process``: ``{index: state}`` of those, this process's."""
        return {
            "shared": [{"state_file": f"mixrl_injection{i}"} if inj.state_in_file else inj.state_dict()
                       for i, inj in enumerate(self.injections)],
            "per_process": {i: inj.state_dict() for i, inj in enumerate(self.injections) if inj.state_in_file},
        }

    def load_state_dict(self, state: dict) -> None:
        per_process = state.get("per_process") or {}
        for i, (inj, s) in enumerate(zip(self.injections, state.get("shared") or [])):
            if isinstance(s, dict) and "state_file" in s:
                s = per_process[i]
            inj.load_state_dict(s)
