"""REX-RAG: probe rollouts (failed reasoning + a revision prompt + the policy's continuation) and
the policy correction (behaviour (1 - alpha) pi_old + alpha mu), checked by hand against the
authors' update_policy (MiliLab/REX-RAG @ d9dbbb428e39b23b5424c05abbda90c68e2096db,
verl/workers/actor/dp_actor.py lines 446-497; PrefixIndex in verl/workers/actor/exploration_distribution.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from mixrl.config.builders import build_objective
from mixrl.config.compose import compose_config
from mixrl.core import provenance as prov
from mixrl.core.objective import compute_objective
from mixrl.errors import ConfigError
from mixrl.sources import InjectContext, Rollouts
from mixrl.sources.probe_rollouts import CONTINUATION, FAILED, PROBE, REVISION, ProbeRollouts, probe_behaviour, revision_mu


from char_tokens import CharTokenizer as _Tok  # tests/char_tokens.py (tests/ is on sys.path under pytest)
from char_tokens import char_ids as _ids
from char_tokens import char_text as _text


#: group 0 "9+10=" (slot 1 wrong; slot 3, the probe slot, is replaced); group 1 "1+2=" (slots 0-2 right: no probe)
ROWS = [{"prompt": "9+10=", "answer": "19"}] * 4 + [{"prompt": "1+2=", "answer": "3"}] * 4
COMPS = ["#19", "#18", "#19", "#1", "#3", "#3", "#3", "#5"]


def _ctx(max_len=8):
    seen = []

    def generate(prompts):
        seen.append([_text(p) for p in prompts])
        return [_ids("9") for _ in prompts], None

    def score(rows, comps):
        return torch.tensor([[float(_text(c) == "#" + r["answer"])] for r, c in zip(rows, comps)])

    ctx = InjectContext(tokenizer=_Tok(), process_index=0, num_processes=1, num_generations=4, max_completion_length=max_len,
                        global_step=0, micro_step=0, device=torch.device("cpu"), tokenize_prompts=lambda ps: [_ids(p) for p in ps],
                        gather=lambda t: t, generate=generate, score=score,
                        behaviour_logps=lambda ps, cs: [[-0.01 * len(p)] * len(c) for p, c in zip(ps, cs)])
    return ctx, seen


def _rollouts():
    return Rollouts(completion_ids=[_ids(c) for c in COMPS], logprobs=None, row_source=[prov.ON_POLICY] * 8,
                    prompt_ids=[_ids(r["prompt"]) for r in ROWS])


def test_revision_mu_is_the_prefix_index_share():
    """Prompts "ab", "ac", "b": the first token has mu 1 (the authors set it to 1); after "a" two
    prompts continue, one with "b": 1/2; "b" has one token."""
    prompts = [_ids("ab"), _ids("ac"), _ids("b")]
    assert revision_mu(prompts, _ids("ab")) == [1.0, 0.5]
    assert revision_mu(prompts, _ids("ac")) == [1.0, 0.5]
    assert revision_mu(prompts, _ids("b")) == [1.0]


def test_probe_behaviour_by_hand():
    """alpha 1/4, e 1/2, tokens [F, F, R, R, C] with pi_old 0.5, 0.4, 0.1, 0.2, 0.3 and revision mu [1, 1/2]:
    b = 3/4 p + 1/4 mu, mu = p / e^(1/2) on the j = 2 failed tokens, 1 and 1/2 on the revision, p on the continuation."""
    p = [0.5, 0.4, 0.1, 0.2, 0.3]
    b = probe_behaviour([math.log(x) for x in p], [FAILED, FAILED, REVISION, REVISION, CONTINUATION], [1.0, 0.5],
                        alpha=0.25, error=0.5)
    want = [0.75 * 0.5 + 0.25 * 0.5 / math.sqrt(0.5), 0.75 * 0.4 + 0.25 * 0.4 / math.sqrt(0.5),
            0.75 * 0.1 + 0.25, 0.75 * 0.2 + 0.25 * 0.5, 0.3]
    assert b == pytest.approx([math.log(w) for w in want], rel=1e-9)


def test_probe_slot_continues_a_failed_rollout_and_records_the_corrected_behaviour():
    """Group 0: slot 1 ("#18") failed, so slot 3 becomes "#1" (keep 0.5: round(1.5) = 2 tokens) +
    a revision ("ab" or "ac") + the policy's "9", generated from "9+10=#1" + revision; group 1's
    slots 0-2 all succeed: no probe. alpha = 1/8 probes per row, e = 1 - 5/8 (the first pass); the
    stand-in pi_old is e^-0.05 per token (prompt "9+10=", 5 characters)."""
    ctx, seen = _ctx()
    inj = ProbeRollouts(probes=1, keep=0.5, revisions=["ab", "ac"])
    out = inj.after_generation(ctx, ROWS, _rollouts())
    probe = _text(out.completion_ids[3])
    assert probe in ("#1ab9", "#1ac9") and seen == [["9+10=#1" + probe[2:4]]]
    assert [_text(c) for i, c in enumerate(out.completion_ids) if i != 3] == [c for i, c in enumerate(COMPS) if i != 3]
    assert out.token_source[3] == [PROBE] * 5 and all(out.token_source[i] is None for i in range(8) if i != 3)
    assert out.discarded_tokens == [2] and out.prompt_ids[3] == _ids("9+10=")  # trained under the original prompt
    p, a, e = math.exp(-0.05), 1 / 8, 3 / 8
    want = [(1 - a) * p + a * p / math.sqrt(e)] * 2 + [(1 - a) * p + a * 1.0, (1 - a) * p + a * 0.5, p]
    assert out.behaviour_logp[3] == pytest.approx([math.log(w) for w in want], rel=1e-9)
    assert inj.metrics == pytest.approx({"probe/alpha": a, "probe/first_pass_error": e})


def test_preset_trains_probe_tokens_against_the_corrected_behaviour():
    """algo=rex_rag (ppo_clip 0.2, token-mean, kl 0.001 on rollouts vs a reference equal to the
    policy: 0): row 0 a rollout, 2 tokens, r = 1, A = 1: l = -1; row 1 a probe, 3 tokens, log p
    -0.5, corrected behaviour -0.55, r = e^0.05 (inside the clip range), A = -2: l = 2 e^0.05."""
    logp = torch.tensor([[-1.0, -1.0, 0.0], [-0.5, -0.5, -0.5]], requires_grad=True)
    kw = dict(logp=logp, mask=torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool),
              token_source=torch.tensor([[prov.ON_POLICY] * 3, [PROBE] * 3]), advantages=torch.tensor([1.0, -2.0]),
              old_logp=logp.detach().clone(), ref_logp=logp.detach().clone(),
              behaviour_logp=torch.tensor([[float("nan")] * 3, [-0.55] * 3]))
    loss, _ = compute_objective(build_objective(compose_config(["algo=rex_rag"])), **kw)
    r = math.exp(0.05)
    assert float(loss.detach()) == pytest.approx((-2 + 6 * r) / 5, rel=1e-5)
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-1 / 5, -1 / 5, 0.0] + [2 * r / 5] * 3, rel=1e-5)


def test_bad_settings_get_one_line():
    with pytest.raises(ConfigError, match="algo.inject.revisions must list at least one"):
        ProbeRollouts(revisions=[])
    ctx, _ = _ctx(max_len=3)
    with pytest.raises(ConfigError, match="longest revision prompt is 3 tokens.*max_completion_length=3"):
        ProbeRollouts(revisions=["abc"]).after_generation(ctx, ROWS, _rollouts())
    ctx, _ = _ctx()
    with pytest.raises(ConfigError, match="algo.inject.probes=4 must be below num_generations=4"):
        ProbeRollouts(probes=4, revisions=["ab"]).after_generation(ctx, ROWS, _rollouts())


@pytest.mark.slow
def test_rex_rag_toy_recipe_trains_two_steps(tiny_bpe_model_path, tmp_path):
    from typer.testing import CliRunner

    from conftest import FAST
    from mixrl.cli.main import app

    res = CliRunner().invoke(app, ["train", "recipe=rex_rag/arith-tiny", *FAST, f"model.path={tiny_bpe_model_path}",
                                   f"run_dir={tmp_path / 'run'}", "data.levels=[4]", "trainer.save_steps=0"])
    assert res.exit_code == 0, res.stdout[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "probe/alpha" in r]
    assert len(train) == 2 and all(r["probe/alpha"] > 0 for r in train)
