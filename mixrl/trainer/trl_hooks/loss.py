"""The training step's work: the loss of one micro-batch, the token-budget step, the step's token metrics.

Owns nothing: it reads and writes the trainer handed in (``t``, a
:class:`~mixrl.trainer.grpo.MixrlGRPOTrainer`): its parts (forwards, packing, controller,
injections, critic, budget), its objective, the generation batch's normalisers, the running
optimizer step's token and second counters (``t.step_tally``), and TRL's
micro-step counter ``_step``, step time and ``_metrics`` (listed in :mod:`mixrl.trainer.trl_contract`).
Called by the trainer's ``_compute_loss`` and ``training_step``.
"""

from __future__ import annotations

import contextlib
import time

import torch

from mixrl.core.objective import compute_objective
from mixrl.core.token_budget import padding_fraction
from mixrl.trainer.magnitude import check_step
from mixrl.trainer.parts.token_budget import forward_tokens


def first_pass(t) -> bool:
    """Is this micro-batch seen for the first time (not a later ``num_iterations`` pass)?"""
    generate_every = t.args.steps_per_generation * t.num_iterations
    return t._step % generate_every < t.args.steps_per_generation


def _before_objective(t, model, inputs, logps, micro: int, parts: int) -> None:
    """Training: the step's token counts, the controller's step start, the injections' ``after_forward``."""
    p = t.parts
    real, total = forward_tokens(inputs, collective=p.forwards.collective, packed=p.packing.applies(model))
    t.step_tally.tokens[0] += real
    t.step_tally.tokens[1] += total
    if p.controller is not None:
        p.controller.step_start(logps, inputs, micro_step=micro, accumulation=parts)
    if p.injections and first_pass(t):
        # the rollouts' behaviour log-probs, exactly what the policy term divides by
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        p.injections.after_forward(t._context(), inputs, old)


def compute_loss(t, model, inputs) -> torch.Tensor:
    """One forward per kind of row, then ``mixrl.core.compute_objective``; a controller may set knobs
    first. The terms' metrics go to TRL's ``_metrics`` (``loss/*`` scaled to the whole step)."""
    mode = "train" if t.model.training else "eval"
    p = t.parts
    if mode == "train" and t.step_tally.begin[0] != t.state.global_step:
        t.step_tally.begin = (int(t.state.global_step), int(t._step))
    logps, entropies = p.forwards.by_row_kind(model, inputs)
    # the micro-batch's place in its optimizer step: TRL's micro-step, or the token-budget micro-batch in flight
    micro, parts = t.step_tally.chunk or (t._step, t.current_gradient_accumulation_steps)
    if mode == "train":
        _before_objective(t, model, inputs, logps, micro, parts)
    knobs = p.controller.knobs() if (p.controller is not None and mode == "train") else None
    loss, metrics = compute_objective(
        t.objective,
        logp=logps,
        mask=inputs["completion_mask"],
        advantages=inputs["advantages"],
        token_source=inputs["token_source"],
        old_logp=inputs.get("old_per_token_logps"),
        behaviour_logp=inputs.get("behaviour_logp"),
        ref_logp=inputs.get("ref_per_token_logps"),
        teacher_logp=inputs.get("teacher_logp"),
        teacher_entropy=inputs.get("teacher_entropy"),
        engine_logp=inputs.get("sampling_per_token_logps"),  # what vLLM reported when it sampled each token
        entropies=entropies,
        step=t.state.global_step,
        normalisers=t.batch_in_flight.normalisers if mode == "train" else None,
        knobs=knobs,
        row_fields={k: v for k, v in inputs.items() if k.startswith(("pair_", "calib_"))} or None,  # pair links, CalibRL's baseline
        turn_ids=inputs.get("turn_id"),  # multi-turn rows: the policy's turns (turn-level losses)
    )
    if mode == "train":
        check_step(t.spec.magnitude, inputs, metrics, step=int(t.state.global_step) + 1,
                   learning_rate=float(t.args.learning_rate))  # out of bounds: stop (mixrl.trainer.magnitude)
        if p.controller is not None:
            last = micro == parts - 1 if t.step_tally.chunk else t.accelerator.sync_gradients
            p.controller.step_end(metrics, sync_gradients=last)
        if p.critic is not None:
            t._log(mode, p.critic.train_step(inputs))
    if p.controller is not None:
        metrics.update(p.controller.metrics())
    # loss/* parts are partial sums over this micro-batch: scale so TRL's mean over
    # micro-batches reports the whole step's value
    parts = parts if mode == "train" else 1
    for key, value in metrics.items():
        t._metrics[mode][key].append(value * parts if key.startswith("loss/") else value)
    return loss


def budget_step(t, model, inputs) -> torch.Tensor:
    """One optimizer step's rows (TRL's ``_prepare_inputs`` of a one-micro-step step) in token-budget
    micro-batches: forward and backward each (gradients synchronised after the last one only),
    TRL's ``training_step`` bookkeeping once. Returns the step's loss (the micro-batches' sum)."""
    began = time.perf_counter()
    model.train()
    if hasattr(t.optimizer, "train") and callable(t.optimizer.train):
        t.optimizer.train()
    inputs = t._prepare_inputs(inputs)
    chunks = t.parts.budget.chunks(inputs)
    total = None
    try:
        for i, chunk in enumerate(chunks):
            t.step_tally.chunk = (i, len(chunks))
            sync = i == len(chunks) - 1
            with contextlib.nullcontext() if sync else t.accelerator.no_sync(model):
                with t.compute_loss_context_manager():
                    loss = t.compute_loss(model, chunk)
                t.accelerator.backward(loss)
            total = loss.detach() if total is None else total + loss.detach()
    finally:
        t.step_tally.chunk = None
    t._step += 1  # TRL's micro-step counter and step time, as GRPOTrainer.training_step keeps them
    t._current_train_step_time += time.perf_counter() - began
    if t._step % t.current_gradient_accumulation_steps == 0:
        t._metrics["train"]["step_time"].append(t._current_train_step_time)
        t._current_train_step_time = 0.0
    return total


def log_step_tokens(t) -> None:
    """``batch/padding_fraction`` (padding over all tokens of the step's loss forwards, all
    processes) and ``batch/trained_tokens_per_second`` (their real tokens, all processes, over
    the seconds this process spent in the step's training outside generation and scoring)."""
    counts = torch.tensor(t.step_tally.tokens, dtype=torch.long, device=t.accelerator.device)
    real, total = (int(x) for x in t.accelerator.reduce(counts, reduction="sum"))
    seconds = t.step_tally.seconds[0] - t.step_tally.seconds[1]
    t._metrics["train"]["batch/padding_fraction"].append(padding_fraction(real, total))
    if seconds > 0:
        t._metrics["train"]["batch/trained_tokens_per_second"].append(real / seconds)
    t.step_tally.tokens = [0, 0]
    t.step_tally.seconds = [0.0, 0.0]
