"""The stages of a generation batch after gen: provenance, reward, adv, accounting, teacher, log.

Owns nothing: each stage writes the batch's fields (the table in
:mod:`mixrl.trainer.parts.batch_fields`) and metrics, from the parts it calls. Receives the
trainer ``t`` (a :class:`~mixrl.trainer.grpo.MixrlGRPOTrainer`): its accelerator, objective,
advantage, reward functions, tokenizer, parts, the run's counters (``mixrl_rollouts``,
``mixrl_generated_tokens``) and the batch in flight that the gen stage
(:mod:`mixrl.trainer.trl_hooks.generation`) recorded (``t.batch_in_flight``: rollouts, reward matrix).
"""

from __future__ import annotations

import torch

from mixrl.core import ADVANTAGES
from mixrl.core import provenance as prov
from mixrl.core.advantages import advantage_needs
from mixrl.trainer.generation import engine_sync
from mixrl.trainer.parts.answer_ids import answer_ids
from mixrl.trainer.parts.batch_fields import (
    behaviour_is_policy, behaviour_known, engine_mismatch_metrics, guided_rows, provenance_fields,
)
from mixrl.trainer.parts.token_credit import token_credit_inputs
from mixrl.trainer.parts.turn_credit import local_advantages, turn_inputs, turn_metrics
from mixrl.trainer.sample_log import capture_rows


def stage_provenance(t, out: dict, version: int | None, training: bool, mode: str) -> None:
    """provenance: ``row_source``, ``token_source``, ``behaviour_logp``, ``policy_version``;
    ``engine/*`` metrics, and the weight-sync check when vLLM sampled a training batch."""
    out.update(provenance_fields(out, t.batch_in_flight.rollouts, t._mixrl_turn_marks))
    out.pop("tool_mask", None)  # read into token_source (provenance environment); rows appended later have no entry
    if version is not None:  # the policy version that sampled each row (-1 for rows no policy sampled)
        out["policy_version"] = torch.full_like(out["row_source"], int(version))
    t._log(mode, engine_mismatch_metrics(out, t.objective, mode))
    if training and t.use_vllm:  # vLLM sampled this batch with the weights old_per_token_logps were computed under
        t._log(mode, engine_sync.check(out, accelerator=t.accelerator, tolerance=t.spec.sync_tolerance,
                                       step=t.state.global_step,
                                       own_logps=lambda batch: t.parts.forwards.behaviour_logps(t.model, batch)))


def stage_reward(t, out: dict, inputs, training: bool, mode: str):
    """reward: the weighted rewards, then (training) the injections' and the controller's
    reshaping. Returns the rewards [N_global], the injections' context, and the rows'
    sources as scored (for samples.jsonl)."""
    p = t.parts
    rpf = t.batch_in_flight.rewards_per_func
    rewards = p.scoring.weighted(rpf)
    ctx = t._context()
    ctx.primary_rewards = rpf[:, 0]
    scored_sources = out["row_source"].clone() if training and t.spec.samples is not None else None  # samples.jsonl: rows rewritten after scoring
    if training:
        ctx.batch = out  # an injection may rewrite local rows (refill a group) before advantages
        rewards = p.injections.after_rewards(ctx, inputs, rewards)
        ctx.batch = None
        if p.controller is not None:
            rewards = p.controller.after_rewards(out, rewards, rpf[:, 0])  # PALU's length budget
        if "policy_version" in out:  # rows an injection rewrote (replayed, expert) were not sampled by this run's policy now
            out["policy_version"] = out["policy_version"].masked_fill(out["row_source"] != prov.ON_POLICY, -1)
            if p.async_gen is not None:
                versions = t.accelerator.gather(out["policy_version"]).tolist()
                t._log(mode, p.async_gen.batch_metrics(int(t.state.global_step), versions))
    return rewards, ctx, scored_sources


