"""The learned critic of PPO (``algo.critic`` with ``algo.advantage.name=gae``).

A separate model: a copy of the policy's backbone (initialised from the policy's weights, as
verl and TRL's PPO trainer start their critic) with a scalar head ``nn.Linear(hidden, 1)``
initialised to zero (values start at 0, and the head's construction draws no random numbers),
its own AdamW (``algo.critic.lr``, ``weight_decay``, constant learning rate) and gradient
clipping (``max_grad_norm``). It runs in eval mode (no dropout) on the policy's device.

Once per generation batch, after rewards, :meth:`Critic.advantages` computes
under no_grad the value of every completion token of every local row (on-policy and
off-policy: an expert row gets its GAE advantages from the critic too), builds the per-token
rewards (the row's reward on its last token, a dense reward's list on its tokens:
:mod:`mixrl.rewards.registry`), and replaces the row advantages with GAE's per-token ones
(``mixrl.core.gae``); ``old_values`` and ``returns`` travel with the batch. On every training
micro-batch, :meth:`Critic.train_step` takes one optimizer step on the clipped value
loss over the micro-batch's **on-policy** tokens only (``critic_mask``: off-policy tokens get
values but are never regression targets). Its weights and optimizer state go into every
checkpoint (``CRITIC_FILE``) and come back on resume.

Single process only (validation refuses ``hardware.num_processes > 1``: the critic's gradients
are not averaged over processes).

Paper: Proximal Policy Optimization Algorithms (arXiv:1707.06347); GAE: High-Dimensional
Continuous Control Using Generalized Advantage Estimation (arXiv:1506.02438).

Owns: the value model and its optimizer (shared state: written once, by the saving process).
Receives at construction its config node (``algo.critic`` as a dict), GAE's parameters and the
reward functions with their weights (for dense rewards); per call: the batch and its rewards.
Returns: metrics dicts (``critic/*``); the GAE fields go into the batch it is handed.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from mixrl.core import ADVANTAGES, VALUE_LOSSES, gae_advantage_return
from mixrl.core import provenance as prov
from mixrl.config.critic import VALUE_LOSS
from mixrl.errors import ConfigError
from mixrl.rewards.protocol import DenseOutput



class ValueModel(nn.Module):
    """A causal LM's backbone with a scalar head: ``V(s_t)`` for every position."""

    def __init__(self, backbone: nn.Module, hidden: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, width: int) -> torch.Tensor:
        """The value before each of the last ``width`` tokens (the completion): [B, width], float32."""
        h = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        v = self.head(h.to(self.head.weight.dtype)).squeeze(-1).float()
        return v[:, -width - 1 : -1]


