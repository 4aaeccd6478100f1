"""Token-budget micro-batches (``trainer.max_tokens_per_micro_batch``, mixrl.core.token_budget and
mixrl.trainer.parts.token_budget): the grouping, the fields of a micro-batch, and the step's gradient,
equal to the fixed-micro-batch step's within 1e-6 in float64 on the pins harness for every
aggregation mode and for preference pairs split across micro-batches."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from mixrl.core.token_budget import completion_lengths, cost, group_rows, padding_fraction
from mixrl.trainer.parts.token_budget import TokenBudget, forward_tokens, take

HERE = Path(__file__).resolve().parent
PIN_MODEL = HERE / "fixtures" / "pin-model"


# --------------------------------------------------------------------------- grouping (pure)
def test_completion_lengths_are_the_last_attended_column():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]])
    assert completion_lengths(mask).tolist() == [2, 4, 0, 3]


def test_padded_groups_stay_within_the_budget_longest_first():
    completion = [5, 30, 2, 12, 12, 7, 1, 30]
    groups = group_rows(completion, 100, prompt_width=10)
    assert sorted(i for g in groups for i in g) == list(range(8))  # every row once
    for g in groups:
        # cost by hand: rows x (P + the group's longest completion)
        assert len(g) * (10 + max(completion[i] for i in g)) <= 100
        assert cost(g, completion, prompt_width=10) == len(g) * (10 + max(completion[i] for i in g))
    # longest first: the two 40-token rows together (80 <= 100), then 22 x 4 = 88, then the rest: 17 x 2 = 34;
    # the micro-batches in order of cost, the heaviest first (its memory peak comes at once)
    assert groups == [[3, 4, 5, 0], [1, 7], [2, 6]]


def test_a_row_over_the_budget_is_its_own_micro_batch():
    groups = group_rows([50, 3, 3], 20, prompt_width=4)
    assert groups[0] == [0]  # 54 tokens > 20: alone
    assert all(len(g) * 7 <= 20 for g in groups[1:])


def test_num_groups_splits_the_heaviest_until_every_process_runs_as_many():
    completion = [4, 4, 4, 4]
    assert len(group_rows(completion, 1000, prompt_width=1)) == 1
    groups = group_rows(completion, 1000, prompt_width=1, num_groups=3)
    assert len(groups) == 3 and sorted(i for g in groups for i in g) == [0, 1, 2, 3]
    assert len(group_rows(completion, 1000, prompt_width=1, num_groups=9)) == 4  # never more than the rows


def test_packed_groups_balance_real_tokens():
    completion, prompt = [9, 1, 8, 2, 5, 5], [1, 1, 1, 1, 1, 1]
    groups = group_rows(completion, 12, prompt_width=99, prompt=prompt, packed=True)
    loads = sorted(sum(completion[i] + 1 for i in g) for g in groups)
    # total 36 tokens, budget 12: ceil(36/12) = 3 micro-batches, LPT gives 10+2 | 9+3 | 6+6
    assert loads == [12, 12, 12]


def test_a_budget_of_a_fixed_micro_batch_never_runs_more_micro_batches():
    # a budget of m x (P + T) tokens holds any m rows (padded or packed): next fit on sorted rows gives
    # at most ceil(n / m) micro-batches, as many as m rows at a time; by hand on a long-tailed draw
    g = torch.Generator().manual_seed(0)
    P, T, n = 12, 64, 128
    completion = (8 * torch.exp(torch.randn(n, generator=g))).round().clamp(1, T).long().tolist()
    prompt = torch.randint(4, P + 1, (n,), generator=g).tolist()
    for m in (1, 3, 16, 32, 128):
        budget = m * (P + T)
        for packed in (False, True):
            groups = group_rows(completion, budget, prompt_width=P, prompt=prompt, packed=packed)
            assert len(groups) <= -(-n // m), (m, packed, len(groups))
            assert sorted(i for gr in groups for i in gr) == list(range(n))
            assert all(cost(gr, completion, prompt_width=P, prompt=prompt, packed=packed) <= budget for gr in groups)
    # by hand: loads 7,7,6,6,6 in a budget of 16: next fit on sorted rows 7+7 | 6+6 | 6 (3 groups); LPT with
    # ceil(32 / 16) = 2 groups puts 7+6+6 = 19 > 16 in one, with 3 it gives 7+6 | 7+6 | 6: balanced, 3 groups
    completion, prompt = [7, 7, 6, 6, 6], [0] * 5
    groups = group_rows(completion, 16, prompt_width=0, prompt=prompt, packed=True)
    assert len(groups) == 3 and all(sum(completion[i] for i in gr) <= 16 for gr in groups)


def test_padding_fraction_by_hand():
    assert padding_fraction(30, 40) == pytest.approx(0.25)
    assert padding_fraction(0, 0) == 0.0


# --------------------------------------------------------------------------- fields of a micro-batch
def _batch():
    pm = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1]])
    cm = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    return {
        "prompt_ids": torch.arange(9).view(3, 3), "prompt_mask": pm,
        "completion_ids": torch.arange(12).view(3, 4), "completion_mask": cm,
        "advantages": torch.tensor([1.0, 2.0, 3.0]), "row_source": torch.tensor([0, 0, 0]),
        "old_per_token_logps": torch.arange(12.0).view(3, 4), "scalar": 7,
    }


def test_take_indexes_rows_and_trims_completion_columns_only():
    b = take(_batch(), [2, 0])
    assert b["prompt_ids"].tolist() == [[6, 7, 8], [0, 1, 2]]  # prompt width kept (positions depend on it)
    assert b["completion_ids"].tolist() == [[8, 9], [0, 1]]  # cut to the rows' longest completion (2)
    assert b["old_per_token_logps"].shape == (2, 2) and b["advantages"].tolist() == [3.0, 1.0]
    assert b["scalar"] == 7


def test_forward_tokens_count_real_and_padded_tokens():
    real, total = forward_tokens(_batch())
    assert (real, total) == (6 + 7, 3 * (3 + 4))
    assert forward_tokens(_batch(), packed=True) == (13, 13)
    b = _batch()
    b["row_source"] = torch.tensor([0, 0, 5])  # an off-policy kind: its own forward, trimmed to its 1 token
    assert forward_tokens(b)[1] == 2 * 7 + 1 * (3 + 1)


def test_budget_part_chunks_cover_every_row_once():
    part = TokenBudget(12)
    chunks = part.chunks(_batch())
    got = sorted(a for c in chunks for a in c["advantages"].tolist())
    assert got == [1.0, 2.0, 3.0]
    assert all(c["prompt_ids"].shape[0] * (3 + c["completion_ids"].shape[1]) <= 12 or c["prompt_ids"].shape[0] == 1 for c in chunks)


# --------------------------------------------------------------------------- the step's gradient (pins harness, float64)
BASE = ["trainer.max_steps=1", "trainer.prompts_per_step=4", "algo.num_generations=4", "trainer.micro_batch_size=8",
        "trainer.max_grad_norm=0", "trainer.eval_size=0", "trainer.max_completion_length=24", "trainer.logging_steps=1",
        "data.train_size=16", "logger.progress=false", "hardware.torch_threads=1"]


def _step_gradient(overrides: list[str], out_dir: Path) -> tuple[torch.Tensor, list[dict], int]:
    """One optimizer step as the pins harness runs it (fixed rollouts), the policy in float64:
    (the flat gradient before the optimizer step, the logged metrics, loss forwards run)."""
    sys.path.insert(0, str(HERE / "pins"))
    import trl
    from harness import patch_generation
    from transformers import TrainerCallback

    from mixrl.config.compose import compose_config
    from mixrl.trainer import build

    original = trl.GRPOTrainer._generate_single_turn
    patch_generation()
    try:
        cfg = compose_config([*overrides, f"model.path={PIN_MODEL}", f"run_dir={out_dir / 'run'}"])
        Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
        grads: list[torch.Tensor] = []

        class Grab(TrainerCallback):
            def on_pre_optimizer_step(self, args, state, control, **kwargs):
                grads.append(torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().flatten().double()
                                        for p in kwargs["model"].parameters() if p.requires_grad]))

        from mixrl.trainer.callbacks import MetricsJsonlCallback

        # the metrics.jsonl logger mixrl train adds: the step's metrics reach every tracker through TRL's log
        trainer = build.trainer_from_config(cfg, callbacks=[Grab(), MetricsJsonlCallback(out_dir / "metrics.jsonl")])
        trainer.model.to(torch.float64)
        calls = []
        compute_loss = trainer._compute_loss
        trainer._compute_loss = lambda model, inputs: calls.append(inputs["completion_ids"].shape) or compute_loss(model, inputs)
        trainer.train()
        metrics = [row for row in trainer.state.log_history if "train_runtime" not in row]
        return grads[0], metrics, len(calls)
    finally:
        trl.GRPOTrainer._generate_single_turn = original


AGGREGATIONS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_budget_step_gradient_equals_the_fixed_micro_batch_step(tmp_path, aggregation):
    """16 rollouts, 2 fixed micro-batches of 8 rows vs a 60-token budget (several micro-batches of
    varied row counts, the completion columns trimmed): the same gradient within 1e-6 (float64)."""
    over = ["algo=grpo", *BASE, f"algo.aggregation.name={aggregation}", "trainer.padding_free=false"]  # padded rows: the padding share shrinks
    fixed, _, n_fixed = _step_gradient(over, tmp_path / "fixed")
    budget, metrics, n_budget = _step_gradient([*over, "trainer.max_tokens_per_micro_batch=60"], tmp_path / "budget")
    assert n_fixed == 2 and n_budget > 2  # really split otherwise
    assert fixed.norm() > 0
    assert torch.allclose(budget, fixed, rtol=0, atol=1e-6), float((budget - fixed).abs().max())
    assert 0.0 <= metrics[0]["batch/padding_fraction"] < 1.0
    if aggregation == "token-mean":  # the metrics in metrics.jsonl; trimmed micro-batches carry less padding
        import json

        rows = [json.loads(line) for line in (tmp_path / "budget" / "metrics.jsonl").read_text().splitlines()]
        fixed_rows = [json.loads(line) for line in (tmp_path / "fixed" / "metrics.jsonl").read_text().splitlines()]
        assert rows[0]["batch/padding_fraction"] < fixed_rows[0]["batch/padding_fraction"]
        assert rows[0]["batch/trained_tokens_per_second"] > 0  # not kernel-bound: a clock reading


def test_budget_step_gradient_on_packed_rows_equals_the_fixed_micro_batch_step(tmp_path):
    """The same with padding-free rows (``trainer.padding_free=true``): the budget counts packed
    tokens, the gradient equals the fixed micro-batches' (float64, 1e-6), and no padding is logged."""
    over = ["algo=grpo", *BASE, "algo.aggregation.name=token-mean", "trainer.padding_free=true"]
    fixed, _, n_fixed = _step_gradient(over, tmp_path / "fixed")
    budget, metrics, n_budget = _step_gradient([*over, "trainer.max_tokens_per_micro_batch=60"], tmp_path / "budget")
    assert n_fixed == 2 and n_budget > 2
    assert fixed.norm() > 0
    assert torch.allclose(budget, fixed, rtol=0, atol=1e-6), float((budget - fixed).abs().max())
    assert metrics[0]["batch/padding_fraction"] == 0.0


