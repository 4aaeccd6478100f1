"""Nash-MD (mixrl.sources.nash_md): the geometric mixture's next-token distribution, the sampler,
the preference advantage P - 1/2, the preset's gradient against TRL's former NashMDTrainer loss
(huggingface/trl @ f2cd57710ae345ea6428ae95363267fcf38a3dc8, trl/experimental/nash_md/nash_md_trainer.py:367-385),
the refusals, and two training steps of the preset."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.config.builders import build_objective
from mixrl.config.compose import compose_config
from mixrl.core import provenance as prov
from mixrl.core.objective import compute_objective
from mixrl.errors import ConfigError
from mixrl.sources import InjectContext
from mixrl.sources.nash_md import NashMD, mixture_logprobs, nash_md_advantages, sample_mixture

V = 6  # vocabulary of the fake models; token 0 is eos


class _Fixed(torch.nn.Module):
    """A language model whose next-token logits are the same at every position."""

    def __init__(self, logits):
        super().__init__()
        self.z = torch.nn.Parameter(torch.tensor(logits, dtype=torch.float32))

    def forward(self, input_ids, attention_mask=None):
        b, t = input_ids.shape
        return SimpleNamespace(logits=self.z.expand(b, t, V))


def test_mixture_logprobs_are_the_normalised_geometric_mixture():
    zp, zr = torch.tensor([[1.0, 0.0, -1.0, 2.0]]), torch.tensor([[0.5, 1.5, 0.0, -2.0]])
    p, r = torch.softmax(zp.double(), -1), torch.softmax(zr.double(), -1)
    for c in (0.0, 0.3, 0.5, 1.0):
        by_hand = p ** (1 - c) * r ** c
        by_hand = by_hand / by_hand.sum()
        assert torch.allclose(mixture_logprobs(zp, zr, c).exp().double(), by_hand, atol=1e-6)
    # c = 0.5, token 0: sqrt(p0 r0) / sum_k sqrt(p_k r_k)
    num = math.sqrt(p[0, 0] * r[0, 0])
    den = sum(math.sqrt(p[0, k] * r[0, k]) for k in range(4))
    assert mixture_logprobs(zp, zr, 0.5)[0, 0].exp().item() == pytest.approx(num / den, rel=1e-5)


def test_sample_mixture_draws_from_the_mixture_and_stops_at_eos():
    policy, ref = _Fixed([0.0, 2.0, 0.0, -1.0, 1.0, 0.0]), _Fixed([0.0, -1.0, 2.0, 1.0, 0.0, 0.0])
    n, c, T = 6000, 0.5, 0.8
    gen = torch.Generator().manual_seed(0)
    draws = sample_mixture(policy, ref, [3, 4], n, coef=c, temperature=T, max_new_tokens=1, eos_token_id=0, generator=gen)
    assert all(len(d) == 1 for d in draws)
    counts = torch.bincount(torch.tensor([d[0] for d in draws]), minlength=V).double() / n
    q = (torch.softmax(policy.z.double(), -1) ** (1 - c) * torch.softmax(ref.z.double(), -1) ** c) ** (1 / T)
    q = q / q.sum()
    sigma = (q * (1 - q) / n).sqrt()
    assert ((counts - q).abs() <= 5 * sigma + 1e-9).all(), (counts, q)
    # eos ends a completion (kept); the cap cuts the others
    sure_eos = _Fixed([30.0, 0, 0, 0, 0, 0])
    assert sample_mixture(sure_eos, sure_eos, [1], 3, coef=0.5, temperature=1.0, max_new_tokens=5, eos_token_id=0) == [[0]] * 3
    never_eos = _Fixed([-30.0, 30.0, 0, 0, 0, 0])
    assert sample_mixture(never_eos, never_eos, [1], 2, coef=0.5, temperature=1.0, max_new_tokens=4, eos_token_id=0) == [[1] * 4] * 2


def test_preference_advantage_is_sigmoid_of_the_reward_gap_minus_a_half():
    a = nash_md_advantages(torch.tensor([1.0, 0.0, 1.0, 0.3]), torch.tensor([0.0, 1.0, 1.0, -0.2]))
    by_hand = [1 / (1 + math.exp(-1)) - 0.5, 1 / (1 + math.exp(1)) - 0.5, 0.0, 1 / (1 + math.exp(-0.5)) - 0.5]
    assert a.tolist() == pytest.approx(by_hand, abs=1e-6)


class _Tok:
    eos_token_id, pad_token_id = 0, 0


def _ctx(policy, ref, rewards):
    return InjectContext(
        tokenizer=_Tok(), process_index=0, num_processes=1, num_generations=2, max_completion_length=3,
        global_step=0, micro_step=0, device=torch.device("cpu"), tokenize_prompts=None, gather=lambda t: t,
        policy=policy, ref_model=ref, rewards=rewards,
    )


def _batch(rewards, prompts):
    n = len(rewards)
    return {
        "prompt_ids": torch.tensor(prompts), "prompt_mask": torch.ones(n, len(prompts[0]), dtype=torch.long),
        "completion_ids": torch.ones(n, 2, dtype=torch.long), "completion_mask": torch.ones(n, 2, dtype=torch.long),
        "advantages": torch.full((n,), 9.0), "row_source": torch.full((n,), prov.ON_POLICY),
        "mixrl_reward": torch.tensor(rewards, dtype=torch.float32),
    }


def test_injection_sets_each_rollouts_advantage_against_its_mixture_completion():
    """mixture_coef 1: the mixture is the reference, which always ends at once ([eos], reward 0);
    mixture_coef 0: the mixture is the policy, which always writes token 2 three times (reward 1)."""
    seen = []

    def rewards(rows, ids):
        seen.append((rows, ids))
        return torch.tensor([1.0 if x and x[0] == 2 else 0.0 for x in ids])

    policy, ref = _Fixed([-30.0, -30.0, 30.0, 0, 0, 0]), _Fixed([30.0, 0, 0, 0, 0, 0])
    inputs = [{"prompt": "a"}, {"prompt": "a"}, {"prompt": "b"}, {"prompt": "b"}]
    out = NashMD(mixture_coef=1.0).after_advantages(_ctx(policy, ref, rewards), inputs,
                                                    _batch([1.0, 0.0, 0.5, 1.0], [[5, 1], [5, 1], [5, 2], [5, 2]]))
    s = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    assert out["advantages"].tolist() == pytest.approx([s(1) - 0.5, 0.0, s(0.5) - 0.5, s(1) - 0.5], abs=1e-6)
    assert [ids for _, ids in seen] == [[[0], [0]], [[0], [0]]]  # one mixture completion per rollout, per prompt
    assert [r for r, _ in seen] == [inputs[:2], inputs[2:]]
    seen.clear()
    inj = NashMD(mixture_coef=0.0)
    out = inj.after_advantages(_ctx(policy, ref, rewards), inputs, _batch([1.0, 0.0, 0.5, 1.0], [[5, 1], [5, 1], [5, 2], [5, 2]]))
    assert out["advantages"].tolist() == pytest.approx([0.0, s(-1) - 0.5, s(-0.5) - 0.5, 0.0], abs=1e-6)
    assert seen[0][1] == [[2, 2, 2], [2, 2, 2]]  # capped at max_completion_length
    assert inj.metrics["nash_md/mixture_reward"] == 1.0 and inj.metrics["nash_md/mixture_length"] == 3.0
    # rows that are not rollouts keep their advantage
    b = _batch([1.0, 0.0], [[5, 1], [5, 1]])
    b["row_source"][1] = prov.EXPERT
    out = NashMD(mixture_coef=1.0).after_advantages(_ctx(policy, ref, rewards), inputs[:2], b)
    assert out["advantages"].tolist() == pytest.approx([s(1) - 0.5, 9.0], abs=1e-6)


def test_injection_without_a_reference_model_says_so():
    with pytest.raises(RuntimeError, match="reference model"):
        NashMD().after_advantages(_ctx(_Fixed([0.0] * V), None, None), [{}], _batch([1.0], [[1]]))


def test_preset_gradient_is_trls_nash_md_gradient():
    """TRL: loss = mean_rows [beta sum_t sg(lp - lr) lp - (P - 1/2) sum_t lp]; the preset's objective
    (reinforce, k2 KL at coef beta, seq-mean-token-sum) has the same gradient in lp on every token."""
    cfg = compose_config(["algo=nash_md"])
    obj = build_objective(cfg)
    beta = float(cfg.algo.kl.coef)
    torch.manual_seed(0)
    lp0 = -torch.rand(3, 4) - 0.1
    ref = -torch.rand(3, 4) - 0.1
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    adv = nash_md_advantages(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0.0, 0.0, 1.0]))
    lp = lp0.clone().requires_grad_(True)
    loss, _ = compute_objective(obj, logp=lp, mask=mask, advantages=adv, ref_logp=ref)
    loss.backward()
    lt = lp0.clone().requires_grad_(True)
    m = mask.float()
    log_ratio = (lt - ref).detach()
    trl = (beta * (log_ratio * lt * m).sum(1) - adv * (lt * m).sum(1)).mean()
    trl.backward()
    assert torch.allclose(lp.grad, lt.grad, atol=1e-6)
    # the policy part's value is TRL's -score exactly
    by_hand = (-(adv * (lp0 * m).sum(1)).mean() + beta * (0.5 * (lp0 - ref) ** 2 * m).sum(1).mean())
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-5)


@pytest.mark.parametrize("overrides, match", [
    (["algo=nash_md", "algo.inject.mixture_coef=1.5"], "mixture_coef"),
    (["algo=nash_md", "algo.inject.temperature=0"], "temperature"),
    (["algo=nash_md", "model.lora.enabled=true"], "lora"),
    (["algo=nash_md", "algo.kl.coef=0"], "kl.coef"),
])
def test_out_of_range_nash_md_settings_are_refused_in_one_line(overrides, match):
    with pytest.raises(ConfigError, match=match) as e:
        compose_config(overrides)
    assert "\n" not in str(e.value)


runner = CliRunner()


@pytest.mark.slow
def test_nash_md_preset_trains_two_steps(fast_overrides):
    run_dir = next(o for o in fast_overrides if o.startswith("run_dir=")).split("=", 1)[1]
    res = runner.invoke(app, ["train", "algo=nash_md", *fast_overrides, "trainer.eval_size=0"])
    assert res.exit_code == 0, (res.stdout[-1500:], res.exception)
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert len(rows) == 2
    assert all(0.0 <= r["nash_md/preference"] <= 1.0 and r["nash_md/mixture_length"] >= 1 for r in rows)