class Critic:
    """The learned critic: values at rollout time, one optimizer step per training micro-batch."""

    def __init__(self, model: ValueModel, optimizer: torch.optim.Optimizer, cfg: dict, *, advantage_params: dict,
                 include_offpolicy: bool, reward_funcs: list, reward_weights: torch.Tensor, batch_size: int,
                 packing=None):
        self.model, self.optimizer, self.cfg = model, optimizer, dict(cfg)
        self.packing = packing  # a mixrl.trainer.parts.packing.Packing: padding-free value forwards (None: padded)
        self.advantage_params = advantage_params
        self.include_offpolicy = bool(include_offpolicy)
        self.reward_funcs, self.reward_weights = list(reward_funcs), reward_weights
        self.batch_size = batch_size

    @classmethod
    def from_policy(cls, cfg: dict, *, policy: nn.Module, device, **kwargs) -> "Critic":
        """A critic whose backbone is a copy of ``policy``'s (unwrapped), on ``device``, with its AdamW."""
        if hasattr(policy, "get_base_model"):
            raise ConfigError("algo.critic with a PEFT (LoRA) policy is not supported; train the full model")
        backbone = copy.deepcopy(policy.base_model)
        hidden = int(policy.config.hidden_size)
        model = ValueModel(backbone, hidden).to(device)
        model.eval()  # no dropout; gradients still flow
        model.requires_grad_(True)
        optimizer = torch.optim.AdamW(model.parameters(), lr=float(cfg.get("lr", 1e-5)),
                                      weight_decay=float(cfg.get("weight_decay", 0.0)))
        return cls(model, optimizer, cfg, **kwargs)

    def values(self, inputs: dict, batch_size: int | None = None) -> torch.Tensor:
        """The critic's value of every completion token [B, T] (with grad: the caller decides)."""
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        width = inputs["completion_ids"].size(1)
        bs = batch_size or ids.size(0)
        out = []
        for i in range(0, ids.size(0), bs):
            v = None
            if self.packing is not None and self.packing.applies(self.model.backbone):
                v = self.packing.values(self.model.backbone, self.model.head, ids[i : i + bs], att[i : i + bs], width)
            out.append(v if v is not None else self.model(ids[i : i + bs], att[i : i + bs], width))
        return torch.cat(out, dim=0)

    def dense_token_rewards(self, n_local: int, mask: torch.Tensor) -> torch.Tensor:
        """The weighted per-token rewards the reward functions returned as lists, [B, T] (0 elsewhere)."""
        dense = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        weights = self.reward_weights.to(mask.device)
        for f, fn in enumerate(self.reward_funcs):
            for row, values in (fn.last_dense if isinstance(fn, DenseOutput) else {}).items():
                n = int(mask[row].sum()) if row < n_local else -1
                if n != len(values):
                    raise RuntimeError(f"a dense reward of row {row} has {len(values)} values for {n} completion tokens "
                                       "(an injection rewrote the row after scoring?)")
                dense[row, :n] += float(weights[f]) * torch.tensor(values, dtype=torch.float32, device=mask.device)
        return dense

    def advantages(self, out: dict, rewards_local: torch.Tensor) -> dict[str, float]:
        """GAE's per-token advantages into ``out["advantages"]``, with ``old_values``, ``returns``
        and ``critic_mask`` (on-policy completion tokens), for the local rows of a generation batch.

        Formula: A_t = sum_l (gamma lam)^l delta_{t+l}, delta_t = r_t + gamma V(s_{t+1}) - V(s_t);
        returns R_t = A_t + V(s_t) (the value loss's targets)."""
        mask = out["completion_mask"].bool()
        with torch.no_grad():
            values = self.values(out, self.batch_size) * mask
        dense = self.dense_token_rewards(rewards_local.shape[0], mask)
        token_rewards = dense.clone()
        length = mask.sum(1)
        rows = torch.nonzero(length > 0).squeeze(1)
        last = (length - 1).clamp(min=0)
        # the row's reward not already given per token (a dense reward's sum is in rewards_local) on its last token
        token_rewards[rows, last[rows]] += rewards_local.float()[rows] - dense.sum(1)[rows]
        on_policy = (out["row_source"] == prov.ON_POLICY) if not self.include_offpolicy else None
        adv = ADVANTAGES.get("gae")(rewards_local, torch.zeros_like(rewards_local), include=on_policy, token_rewards=token_rewards,
                                    values=values, mask=mask, **self.advantage_params)
        gamma, lam = float(self.advantage_params.get("gamma", 1.0)), float(self.advantage_params.get("lam", 0.95))
        _, returns = gae_advantage_return(token_rewards, values, mask, gamma=gamma, lam=lam)
        out["advantages"] = adv
        out["old_values"] = values
        out["returns"] = returns
        out["critic_mask"] = mask & (out["token_source"] == prov.ON_POLICY)
        sel = out["critic_mask"]
        if not sel.any():
            return {}
        return {"critic/values": float(values[sel].mean()), "critic/returns": float(returns[sel].mean())}

    def train_step(self, inputs: dict) -> dict[str, float]:
        """One optimizer step of the critic on the clipped value loss over this micro-batch's on-policy tokens."""
        values = self.values(inputs)
        mask = inputs["critic_mask"]
        loss, clipfrac = VALUE_LOSSES.get(VALUE_LOSS)(values, inputs["old_values"], inputs["returns"], mask,
                                                         clip=self.cfg.get("value_clip", 0.2))
        self.optimizer.zero_grad(set_to_none=True)
        if mask.any():
            loss.backward()
            max_norm = self.cfg.get("max_grad_norm", 1.0)
            if max_norm is not None:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), float(max_norm))
            self.optimizer.step()
        return {"critic/value_loss": float(loss.detach()), "critic/clipfrac": float(clipfrac)}

    # ------------------------------------------------------------------ checkpoints (shared)
    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