def test_budget_step_gradient_with_pairs_split_across_micro_batches(tmp_path):
    """grpo_dpo: on-policy pairs appended to the step; a 40-token budget puts the two sides of pairs
    in different micro-batches (each row then uses its partner's recorded sequence log-prob):
    the same gradient as the fixed micro-batches within 1e-6 (float64)."""
    over = ["algo=grpo_dpo", *BASE]
    fixed, _, _ = _step_gradient(over, tmp_path / "fixed")
    budget, _, n_budget = _step_gradient([*over, "trainer.max_tokens_per_micro_batch=40"], tmp_path / "budget")
    assert n_budget > 2
    assert torch.allclose(budget, fixed, rtol=0, atol=1e-6), float((budget - fixed).abs().max())


# --------------------------------------------------------------------------- mixrl plan
def test_plan_sizes_activations_from_the_budget():
    """``mixrl plan`` with ``trainer.max_tokens_per_micro_batch = N``: a micro-batch's forward holds
    max(N, s) tokens (s = prompt + completion tokens of one row) instead of s x rows, by hand."""
    from mixrl.config.compose import compose_config
    from mixrl.plan import estimate, model_shape

    base = ["recipe=grpo/qwen2.5-math-1.5b-gsm8k", "hardware=gpu-8x80g", "trainer.micro_batch_size=4", "hardware.use_vllm=false"]
    shape = model_shape(compose_config(base))
    fixed = estimate(compose_config(base), shape, prompt_tokens=256)
    s, b, C = 256 + 1024, 4, 1024
    assert fixed["micro_batch_tokens"] == s * b
    budget = estimate(compose_config([*base, "trainer.max_tokens_per_micro_batch=2560"]), shape, prompt_tokens=256)
    assert budget["micro_batch_tokens"] == 2560
    # activations are linear in the tokens of a forward: half the tokens, half the activations
    assert budget["activations"] == pytest.approx(fixed["activations"] * 2560 / (s * b))
    assert budget["lm_head"] < fixed["lm_head"]
    one_row = estimate(compose_config([*base, "trainer.max_tokens_per_micro_batch=100"]), shape, prompt_tokens=256)
    assert one_row["micro_batch_tokens"] == s  # a row longer than the budget is a micro-batch of its own


def test_a_bad_budget_is_one_line():
    from mixrl.config.compose import compose_config
    from mixrl.config.rules import validate_rules
    from mixrl.errors import ConfigError

    with pytest.raises(ConfigError, match="max_tokens_per_micro_batch must be >= 1"):
        validate_rules(compose_config(["trainer.max_tokens_per_micro_batch=0"]))