def _runtime_inputs(t, out: dict, inputs, needs, group_ids, mode: str) -> dict:
    """What the advantage estimator needs beyond rewards and groups (its ``needs``)."""
    runtime = turn_inputs(out, inputs, t.accelerator, needs) if "turn_rewards" in needs else {}  # MT-GRPO: each turn's reward
    if "token_credit" in needs:  # CAPO-style per-token credit of the dense rewards (reward=process)
        runtime |= token_credit_inputs(out, t.reward_funcs, t.reward_weights, t.accelerator)
    if "answer_ids" in needs:  # polychromic: each row's final-answer class (mixrl.trainer.parts.answer_ids)
        runtime["answer_ids"] = answer_ids(out, t.processing_class, t.accelerator)
    if "lengths" in needs:  # completion tokens per row (OPO's baseline, REINFORCE++'s token weights)
        runtime["lengths"] = t.accelerator.gather(out["completion_mask"].sum(dim=1).float())
    if "baseline_rewards" in needs:  # ReMax: the reward of each prompt's greedy completion
        runtime["baseline_rewards"], metrics = t.parts.remax.greedy_rewards(t.model_wrapped, t.generation_config, out, inputs, group_ids)
        t._log(mode, metrics)
    return runtime


def stage_adv(t, out: dict, inputs, rewards: torch.Tensor, training: bool, mode: str):
    """adv: the configured ``mixrl.core`` advantage over the global batch (ReMax's greedy
    baseline and the critic's values when they are on), this process's rows of it.
    Returns the global rows' sources and this process's first global row."""
    p = t.parts
    device = t.accelerator.device
    n_global = rewards.shape[0]
    num_generations = t.num_generations if mode == "train" else t.num_generations_eval
    sources = t.accelerator.gather(out["row_source"])
    group_ids = torch.arange(n_global, device=device) // num_generations
    include = None if t.advantage_include_offpolicy else behaviour_is_policy(sources)
    estimator = ADVANTAGES.get(t.advantage_name)
    runtime = _runtime_inputs(t, out, inputs, advantage_needs(estimator), group_ids, mode)
    advantages = estimator(rewards, group_ids, include=include, **runtime, **t.advantage_params)
    advantages = torch.nan_to_num(advantages, nan=0.0)
    if training and p.shaping is not None:  # algo.shaping: the advantages re-weighted (mixrl.trainer.parts.advantage_shaping)
        advantages, metrics = p.shaping.shape(t.model, out, advantages=advantages, rewards=rewards, group_ids=group_ids, sources=sources,
                                              include=include, rewards_per_func=t.batch_in_flight.rewards_per_func, rows=inputs,
                                              knobs=p.controller.knobs() if p.controller is not None else None)
        t._log(mode, metrics)
    if "turn_rewards" in runtime:
        t._log(mode, turn_metrics(rewards, group_ids, runtime, t.advantage_params, include))
    if training and p.sampler is not None:
        advantages, metrics = p.sampler.filter_rows(rewards, advantages)
        t._log("train", metrics)
    n_local = out["completion_ids"].shape[0]
    start = t.accelerator.process_index * n_local
    out["advantages"] = local_advantages(advantages, start, n_local, out["completion_ids"].shape[1])  # per-token: this batch's width
    out["group_id"] = group_ids[start : start + n_local]
    if training and p.critic is not None:  # GAE's per-token advantages from the critic's values
        t._log(mode, p.critic.advantages(out, rewards[start : start + n_local]))
    if training and p.injections:  # what a replay buffer stores with each rollout
        grouped = rewards.view(-1, num_generations)
        out["mixrl_reward"] = rewards[start : start + n_local].float()
        out["mixrl_group_mean"] = grouped.mean(1).repeat_interleave(num_generations)[start : start + n_local].float()
        out["mixrl_group_std"] = grouped.std(1).nan_to_num(0.0).repeat_interleave(num_generations)[start : start + n_local].float()
    return sources, start


