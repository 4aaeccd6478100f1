"""Rewards from models: ``reward=model`` (a sequence-classification reward model, mixrl.rewards.reward_model),
``reward=judge`` (a generative judge behind an OpenAI-compatible endpoint, mixrl.rewards.judge, against the
stand-in server of tests/judge_stand_in.py) and ``reward=process`` (step scores on each step's tokens,
mixrl.rewards.process). Values are written out by hand from each module's docstring formula."""

from __future__ import annotations

import json
import logging
import math
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.rewards.protocol import RewardContext
from mixrl.errors import ConfigError, RewardError
from mixrl.rewards import build_reward
from mixrl.rewards.components import heldout_reward
from mixrl.rewards.judge import JudgeUnavailable, parse_verdict
from mixrl.rewards.reward_model import combine, normalize_scores, verifier_decides

sys.path.insert(0, str(Path(__file__).resolve().parent))
from judge_stand_in import arith_judge, judge_any, serve  # noqa: E402

runner = CliRunner()


# --------------------------------------------------------------------------- the formulas, by hand
def test_normalisation_by_hand():
    s = [1.0, 3.0, 2.0, 2.0]
    assert normalize_scores(s, [], "none") == s
    # batch: mean 2, population std sqrt((1 + 1 + 0 + 0) / 4) = sqrt(0.5)
    assert normalize_scores(s, [], "batch") == pytest.approx([-1 / math.sqrt(0.5), 1 / math.sqrt(0.5), 0, 0], rel=1e-5)
    # group: {1, 3} (mean 2, std 1) and {2, 2} (std 0: all 0)
    assert normalize_scores(s, ["a", "a", "b", "b"], "group") == pytest.approx([-1, 1, 0, 0], rel=1e-5)


def test_combination_and_gating_by_hand():
    s, v = [0.2, 0.9, 0.6], [1.0, 0.0, None]
    assert combine(s, v, None, gate="none", rm_weight=2.0, verifier_weight=0.5) == pytest.approx([0.9, 1.8, 1.2])
    decided = [verifier_decides(t, x, "####") for t, x in zip(["3 #### 3", "3 ####", "3 #### 3"], v)]
    assert decided == [True, False, False]  # no answer after the marker; no verdict
    assert combine(s, v, decided, gate="undecided", rm_weight=2.0, verifier_weight=0.0) == pytest.approx([1.0, 1.8, 1.2])
    assert combine(s, None, None, gate="none", rm_weight=3.0, verifier_weight=1.0) == pytest.approx([0.6, 2.7, 1.8])


def test_verdicts_parse_numbers_and_labels_and_nothing_else():
    from mixrl.rewards.judge import DEFAULT_PATTERN, LABELS
    from mixrl.rewards.process import STEP_PATTERN

    p = re.compile(DEFAULT_PATTERN)
    assert parse_verdict("fine. Score: 7", p, 10.0, LABELS) == pytest.approx(0.7)
    assert parse_verdict("I think it is right", p, 10.0, LABELS) is None
    assert parse_verdict("Verdict: Incorrect", re.compile(STEP_PATTERN), 1.0, LABELS) == 0.0


@pytest.mark.parametrize("params, fix", [
    ({"normalize": "zscore"}, "reward.params.normalize"),
    ({"gate": "undecided", "verifier": "none"}, "reward.params.verifier=exact"),
    ({"verifier": "judge"}, "use exact, math or none"),
])
def test_bad_reward_model_params_are_one_line(params, fix):
    with pytest.raises(ConfigError, match=re.escape(fix)) as e:
        build_reward("model", **params)
    assert "\n" not in str(e.value)


def test_bad_judge_params_are_one_line():
    with pytest.raises(ConfigError, match="needs reward.params.url"):
        build_reward("judge", backend="endpoint")
    # no backend named: the endpoint when a url is given, else the run's starting model (offline)
    assert (build_reward("judge").fn.backend, build_reward("judge").fn.path) == ("hf", "policy")
    assert build_reward("judge", url="http://x/v1").fn.backend == "endpoint"
    with pytest.raises(ConfigError, match="no \\{completion\\} field"):
        build_reward("judge", url="http://x/v1", template="Score it: {prompt}")
    with pytest.raises(ConfigError, match="reward.params.scorer_params.url"):
        build_reward("process", scorer_params={"backend": "endpoint"})


