"""Nash-MD's alternative policy: completions sampled from the geometric mixture of the policy and
the reference, compared with the policy's own rollouts by the run's reward.

Nash-MD ("Nash Learning from Human Feedback", Munos et al., arXiv 2312.00886) plays the policy
pi against an alternative pi^mu, the geometric mixture pi^(1-mu) pi_ref^mu (renormalised), and
moves pi toward the completions the preference model prefers to the mixture's. The mixture of two
autoregressive models is approximated token by token: at each position the next-token log-probs
are log_softmax((1 - mu) z_pi + mu z_ref) for the two models' logits z (the paper's section 7 and
TRL's ``GeometricMixtureWrapper``, which TRL 1.16 no longer ships).

The reference read here is TRL's former ``NashMDTrainer`` (huggingface/trl @
f2cd57710ae345ea6428ae95363267fcf38a3dc8, ``trl/experimental/nash_md/nash_md_trainer.py``:
``GeometricMixtureWrapper.forward`` lines 79-89, the preference ``sigmoid(model_scores -
mixture_scores)`` at line 484, ``_compute_losses`` lines 367-385). Per policy sample y and mixture
sample y' of the same prompt, P = sigmoid(R(y) - R(y')), and TRL's loss is

    L = mean_rows [ beta sum_t sg(log pi(y_t) - log pi_ref(y_t)) log pi(y_t) - (P - 1/2) sum_t log pi(y_t) ]

whose gradient is mean_rows sum_t [beta (log pi - log pi_ref) - (P - 1/2)] grad log pi(y_t).
This module supplies the (P - 1/2): the ``nash_md`` injection sets each rollout's advantage to it,
and the ``nash_md`` preset trains it with the ``reinforce`` loss (-A log pi per token), the k2 KL
(its gradient is beta (log pi - log pi_ref) grad log pi, TRL's KL gradient) and the sequence-sum
aggregation (``seq-mean-token-sum``). The loss value differs from TRL's in the KL part
(beta (log pi - log pi_ref)^2 / 2 instead of beta sg(log pi - log pi_ref) log pi); the gradient is the same.

The mixture is sampled here without a KV cache (TRL's wrapper also turns the cache off), on this
process, with the unwrapped policy and the reference model: not through vLLM, and not with a
sharded (FSDP / ZeRO-3) policy.
"""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F
from torch import Tensor

from mixrl.core import provenance as prov
from mixrl.errors import ConfigError
from mixrl.sources.base import INJECTIONS, InjectContext, Injection


def mixture_logprobs(policy_logits: Tensor, ref_logits: Tensor, coef: float) -> Tensor:
    """Next-token log-probs of the geometric mixture pi^(1-coef) pi_ref^coef, renormalised:
    ``log_softmax((1 - coef) z_pi + coef z_ref)`` over the last dimension (TRL's
    ``GeometricMixtureWrapper.forward``). Equal to the log of the normalised product of the
    two softmaxes raised to (1 - coef) and coef: log_softmax removes the per-row constants."""
    return F.log_softmax((1.0 - coef) * policy_logits.float() + coef * ref_logits.float(), dim=-1)


def _next_logits(model, seq: Tensor) -> Tensor:
    return model(input_ids=seq, attention_mask=torch.ones_like(seq)).logits[:, -1, :]


@torch.no_grad()
def sample_mixture(policy, ref, prompt_ids: list[int], n: int, *, coef: float, temperature: float, max_new_tokens: int,
                   eos_token_id: int, generator: torch.Generator | None = None) -> list[list[int]]:
    """``n`` completions of one prompt sampled token by token from the geometric mixture of
    ``policy`` and ``ref`` at ``temperature`` (the mixture's log-probs divided by it), each ended
    by eos (kept) or cut at ``max_new_tokens``. No KV cache: both models read the whole sequence
    at every position."""
    dev = next(policy.parameters()).device
    seq = torch.as_tensor([list(prompt_ids)] * n, dtype=torch.long, device=dev)
    out: list[list[int]] = [[] for _ in range(n)]
    done = [False] * n
    for _ in range(int(max_new_tokens)):
        z = mixture_logprobs(_next_logits(policy, seq), _next_logits(ref, seq.to(next(ref.parameters()).device)).to(dev), coef)
        tok = torch.multinomial(torch.softmax(z / temperature, dim=-1), 1, generator=generator).squeeze(1)
        for i, t in enumerate(tok.tolist()):
            if not done[i]:
                out[i].append(t)
                done[i] = t == eos_token_id
        if all(done):
            break
        seq = torch.cat([seq, tok.unsqueeze(1)], dim=1)  # finished rows run on; their tokens are not kept
    return out


def nash_md_advantages(policy_rewards: Tensor, mixture_rewards: Tensor) -> Tensor:
    """P - 1/2 per policy sample, P = sigmoid(R(y) - R(y')): the Bradley-Terry probability that
    the policy's completion beats the mixture's, with 1/2 as the control variate (TRL's
    ``score = (probability - 0.5) * sum_t log pi``)."""
    return torch.sigmoid(policy_rewards.float() - mixture_rewards.float()) - 0.5


