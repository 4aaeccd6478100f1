"""The variants the step-time benchmark times, and how each is built: the mixrl trainer through
``mixrl.trainer.build.trainer_from_config`` (the assembly ``mixrl train`` uses), plain
``trl.GRPOTrainer`` with the ``GRPOConfig`` mixrl builds for the same config, and the bare
torch + transformers floor (:class:`FloorLoop`). :mod:`bench.memory` and :mod:`bench.vllm_steps`
build their trainers here too.

Completion lengths are passed explicitly (``generation_kwargs=``): ``--lengths fixed`` gives
:func:`fixed_lengths` (eos suppressed until ``max_completion_length``), so every variant does
the same work every step whatever its weights; ``None`` keeps the config's generation (stop at eos).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.timer import StepTimer

VARIANTS = ("trl", "grpo", "chord", "floor", "prefix", "hint", "replay", "teacher",
            "grpo-budget", "grpo-pf", "grpo-pf-budget", "chord-budget", "chord-pf", "chord-pf-budget")
DEFAULT_VARIANTS = ("trl", "grpo", "chord", "floor")
#: the default of --lengths variable (bench.varlen): every batching of grpo and chord beside TRL and the floor
VARLEN_VARIANTS = ("trl", "grpo", "grpo-budget", "grpo-pf", "grpo-pf-budget", "chord", "chord-budget", "chord-pf",
                   "chord-pf-budget", "floor")
#: variants that are a mixrl algo of another name
ALGO = {"prefix": "prefixrl", "hint": "guide", "replay": "remix", "teacher": "kdrl"}
DESCRIPTIONS = {
    "trl": "plain trl.GRPOTrainer (loss_type=dapo)",
    "grpo": "mixrl algo=grpo (MixrlGRPOTrainer)",
    "chord": "mixrl algo=chord (rollouts + expert SFT rows)",
    "floor": "bare torch + transformers loop",
    "prefix": "mixrl algo=prefixrl (every rollout continues from a prefix of the expert solution)",
    "hint": "mixrl algo=guide (groups whose rollouts all fail are generated again with a hint)",
    "replay": "mixrl algo=remix (replayed past rollouts beside the fresh ones; half the fresh rollouts per step)",
    "teacher": "mixrl algo=kdrl (grpo + reverse KL to the built-in teacher, one teacher forward per batch)",
    # bench.varlen: the same algos, batched otherwise
    "grpo-budget": "mixrl algo=grpo, padded rows in token-budget micro-batches",
    "grpo-pf": "mixrl algo=grpo, padding-free (packed) rows",
    "grpo-pf-budget": "mixrl algo=grpo, padding-free rows in token-budget micro-batches",
    "chord-budget": "mixrl algo=chord, padded rows in token-budget micro-batches",
    "chord-pf": "mixrl algo=chord, padding-free (packed) rows",
    "chord-pf-budget": "mixrl algo=chord, padding-free rows in token-budget micro-batches",
}


#: every benchmark's runs: no progress bar, no held-out evaluation, no checkpoints
BASE_OVERRIDES = ("logger.progress=false", "trainer.eval_size=0", "trainer.save_steps=0")


def run_overrides(sets: list[str], model: str | None = None, device: str = "cpu") -> list[str]:
    """The config overrides of every variant of a run: :data:`BASE_OVERRIDES`, the user's ``--set``
    values, then ``--model`` and ``--device cuda`` (which therefore win over a ``--set`` of the same key)."""
    return [*BASE_OVERRIDES, *sets, *([f"model.path={model}"] if model else []),
            *(["hardware.device=cuda"] if device == "cuda" else [])]


def fixed_lengths(cfg) -> dict:
    """``--lengths fixed``: every completion has max_completion_length tokens (eos suppressed until
    then, HF ``min_new_tokens``), so every variant does the same work every step whatever its weights."""
    return {"min_new_tokens": int(cfg.trainer.max_completion_length)}


def lengths_kwargs(cfg, lengths: str) -> dict | None:
    """The generation kwargs for ``--lengths fixed`` or ``sampled`` (None: the config's own)."""
    if lengths not in ("fixed", "sampled"):
        raise ValueError(f"lengths must be 'fixed' or 'sampled', not {lengths!r}")
    return fixed_lengths(cfg) if lengths == "fixed" else None


def algo_of(variant: str) -> str:
    """The mixrl algo a variant's config is composed for (``trl`` and ``floor`` use grpo's)."""
    from bench.varlen import base_and_overrides  # deferred: imports torch

    variant = base_and_overrides(variant, 0)[0]
    return "grpo" if variant in ("trl", "floor") else ALGO.get(variant, variant)


def compose(algo: str, overrides: list[str], steps: int):
    """The config of one variant: ``algo``, the run's overrides and ``trainer.max_steps=steps``
    (for grpo, TRL's advantage eps 1e-4, so mixrl grpo and plain TRL compute the same numbers)."""
    from mixrl.config.compose import compose_config  # deferred: imports torch (the config and CLI layers stay light until a run is built)

    extra = ["algo.advantage.eps=1e-4"] if algo == "grpo" else []  # TRL's eps: same numbers as the trl variant
    return compose_config([f"algo={algo}", *overrides, *extra, f"trainer.max_steps={steps}"])


def build_mixrl_trainer(cfg, out_dir: Path, callbacks: list, *, generation_kwargs: dict | None = None):
    """A MixrlGRPOTrainer built from a config with the assembly ``mixrl.trainer.run.train`` uses
    (``generation_kwargs``: extra kwargs of every generate call, e.g. :func:`fixed_lengths`)."""
    from mixrl.trainer import build  # deferred: the trainer imports torch and TRL
    from mixrl.trainer.callbacks import MetricsJsonlCallback  # deferred: imports torch (the config and CLI layers stay light until a run is built)

    return build.trainer_from_config(
        cfg, run_dir=out_dir, callbacks=[MetricsJsonlCallback(out_dir / "metrics.jsonl"), *callbacks],
        generation_kwargs=generation_kwargs,
    )


def build_trl_trainer(cfg, out_dir: Path, callbacks: list, *, generation_kwargs: dict | None = None):
    """Plain ``trl.GRPOTrainer`` with the GRPOConfig mixrl builds for the same config."""
    from transformers import PrinterCallback  # deferred: transformers loads only when a model is built or measured
    from trl import GRPOTrainer  # deferred: TRL loads only when a trainer is built

    from mixrl.config.geometry import geometry  # deferred: imports torch (the config and CLI layers stay light until a run is built)
    from mixrl.trainer import build  # deferred: the trainer imports torch and TRL

    geom = geometry(cfg)
    model_path = build.resolve_model_path(cfg, progress=False)
    tokenizer = build.load_tokenizer(model_path, cfg)
    reward_funcs, reward_weights = build.build_reward_funcs(cfg)
    args = build.grpo_args(cfg, out_dir, geom)
    args.reward_weights = reward_weights
    args.generation_kwargs = generation_kwargs
    args.loss_type = "dapo"  # token-mean over every completion token of the step (mixrl: aggregation token-mean)
    args.epsilon = args.epsilon_high = float(cfg.algo.loss.get("clip_low", 0.2))
    args.scale_rewards = "group"  # (r - mean_g) / (std_g + 1e-4): mixrl's grpo advantage (eps set to 1e-4)
    trainer = GRPOTrainer(model=model_path, reward_funcs=reward_funcs, args=args, train_dataset=build.load_train_rows(cfg),
                          processing_class=tokenizer, callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)
    return trainer


class FloorLoop:
    """The same work as one GRPO step, written directly with torch + transformers."""

    def __init__(self, cfg, timer: StepTimer, steps: int, device: str, out_dir: Path, *,
                 generation_kwargs: dict | None = None):
        import torch  # deferred: torch loads only when something is measured (`--help` and the report stay light)
        from transformers import AutoModelForCausalLM, GenerationConfig, Trainer  # deferred: transformers loads only when a model is built or measured

        from mixrl.config.geometry import geometry  # deferred: imports torch (the config and CLI layers stay light until a run is built)
        from mixrl.trainer import build  # deferred: the trainer imports torch and TRL

        self.cfg, self.timer, self.steps, self.device = cfg, timer, steps, device
        self.geom = geometry(cfg)
        path = build.resolve_model_path(cfg, progress=False)
        self.tok = build.load_tokenizer(path, cfg)
        self.rows = build.load_train_rows(cfg).to_list()
        self.reward_fn = build.build_reward_funcs(cfg)[0][0]
        args = build.grpo_args(cfg, out_dir, self.geom)  # the same optimizer, sampling and clipping settings
        self.args = args
        dtype = None if cfg.model.dtype == "auto" else getattr(torch, cfg.model.dtype)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
        self.model.train()
        opt_cls, opt_kwargs = Trainer.get_optimizer_cls_and_kwargs(args, self.model)
        self.opt = opt_cls(self.model.parameters(), weight_decay=args.weight_decay, **opt_kwargs)
        self.gen = GenerationConfig(
            max_new_tokens=args.max_completion_length, do_sample=True, pad_token_id=self.tok.pad_token_id,
            bos_token_id=self.tok.bos_token_id, eos_token_id=[self.tok.eos_token_id], temperature=args.temperature,
            top_p=args.top_p, top_k=args.top_k, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
            cache_implementation=args.cache_implementation, disable_compile=True, **(generation_kwargs or {}),
        )
        self.clip = float(cfg.algo.loss.get("clip_low", 0.2))
        g = torch.Generator().manual_seed(int(cfg.seed))
        self.order = torch.randperm(len(self.rows), generator=g).tolist()
        self.autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bool(args.bf16))
        self.lengths = None  # --lengths variable: a bench.varlen.LengthDraw (its k-th draw cuts the k-th rollout)

    def rollout(self, step: int) -> dict:
        import torch  # deferred: torch loads only when something is measured (`--help` and the report stay light)

        P, G = self.geom.prompts_per_step, self.geom.num_generations
        batch = [self.rows[self.order[(step * P + i) % len(self.rows)]] for i in range(P)]
        # a chat model's prompts are messages: its chat template, as TRL applies it
        texts = [r["prompt"] if isinstance(r["prompt"], str) else
                 self.tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in batch]
        enc = self.tok(texts, return_tensors="pt", padding=True, padding_side="left").to(self.device)
        prompt_ids = enc["input_ids"].repeat_interleave(G, 0)
        prompt_mask = enc["attention_mask"].repeat_interleave(G, 0)
        with torch.no_grad(), self.autocast:
            out = self.model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=self.gen)
        completion_ids = out[:, prompt_ids.shape[1]:]
        is_eos = completion_ids == self.tok.eos_token_id
        first = torch.where(is_eos.any(1), is_eos.int().argmax(1), completion_ids.shape[1])
        completion_mask = (torch.arange(completion_ids.shape[1], device=self.device)[None] <= first[:, None]).int()
        if self.lengths is not None:
            from bench.varlen import cut_tensor  # deferred: imports torch

            completion_ids, completion_mask = cut_tensor(completion_ids, completion_mask, self.lengths.draw(step - 1, len(completion_ids)),
                                                         self.tok.eos_token_id, self.tok.pad_token_id)
        texts = self.tok.batch_decode(completion_ids.masked_fill(completion_mask == 0, self.tok.pad_token_id), skip_special_tokens=True)
        kwargs = {k: [r[k] for r in batch for _ in range(G)] for k in batch[0] if k != "prompt"}
        rewards = torch.tensor([float(x or 0.0) for x in self.reward_fn(prompts=[r["prompt"] for r in batch for _ in range(G)],
                                                                        completions=texts, **kwargs)], device=self.device)
        grouped = rewards.view(P, G)
        adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)
        return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
                "completion_mask": completion_mask, "advantages": adv}

    def train_step(self, batch: dict) -> None:
        import torch  # deferred: torch loads only when something is measured (`--help` and the report stay light)

        n_tokens = batch["completion_mask"].sum().clamp(min=1)
        M = self.geom.micro_batch_size
        C = batch["completion_ids"].shape[1]
        for s in range(0, batch["completion_ids"].shape[0], M):
            ids = torch.cat([batch["prompt_ids"][s:s + M], batch["completion_ids"][s:s + M]], 1)
            att = torch.cat([batch["prompt_mask"][s:s + M], batch["completion_mask"][s:s + M]], 1)
            mask = batch["completion_mask"][s:s + M].float()
            with self.autocast:
                logits = self.model(input_ids=ids, attention_mask=att, logits_to_keep=C + 1, use_cache=False).logits
            logits = logits[:, :-1].float() / self.args.temperature
            logp = torch.log_softmax(logits, -1).gather(-1, batch["completion_ids"][s:s + M].unsqueeze(-1)).squeeze(-1)
            ratio = torch.exp(logp - logp.detach())
            a = batch["advantages"][s:s + M].unsqueeze(1)
            loss = -torch.min(ratio * a, ratio.clamp(1 - self.clip, 1 + self.clip) * a)
            ((loss * mask).sum() / n_tokens).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def train(self) -> None:
        try:
            for step in range(1, self.steps + 1):
                self.timer.begin(step)
                batch = self.timer.rollout(lambda s=step: self.rollout(s))()
                self.train_step(batch)
                self.timer.end()
        finally:
            self.timer.turns.done(self.timer.name)


def build_variant(name: str, cfg, timer: StepTimer, *, steps: int, device: str, out_dir: Path,
                  generation_kwargs: dict | None):
    """The runner of one variant (``.train()`` runs its ``steps`` steps), timed by ``timer``:
    its step hooks and its rollout phase (``_generate_and_score_completions``)."""
    if name == "floor":
        return FloorLoop(cfg, timer, steps, device, out_dir, generation_kwargs=generation_kwargs)
    builder = build_trl_trainer if name == "trl" else build_mixrl_trainer
    trainer = builder(cfg, out_dir, [timer.callback()], generation_kwargs=generation_kwargs)
    trainer._generate_and_score_completions = timer.rollout(trainer._generate_and_score_completions)
    if name != "trl":
        timer.trainer = trainer  # its batch/padding_fraction per step
    return trainer