def test_explain_and_the_components_page_show_the_rewards_from_models():
    from mixrl.config.compose import compose_config
    from mixrl.explain.render import explain_lines
    from mixrl.sources.docs import render_components_markdown

    rows = dict(explain_lines(compose_config(["reward=model", "reward.params.gate=undecided", "reward.params.rm_weight=2"])))
    assert rows["reward"].startswith("model (weight 1): r_i = 2 norm_none(s_i)") and "[gate=undecided]" in rows["reward"]
    page = render_components_markdown()
    for name in ("model", "judge", "process"):
        assert f"### `{name}`" in page
    assert "arXiv 2508.02298" in page and "arXiv 2203.02155" in page and "arXiv 2306.05685" in page


# --------------------------------------------------------------------------- the built-in reward model
@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory) -> str:
    from mixrl.models.tiny_rm import build_tiny_rm

    return str(build_tiny_rm(tmp_path_factory.mktemp("tiny-rm"), steps=20))


def test_the_reward_model_scores_in_batches_like_one_by_one(tiny_rm):
    rm = build_reward("model", path=tiny_rm, batch_size=2)
    prompts, completions = ["3+5=", "3+5=", "1+2+3="], ["8 #### 8", "3 #### 3", "3 6 #### 6"]
    batched = rm(prompts=prompts, completions=completions, answer=["8", "8", "6"])
    single = [build_reward("model", path=tiny_rm, batch_size=1)(prompts=[p], completions=[c], answer=[a])[0]
              for p, c, a in zip(prompts, completions, ["8", "8", "6"])]
    assert batched == pytest.approx(single, abs=1e-5) and all(0 < x < 1 for x in batched)
    # gate=undecided: the verifier decides all three (each has an answer after ####)
    gated = build_reward("model", path=tiny_rm, gate="undecided")(prompts=prompts, completions=completions, answer=["8", "8", "6"])
    assert gated == [1.0, 0.0, 1.0]
    assert heldout_reward(rm) is rm.fn.verifier and heldout_reward(build_reward("exact")).spec == "exact"