@INJECTIONS.register("nash_md", bounds={
    "mixture_coef": ("[0, 1]", "the reference's share of the geometric mixture pi^(1-mu) pi_ref^mu; outside [0, 1] it is no mixture"),
    "temperature": ("> 0", "the sampling temperature of the mixture; the run's (trainer.temperature) in the preset"),
})
class NashMD(Injection):
    """Nash-MD's alternative: one completion from the geometric mixture of the policy and the
    reference per rollout, scored with the run's reward; each rollout's advantage becomes the
    probability that it beats its mixture completion, minus 1/2.

    Formula: y' ~ pi_theta^(1-{mixture_coef}) pi_ref^{mixture_coef} (per token: log_softmax((1-mu) z_theta + mu z_ref) / T, T = {temperature}); A(y) = sigmoid(R(y) - R(y')) - 1/2 for each rollout y and its own y' of the same prompt
    Paper: Nash-MD, "Nash Learning from Human Feedback" (Munos et al., arXiv 2312.00886): mirror descent toward the
    Nash equilibrium of the preference game, the policy improved against the mixture of itself and the reference.
    As TRL's former NashMDTrainer (huggingface/trl @ f2cd57710ae345ea6428ae95363267fcf38a3dc8,
    trl/experimental/nash_md/nash_md_trainer.py:79-89, 367-385, 484): the preference oracle is a reward (here the
    run's rule-based reward functions), P = sigmoid(R(y) - R(y')); the loss (preset nash_md) is
    -(P - 1/2) sum_t log pi + beta KL with the KL's REINFORCE gradient.

    Parameters:
        mixture_coef (0.5): mu, the reference's share of the mixture (TRL's mixture_coef).
        temperature (1.0): the mixture's sampling temperature (the preset reads trainer.temperature).
    """

    needs_source = False
    provenances = ()

    def __init__(self, *, mixture_coef: float = 0.5, temperature: float = 1.0, source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        if not 0.0 <= float(mixture_coef) <= 1.0:
            raise ConfigError(f"algo.inject.mixture_coef={mixture_coef} must be in [0, 1] (the reference's share of the mixture)")
        if not float(temperature) > 0:
            raise ConfigError(f"algo.inject.temperature={temperature} must be > 0 (the mixture's sampling temperature)")
        self.mixture_coef, self.temperature = float(mixture_coef), float(temperature)
        self.metrics: dict[str, float] = {}

    def _generator(self, ctx: InjectContext, device) -> torch.Generator:
        seed = random.Random(f"nash_md:{self.seed}:{ctx.process_index}:{ctx.global_step}:{ctx.micro_step}").getrandbits(63)
        return torch.Generator(device=device).manual_seed(seed)

    def after_advantages(self, ctx: InjectContext, inputs: list[dict], out: dict) -> dict:
        if ctx.ref_model is None:
            raise RuntimeError("algo.inject=nash_md samples from the mixture of the policy and the reference model, but the "
                               "trainer has no separate reference model (model.lora.enabled=true?)")
        policy = getattr(ctx.policy, "module", ctx.policy)  # the DDP-unwrapped policy (this process's rows only)
        source = out["row_source"].tolist()
        by_prompt: dict[tuple, list[int]] = {}
        for i in range(min(len(inputs), len(source))):
            if source[i] == prov.ON_POLICY:
                by_prompt.setdefault(tuple(out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist()), []).append(i)
        adv = out["advantages"].clone().float()
        rows, mine, theirs, lengths = [], [], [], []
        gen = self._generator(ctx, next(policy.parameters()).device)
        for prompt, members in by_prompt.items():
            ids = sample_mixture(policy, ctx.ref_model, list(prompt), len(members), coef=self.mixture_coef,
                                 temperature=self.temperature, max_new_tokens=ctx.max_completion_length,
                                 eos_token_id=ctx.tokenizer.eos_token_id, generator=gen)
            theirs.append(ctx.rewards([inputs[i] for i in members], ids).float().cpu())
            mine.append(out["mixrl_reward"][members].float().cpu())
            rows += members
            lengths += [len(x) for x in ids]
        if rows:
            a = nash_md_advantages(torch.cat(mine), torch.cat(theirs))
            idx = torch.tensor(rows, device=adv.device)
            value = a.to(adv.device)
            adv[idx] = value.unsqueeze(-1).expand(-1, *adv.shape[1:]) if adv.dim() > 1 else value
            self.metrics = {"nash_md/preference": float(a.mean() + 0.5), "nash_md/policy_wins": float((a > 0).float().mean()),
                            "nash_md/mixture_reward": float(torch.cat(theirs).mean()),
                            "nash_md/mixture_length": float(sum(lengths) / len(lengths))}
        out["advantages"] = adv.to(out["advantages"].dtype)
        return out


def check_nash_md(cfg) -> None:
    """One-line errors for Nash-MD settings that cannot run: the mixture needs a separate reference model."""
    inject = cfg.algo.get("inject") or {}
    if (inject.get("name") if hasattr(inject, "get") else inject) != "nash_md":
        return
    if bool(cfg.model.get("lora", {}).get("enabled", False)):
        raise ConfigError("algo.inject=nash_md samples from the mixture of the policy and a separate reference model, but with "
                          "model.lora.enabled=true the reference is the adapter-less policy; set model.lora.enabled=false")
    if math.isclose(float(cfg.algo.kl.get("coef", 0.0)), 0.0):
        raise ConfigError("algo.inject=nash_md needs the reference model, which the trainer loads only for algo.kl.coef > 0 "
                          "(Nash-MD's beta); set algo.kl.coef > 0")
