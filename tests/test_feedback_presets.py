"""The Critique-GRPO and R3L presets against their authors' code (issue 49), on hand-built batches.

Critique-GRPO (zhangxy-2019/critique-GRPO @ e8f03a20b49511e10e71f361c70e46aae3ae8753): the run
script sets loss_remove_clip=True, loss_remove_token_mean=True, entropy 0.001
(verl/examples/grpo_trainer/run_open_r1_math4k-qwen3-8b-base-critique_simple_gt_online.sh:31, 93,
127-128); critique_core_algos.py:587-599 takes -A r on initial-response tokens unclipped, 612-613
and 650 take -A p/(p + 0.1) on refinement tokens, 675-676 divide the token sum by the padded
response length L.

R3L (shiweijiezero/R3L @ d503f6c6b0725a4e8a39311e6f9b71de6bb2f64b): opmd_reweight_adv keeps
kl_loss_fn k2 (trinity/algorithm/algorithm.py:197-218) with kl_coef 0.001 (kl_fn/kl_fn.py:28),
k2 = (logp - ref)^2 / 2 (kl_fn.py:137-144), averaged over the batch's tokens (kl_fn.py:79-92).
"""

from __future__ import annotations

import math

import pytest
import torch

from mixrl.config.builders import build_objective
from mixrl.config.compose import compose_config
from mixrl.core import provenance as prov
from mixrl.core.objective import compute_objective
from mixrl.sources.with_feedback import REFINED

L = math.log
NAN = float("nan")
# row 0: an initial response, 3 tokens, ratios 1.5, 0.5, 1.0, A = +1; row 1: a refinement, 2 tokens,
# p = 0.4, 0.9, A = -1; the padded width L = 4 (trainer.max_completion_length)
LOGP = [[-1 + L(1.5), -1 + L(0.5), -1.0, 0.0], [L(0.4), L(0.9), 0.0, 0.0]]
OLD = [[-1.0, -1.0, -1.0, 0.0], [L(0.4), L(0.9), 0.0, 0.0]]
MASK = [[1, 1, 1, 0], [1, 1, 0, 0]]
BEHAVIOUR = [[NAN] * 4, [L(0.3), L(0.8), NAN, NAN]]


def _critique_loss(*overrides: str) -> float:
    cfg = compose_config(["algo=critique_grpo", "trainer.max_completion_length=4", *overrides])
    loss, _ = compute_objective(
        build_objective(cfg), logp=torch.tensor(LOGP), mask=torch.tensor(MASK), advantages=torch.tensor([1.0, -1.0]),
        token_source=torch.tensor([[prov.ON_POLICY] * 4, [REFINED] * 4]), old_logp=torch.tensor(OLD),
        behaviour_logp=torch.tensor(BEHAVIOUR))
    return float(loss)


def test_critique_grpo_preset_is_the_authors_unclipped_max_length_loss():
    cfg = compose_config(["algo=critique_grpo"])
    assert cfg.algo.loss.clip is False and cfg.algo.aggregation.name == "seq-mean-token-sum-norm"
    assert cfg.algo.entropy_coef == pytest.approx(0.001)
    # the authors: sum(-A r on row 0; -A p/(p+0.1) on row 1) / L
    #   = (-1.5 - 0.5 - 1.0 + 0.4/0.5 + 0.9/1.0) / 4 = -1.3 / 4 = -0.325
    authors = (-1.5 - 0.5 - 1.0 + 0.8 + 0.9) / 4
    # mixrl's seq-mean-token-sum-norm also divides by the rows (2): a constant factor (verl scales
    # each micro-batch's sum by its share of the mini-batch instead, critique_dp_actor.py:467-469)
    assert _critique_loss("algo.entropy_coef=0") == pytest.approx(authors / 2)


def test_critique_grpo_earlier_preset_is_one_override_away():
    """algo.loss.clip=true algo.aggregation.name=token-mean algo.entropy_coef=0: clip 0.2 and a
    token mean over the 5 tokens: (max(-1.5, -1.2) + max(-0.5, -0.8) - 1.0 + 0.8 + 0.9) / 5 = -0.2."""
    assert _critique_loss("algo.loss.clip=true", "algo.aggregation.name=token-mean", "algo.entropy_coef=0") == pytest.approx(
        (-1.2 - 0.5 - 1.0 + 0.8 + 0.9) / 5)


def test_r3l_preset_keeps_the_authors_k2_kl_at_0_001():
    cfg = compose_config(["algo=r3l"])
    assert cfg.algo.kl.coef == pytest.approx(0.001) and cfg.algo.kl.estimator == "k2"
    logp = torch.tensor([[-0.5, -1.0, -2.0], [-0.1, -0.3, 0.0]])
    ref = torch.tensor([[-0.7, -0.4, -2.5], [-0.1, -1.3, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # advantages 0: OPMD's -A log p / (1 + tau) is 0, only the KL is left:
    # 0.001 * mean over the 5 tokens of (logp - ref)^2 / 2 = 0.001 * (0.04 + 0.36 + 0.25 + 0 + 1.0) / 2 / 5
    expected = 0.001 * (0.2 ** 2 + 0.6 ** 2 + 0.5 ** 2 + 0.0 + 1.0 ** 2) / 2 / 5
    loss, _ = compute_objective(build_objective(cfg), logp=logp, mask=mask, advantages=torch.zeros(2), ref_logp=ref)
    assert float(loss) == pytest.approx(expected)
    off, _ = compute_objective(build_objective(compose_config(["algo=r3l", "algo.kl.coef=0.0"])), logp=logp, mask=mask,
                               advantages=torch.zeros(2), ref_logp=ref)
    assert float(off) == 0.0  # the earlier preset: no KL


def test_the_critique_grpo_data_option_reads_the_authors_schema(tmp_path, monkeypatch):
    """conf/data/critique-grpo-openr1-4k.yaml on a small local folder in the schema of the authors'
    openr1_math_4k_train_qwenformat/{train,test}.parquet (their test.parquet, row 0, read at e8f03a2):
    data_source, prompt (system + user messages), ability, reward_model {ground_truth, style}, extra_info."""
    import pandas as pd

    from mixrl.data.loading import load_dataset_rows

    def rows(n, split):
        return pd.DataFrame([{
            "data_source": "openr1", "ability": "math", "extra_info": {"index": i, "split": split},
            "prompt": [{"role": "system", "content": "You are a helpful assistant."},
                       {"role": "user", "content": f"What is {i} + 1?\nPlease reason step by step, and put your final answer within \\boxed{{}}."}],
            "reward_model": {"ground_truth": str(i + 1), "style": "rule"},
        } for i in range(n)])

    folder = tmp_path / "openr1_math_4k_train_qwenformat"
    folder.mkdir()
    rows(3, "train").to_parquet(folder / "train.parquet")
    rows(2, "test").to_parquet(folder / "test.parquet")
    monkeypatch.setenv("CRITIQUE_GRPO_DATA", str(folder))
    d = compose_config(["data=critique-grpo-openr1-4k"]).data
    assert d.source == str(folder)
    train = load_dataset_rows(d.source, split=d.split, prompt_column=d.prompt_column, answer_column=d.answer_column)
    test = load_dataset_rows(d.source, split=d.eval_split, prompt_column=d.prompt_column, answer_column=d.answer_column)
    assert len(train) == 3 and len(test) == 2
    assert train[2]["answer"] == "3"
    assert [m["role"] for m in train[2]["prompt"]] == ["system", "user"]  # their own system message, kept as is
    assert train[2]["prompt"][0]["content"] == "You are a helpful assistant."