def test_another_tokenizer_is_retokenised_once_or_refused(tiny_rm, caplog):
    from mixrl.models.tiny_arch import build_tokenizer, tokenizer_from_vocab

    same, other = build_tokenizer(), tokenizer_from_vocab({"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "a": 4})
    rm = build_reward("model", path=tiny_rm).fn
    with caplog.at_level(logging.WARNING, logger="mixrl.rewards.reward_model"):
        rm.check_tokenizer(same)
        rm.check_tokenizer(other)
        rm.check_tokenizer(other)
    assert [r.getMessage() for r in caplog.records if "re-tokenised" in r.getMessage()].__len__() == 1
    with pytest.raises(ConfigError, match="another tokenizer than the policy.*retokenize=true") as e:
        build_reward("model", path=tiny_rm, retokenize=False).fn.check_tokenizer(other)
    assert "\n" not in str(e.value)


def test_a_model_without_a_classification_head_is_refused_before_it_loads(tiny_model_path, tiny_rm, tmp_path, monkeypatch):
    """The policy's own causal LM (issue 50), and a folder whose config claims a classifier its weights
    do not hold: one line each, and no weight loads (transformers would give a random head)."""
    import shutil

    import transformers

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before it was checked")

    monkeypatch.setattr(transformers.AutoModelForSequenceClassification, "from_pretrained", no_load)
    for call in ("check_model", "model"):
        with pytest.raises(ConfigError, match=r"Qwen2ForCausalLM model without a classification head") as e:
            getattr(build_reward("model", path=tiny_model_path).fn, call)()
        assert "\n" not in str(e.value) and "builtin:tiny-rm" in str(e.value)
    fake = tmp_path / "fake-rm"
    shutil.copytree(tiny_model_path, fake)
    cfg = json.loads((fake / "config.json").read_text())
    (fake / "config.json").write_text(json.dumps({**cfg, "architectures": ["Qwen2ForSequenceClassification"]}))
    with pytest.raises(ConfigError, match=r"no classification head \(score.weight missing\)"):
        build_reward("model", path=str(fake)).fn.check_model()
    with pytest.raises(ConfigError, match="no model config could be read there"):
        build_reward("model", path=str(tmp_path / "nothing")).fn.check_model()
    build_reward("model", path=tiny_rm).fn.check_model()  # a trained classifier passes


def test_training_with_the_policys_own_model_as_reward_model_stops_before_the_run_exists(tiny_model_path, tmp_path):
    run = tmp_path / "run"
    res = runner.invoke(app, ["train", *FAST, f"model.path={tiny_model_path}", "reward=model",
                              f"reward.params.path={tiny_model_path}", f"run_dir={run}"])
    assert res.exit_code == 2, (res.stdout + res.stderr)[-2000:]
    assert "without a classification head" in res.stderr and not run.exists()
    assert len([line for line in res.stderr.splitlines() if line.startswith("error:")]) == 1


def test_plan_counts_the_reward_model():
    from mixrl.config.compose import compose_config
    from mixrl.plan import KNOWN_MODELS, _shape, estimate, model_shape

    base = ["model.path=Qwen/Qwen2.5-Math-7B", "hardware=gpu-1x80g"]
    without = compose_config(base)
    with_rm = compose_config([*base, "reward=model", "reward.params.path=Qwen/Qwen2.5-Math-1.5B"])
    a, b = estimate(without, model_shape(without)), estimate(with_rm, model_shape(with_rm))
    rm_params = _shape(KNOWN_MODELS["Qwen/Qwen2.5-Math-1.5B"], "known").params()
    assert a["reward_models"] == 0 and b["reward_models"] == rm_params * 4  # float32, as the policy here
    assert b["train_phase"] - a["train_phase"] == pytest.approx(rm_params * 4)


# --------------------------------------------------------------------------- the judge, against a stand-in server
@pytest.fixture(scope="module")
def stand_in():
    url, server = serve(judge_any)
    yield url, server
    server.shutdown()


def test_the_judge_asks_the_endpoint_once_per_completion(stand_in):
    url, server = stand_in
    judge = build_reward("judge", url=url, backoff_s=0.0)
    kw = dict(prompts=["3+5=", "3+5=", "3+5="], completions=["8 #### 8", "3 #### 3", "8 #### 8"], answer=["8"] * 3)
    before = len(server.calls)
    assert judge(**kw) == [1.0, 0.0, 1.0]
    assert len(server.calls) - before == 2  # the repeated completion is asked once
    assert judge(**kw) == [1.0, 0.0, 1.0] and len(server.calls) - before == 2  # and then cached


def test_unparsable_verdicts_are_counted_never_a_silent_zero(caplog):
    url, server = serve(lambda text: "I cannot say.")
    try:
        logged: dict[str, float] = {}
        neutral = build_reward("judge", url=url, neutral=0.5, give_up_after=3)
        with caplog.at_level(logging.WARNING, logger="mixrl.rewards.judge"):
            out = neutral(prompts=["1+1="] * 2, completions=["2 #### 2", "3 #### 3"], answer=["2"] * 2,
                          log_metric=lambda k, v: logged.__setitem__(k, v))
        assert out == [0.5, 0.5] and logged == {"judge/unparsable": 2.0, "judge/unparsable_frac": 1.0}
        assert any("2 of 2 verdicts unparsable" in r.getMessage() for r in caplog.records)
        with pytest.raises(RewardError, match="no parsable verdict in the last 3 completions") as e:
            neutral(prompts=["1+2="], completions=["3 #### 3"], answer=["3"])
        assert "\n" not in str(e.value)
        assert build_reward("judge", url=url, unparsable="drop")(prompts=["1+1="], completions=["2 #### 2"], answer=["2"]) == [None]
        with pytest.raises(RewardError, match="unparsable=error"):
            build_reward("judge", url=url, unparsable="error")(prompts=["1+1="], completions=["2 #### 2"], answer=["2"])
    finally:
        server.shutdown()


def test_the_policys_own_model_can_judge(tiny_model_path, caplog):
    """backend=hf, path=policy: the run's starting model answers the question (greedy). The tiny arithmetic
    model never writes 'Score: N', so every verdict is unparsable: counted, neutral, never a silent 0."""
    assert build_reward("judge", backend="hf", path="policy").fn.path == "policy"  # built outside a run: no policy to follow
    judge = build_reward("judge", backend="hf", path="policy", max_tokens=8, neutral=0.25,
                         context=RewardContext(policy_path=tiny_model_path))  # the run's policy, given at construction
    assert judge.fn.path == tiny_model_path
    with caplog.at_level(logging.WARNING, logger="mixrl.rewards.judge"):
        out = judge(prompts=["1+2=", "3+4="], completions=["3 #### 3", "7 #### 7"], answer=["3", "7"])
    assert out == [0.25, 0.25] and judge.fn.unparsable_total == 2
    assert any("2 of 2 verdicts unparsable" in r.getMessage() for r in caplog.records)


def test_a_down_endpoint_is_retried_then_stops_with_one_line():
    url, server = serve(arith_judge)
    server.shutdown()
    server.server_close()  # nothing listens on the port any more
    judge = build_reward("judge", url=url, retries=2, backoff_s=0.01)
    with pytest.raises(JudgeUnavailable, match="did not answer after 3 tries.*start it or fix reward.params.url") as e:
        judge(prompts=["1+1="], completions=["2 #### 2"], answer=["2"])
    assert "\n" not in str(e.value)


def test_process_rewards_put_each_steps_score_on_its_tokens(stand_in):
    from mixrl.models.tiny_arch import build_tokenizer

    url, _ = stand_in
    tok = build_tokenizer()
    proc = build_reward("process", separator=" ", scorer_params={"url": url}, placement="each", outcome_weight=2.0,
                        context=RewardContext(tokenizer=tok))  # the policy's tokenizer, given at construction
    text = "8 11 #### 11"  # 3+5+2=: "8 " right, "11 " wrong (10), "#### " right, "11" wrong
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    # the trainer sees the row's sum; the per-token list waits in last_dense for GAE
    assert proc(prompts=["3+5+2="], completions=[text], answer=["10"], completion_ids=[ids]) == [-5.0]
    # tokens: 8,' ' | 1,1,' ' | #,#,#,#,' ' | 1,1 | eos; wrong steps get 1 * (0 - 1) on each token, the outcome 2 * 0
    assert proc.last_dense[0] == [0, 0, -1, -1, -1, 0, 0, 0, 0, 0, -1, -1, 0]
    assert proc.last_credit[0] == proc.last_dense[0]  # the outcome (2 * 0) adds nothing: the credit is the whole list
    assert heldout_reward(proc) is proc.fn.verifier
    right = "8 10 #### 10"
    ids = tok(right, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert proc(prompts=["3+5+2="], completions=[right], answer=["10"], completion_ids=[ids]) == [2.0]
    assert proc.last_dense[0] == [0] * (len(ids) - 1) + [2.0]  # every step right: only the outcome, on the last token
    assert proc.last_credit[0] == [0] * len(ids)  # algo.advantage.name=capo's credit: the steps' part, without the outcome


# --------------------------------------------------------------------------- training runs (2-3 steps each)
FAST = ["trainer.max_steps=2", "trainer.prompts_per_step=4", "algo.num_generations=4", "trainer.eval_size=8",
        "trainer.max_completion_length=24", "data.train_size=64", "logger.progress=false", "hardware.torch_threads=1"]


def _train(args: list[str]):
    res = runner.invoke(app, ["train", *args])
    assert res.exit_code == 0, (res.stdout + res.stderr)[-3000:]
    return res


def _metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_grpo_trains_with_the_built_in_reward_model(tiny_model_path, tiny_rm, tmp_path):
    run = tmp_path / "run"
    _train([*FAST, f"model.path={tiny_model_path}", "reward=model", f"reward.params.path={tiny_rm}", f"run_dir={run}",
            "logger.samples_per_step=16"])  # every rollout of a step (4 prompts x 4) in samples.jsonl
    rows = [r for r in _metrics(run) if "reward_model/score" in r]
    assert len(rows) == 2 and all(0 < r["reward_model/score"] < 1 for r in rows)
    # training accuracy is the `exact` verifier's verdicts (the text after the last #### equals the sum the prompt
    # asks for), not `score >= 1`, which a reward model's scores in (0, 1) never reach
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines() if x.strip()]
    for r in rows:
        own = [x for x in samples if x["step"] == r["step"] and x["source"] == "on_policy"]
        right = [x["completion"].rsplit("####", 1)[-1].strip() == str(sum(int(n) for n in x["prompt"].rstrip("=").split("+")))
                 for x in own]
        assert len(own) == 16 and r["accuracy"] == pytest.approx(sum(right) / 16), (r["step"], r["accuracy"], right)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2


def test_grpo_trains_with_a_judge_behind_a_stand_in_endpoint(tiny_model_path, stand_in, tmp_path):
    url, server = stand_in
    run, before = tmp_path / "run", len(server.calls)
    _train([*FAST, "trainer.max_steps=3", f"model.path={tiny_model_path}", "reward=judge", f"reward.params.url={url}", f"run_dir={run}"])
    rows = [r for r in _metrics(run) if "rewards/judge/mean" in r]
    assert len(rows) == 3 and all(r["judge/unparsable"] == 0 for r in rows)
    assert len(server.calls) > before


def test_a_refused_tokenizer_and_a_down_endpoint_stop_before_the_run_exists(tiny_bpe_model_path, tiny_rm, tmp_path):
    run = tmp_path / "run"
    res = runner.invoke(app, ["train", *FAST, f"model.path={tiny_bpe_model_path}", "reward=model", f"reward.params.path={tiny_rm}",
                              "reward.params.retokenize=false", f"run_dir={run}"])
    assert res.exit_code == 2 and "another tokenizer than the policy" in res.stderr and not run.exists()
    url, server = serve(arith_judge)
    server.shutdown()
    server.server_close()
    res = runner.invoke(app, ["train", *FAST, f"model.path={tiny_bpe_model_path}", "reward=judge", f"reward.params.url={url}",
                              "reward.params.retries=1", "reward.params.backoff_s=0.01", f"run_dir={run}"])
    assert res.exit_code == 2 and "did not answer after 2 tries" in res.stderr and not run.exists()
    assert len([line for line in res.stderr.splitlines() if line.startswith("error:")]) == 1


@pytest.mark.slow
def test_ppo_trains_on_process_rewards_from_a_step_judge(tiny_model_path, stand_in, tmp_path):
    """algo=ppo: the dense step rewards (a stand-in judge per running sum) enter GAE through the critic."""
    url, _ = stand_in
    run = tmp_path / "run"
    _train([*FAST, f"model.path={tiny_model_path}", "algo=ppo", "reward=process", "reward.params.separator=' '",
            f"reward.params.scorer_params.url={url}", f"run_dir={run}"])
    rows = [r for r in _metrics(run) if "rewards/process/mean" in r]
    assert len(rows) == 2 and all(r["process/unparsable"] == 0 for r in rows)
    for row in rows:  # at most the outcome: steps only ever subtract (one assert per value: `make tolerances` records each)
        assert row["rewards/process/mean"] <= 1.0
    assert any(k.startswith("critic/") or k.startswith("loss/value") for k in rows[-1]), sorted(rows[-1])


@pytest.mark.slow
def test_capo_trains_on_process_rewards_per_token_without_a_critic(tiny_model_path, stand_in, tmp_path, monkeypatch):
    """algo.advantage.name=capo: the step rewards reach the policy per token (no critic): the advantages of
    a row differ between its tokens, and the run trains."""
    import mixrl.trainer.trl_hooks.scoring as scoring_mod  # the reward stage calls it (TRL's hooks' work)

    seen = []
    real = scoring_mod.token_credit_inputs

    def spy(out, funcs, weights, acc):
        got = real(out, funcs, weights, acc)
        seen.append(got)
        return got

    monkeypatch.setattr(scoring_mod, "token_credit_inputs", spy)
    url, _ = stand_in
    run = tmp_path / "run"
    _train([*FAST, f"model.path={tiny_model_path}", "algo.advantage.name=capo", "reward=process", "reward.params.separator=' '",
            f"reward.params.scorer_params.url={url}", f"run_dir={run}"])
    assert seen and all(s["token_credit"].shape == s["mask"].shape for s in seen)
    assert any(bool((s["token_credit"] != 0).any()) for s in seen)  # some step was judged wrong: a per-token credit
    rows = [r for r in _metrics(run) if "rewards/process/mean" in r]
    assert len(rows) == 2 and all(math.isfinite(r["loss"]) for r in rows if "loss" in r)


# --------------------------------------------------------------------------- the device of a reward's own model
def test_a_cpu_run_keeps_its_reward_model_on_the_cpu_with_a_gpu_visible(tiny_rm, monkeypatch):
    """A reward model (or a judge served by transformers) loads on the run's device (hardware.device),
    not on whatever GPU is visible (it went to cuda:$LOCAL_RANK on a CPU hardware config)."""
    import torch
    from omegaconf import OmegaConf

    from mixrl.rewards.components import local_device
    from mixrl.trainer.build import build_reward_funcs

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert local_device("cpu") == "cpu" and local_device("cuda") == "cuda:1"
    assert local_device(None) == "cuda:1"  # a reward called outside a run: the visible GPU, as before
    cfg = OmegaConf.create({"reward": {"name": "model", "weight": 1.0, "params": {"path": tiny_rm}, "extra": [], "timeout_s": None},
                            "hardware": {"device": "cpu"}})
    (rm,), _ = build_reward_funcs(cfg)
    assert rm.fn.run_device == "cpu"
    assert rm.fn.model().device.type == "cpu"  # before: .to("cuda:1"), which fails on this CPU-only torch
    process = build_reward("process", scorer="model", scorer_params={"path": tiny_rm}, context=RewardContext(device="cpu"))
    judge = build_reward("judge", backend="hf", path=tiny_rm, context=RewardContext(device="cpu"))
    assert process.fn.scorer.run_device == "cpu" and judge.fn.run_device == "cpu"