def stage_accounting(t, out: dict, inputs, rewards, sources, ctx, training: bool, mode: str) -> dict:
    """The policy's own accuracy and reward, the rollout counters, then (training) the
    injections' ``after_advantages``. ``sources``: the global rows' ``row_source``."""
    device = t.accelerator.device
    primary = t.batch_in_flight.rewards_per_func[:, 0]
    on = sources == prov.ON_POLICY
    guided = guided_rows(t.batch_in_flight.rollouts, out["completion_ids"].shape[0], device, t.accelerator.gather)
    free = on & (guided == 0)  # rollouts continued from a prefix or generated with a hint are not the policy's own accuracy
    nan = float("nan")  # TRL's logger drops NaN: no on-policy rows (SFT) logs no accuracy
    correct = t.parts.scoring.correct(primary, inputs, out["completion_ids"], out["completion_mask"], gather=t.accelerator.gather)
    t._metrics[mode]["accuracy"].append(float(correct[free].float().mean()) if correct is not None and free.any() else nan)
    scored = free & ~torch.isnan(t.batch_in_flight.rewards_per_func).all(dim=1)  # a row no reward function scored has no reward
    t._metrics[mode]["reward_on_policy"].append(float(rewards[scored].mean()) if scored.any() else nan)
    if not training:
        return out
    inj = t.parts.injections
    t.mixrl_rollouts += int(on.sum())
    local_on = out["row_source"] == prov.ON_POLICY
    sampled = behaviour_known(out["token_source"]) & out["completion_mask"].bool()  # not prefix tokens
    gen = (sampled.float().sum(dim=1) * local_on.float()).sum()
    t.mixrl_generated_tokens += int(t.accelerator.reduce(gen, reduction="sum"))
    discarded = (t.batch_in_flight.rollouts.discarded_tokens if t.batch_in_flight.rollouts is not None else [])
    if inj.may_generate_more:  # a collective: every process or none
        d = t.accelerator.reduce(torch.tensor([len(discarded), sum(discarded)], device=device, dtype=torch.float32), reduction="sum")
        t.mixrl_rollouts += int(d[0])
        t.mixrl_generated_tokens += int(d[1])
    return inj.after_advantages(ctx, inputs, out)


def stage_teacher(teachers, model, out: dict, inputs) -> dict:
    """teacher: ``teacher_logp`` (and SRPO's ``teacher_entropy``) when a term trains on the teachers'
    log-probs (``teachers``: the teacher part, or None). Returns the metrics."""
    if teachers is None or not teachers.tokens:
        return {}
    out["teacher_logp"], entropy, metrics = teachers.logps(model, out, inputs)
    if entropy is not None:
        out["teacher_entropy"] = entropy
    return metrics


def stage_log(t, out: dict, rewards, start: int, scored_sources, training: bool, mode: str) -> None:
    """The rows of each source, the injections' metrics and a few rows for samples.jsonl
    (mixrl.trainer.callbacks.SampleLogCallback)."""
    t._log(mode, rows_per_source(out, t.objective, reduce_sum=lambda x: t.accelerator.reduce(x, reduction="sum")))
    if not training:
        return
    t._log(mode, t.parts.injections.metrics())
    if (tap := t.spec.samples) is not None:
        tap.keep(capture_rows(
            out, tokenizer=t.processing_class, rewards=rewards, rewards_per_func=t.batch_in_flight.rewards_per_func,
            reward_names=list(t.reward_func_names), start=start, n=tap.rows,
            max_chars=tap.chars, n_local_scored=out["completion_ids"].shape[0],
            guided=t.batch_in_flight.rollouts.guided if t.batch_in_flight.rollouts is not None else None, scored_sources=scored_sources,
        ))


def rows_per_source(out: dict, objective, *, reduce_sum) -> dict:
    """``<source>/rows``: rows of each selected off-policy source in the global batch
    (``reduce_sum``: the sum over processes)."""
    metrics = {}
    for name in objective.selected():
        if name != "on_policy":
            has = (out["token_source"] == prov.code(name)).any(dim=1) if out["token_source"].numel() else out["row_source"] == prov.code(name)
            metrics[f"{name}/rows"] = float(reduce_sum(has.sum().float()))
    return metrics
