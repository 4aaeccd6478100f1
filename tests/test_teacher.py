"""The teacher source: configuration, privileged prompts, tokenizer check, and the per-token
teacher log-probs the trainer computes once per generation batch (checked against an
independent forward of the teacher)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from mixrl.config.compose import compose_config
from mixrl.errors import ConfigError
from mixrl.sources.teacher import TeacherSource, combine_logps

ONE = ["hardware.torch_threads=1", "logger.progress=false"]


@pytest.fixture(scope="session")
def throwaway_teacher(tiny_teacher_path) -> str:
    """A tiny teacher warm-started for 8 steps (seconds, conftest): same tokenizer as the test student,
    other weights."""
    return tiny_teacher_path


# --------------------------------------------------------------------------- source
def test_privileged_prompts_follow_the_template():
    t = TeacherSource(models=["self"], privileged="expert", template="{privileged} | {prompt}")
    row = {"prompt": "3+5=", "expert": ["8 #### 8"], "answer": "8"}
    assert t.teacher_prompt(row) == "8 #### 8 | 3+5="
    assert t.teacher_prompt({"prompt": "3+5=", "expert": []}) is None  # no context: the row is not scored
    conv = {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}], "answer": "42"}
    a = TeacherSource(models=["self"], privileged="answer", template="{prompt} (answer: {privileged})")
    out = a.teacher_prompt(conv)
    assert out[1]["content"] == "q (answer: 42)" and out[0]["content"] == "s"
    assert conv["prompt"][1]["content"] == "q"  # the row itself is untouched
    assert t.reads_expert_column and not a.reads_expert_column


@pytest.mark.parametrize("kwargs, words", [
    ({"models": []}, "empty"),
    ({"privileged": "hint"}, "privileged"),
    ({"privileged": "expert", "template": "{prompt}"}, "{privileged}"),
    ({"combine": "max"}, "combine"),
])
def test_bad_teacher_parameters_are_refused(kwargs, words):
    with pytest.raises(ValueError, match=words.replace("{", r"\{").replace("}", r"\}")):
        TeacherSource(**kwargs)


def test_a_teacher_template_may_use_only_its_placeholders():
    with pytest.raises(ConfigError, match=re.escape("teacher.source.template='{prompt} {context}' has an unknown placeholder {context}")):
        TeacherSource(privileged="expert", template="{prompt} {context}")
    with pytest.raises(ConfigError, match="teacher.source.template"):
        compose_config(["algo=opsd", "teacher.source.template='{privileged} {prompt} {x}'"])
    assert TeacherSource(privileged="answer", template="{prompt} (answer: {privileged})").texts() == [" (answer: )"]


def test_several_teachers_combine_by_hand():
    a, b = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-3.0, -0.5]])
    mix = combine_logps([a, b], "mixture")
    assert mix[0].tolist() == pytest.approx([math.log((math.exp(-1) + math.exp(-3)) / 2),
                                             math.log((math.exp(-2) + math.exp(-0.5)) / 2)])
    assert combine_logps([a, b], "mean")[0].tolist() == pytest.approx([-2.0, -1.25])
    assert combine_logps([a]) is a


def test_another_tokenizer_is_a_one_line_config_error(tmp_path, tiny_model_path):
    from transformers import AutoTokenizer

    from mixrl.models import tiny_arch

    student = AutoTokenizer.from_pretrained(tiny_model_path)
    vocab = dict(student.get_vocab())
    vocab["x"] = len(vocab)  # one more character
    tiny_arch.tokenizer_from_vocab(vocab).save_pretrained(tmp_path / "other")
    t = TeacherSource(models=[str(tmp_path / "other")])
    t.resolve()
    with pytest.raises(ConfigError) as e:
        t.check_tokenizer(student)
    assert "another tokenizer" in str(e.value) and "\n" not in str(e.value)
    TeacherSource(models=[tiny_model_path]).check_tokenizer(student)  # the same vocabulary passes


# --------------------------------------------------------------------------- config
@pytest.mark.parametrize("overrides, words", [
    (["algo=kdrl", "teacher=none"], "no teacher is configured"),
    (["teacher=tiny"], "no term reads teacher log-probs"),
    (["algo=ampo", "teacher=self"], "needs teacher models that generate"),
    (["algo=opd", "teacher=model", "teacher.source.models=[]"], "models is empty"),
    (["algo=opd", "teacher.source.privileged=hint"], "privileged must be"),
])
def test_teacher_config_errors_name_the_key_and_the_fix(overrides, words):
    with pytest.raises(ConfigError, match=words):
        compose_config(overrides)


def test_teacher_algos_compose():
    for algo in ("opd", "exopd", "kdrl", "opsd", "ampo"):
        cfg = compose_config([f"algo={algo}"])
        assert cfg.teacher.source.name == "teacher"
    assert list(compose_config(["algo=opsd"]).teacher.source.models) == ["self"]
    assert compose_config(["algo=kdrl", "algo.beta=0.3"]).algo.coefs.beta == 0.3


# --------------------------------------------------------------------------- trainer
def _build(overrides, model_path, run_dir):
    from mixrl.trainer import build

    cfg = compose_config([*overrides, f"model.path={model_path}", f"run_dir={run_dir}"])  # seed 0; threads: ONE
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    return build.trainer_from_config(cfg)


def _reference_logps(model, prompt: list[int], completion: list[int]) -> list[float]:
    """log softmax of a plain forward (no TRL), at temperature 1."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    start = len(prompt) - 1
    return [float(lp[start + k, tok]) for k, tok in enumerate(completion)]


def _record(trainer, snapshot_policy: str | None = None):
    """Record every teacher scoring; ``snapshot_policy`` (the model folder): also keep a plain
    copy of the policy as it was when the batch was scored (a deepcopy would share TRL's patched
    forward with the live model)."""
    from transformers import AutoModelForCausalLM

    calls = []
    original = trainer.parts.teachers.logps

    def wrapped(live_policy, out, inputs):
        policy = None
        if snapshot_policy:
            policy = AutoModelForCausalLM.from_pretrained(snapshot_policy).eval()
            policy.load_state_dict({k: v.detach().clone() for k, v in trainer.model.state_dict().items()})
        result, entropy, metrics = original(live_policy, out, inputs)
        calls.append({"out": {k: (v.clone() if torch.is_tensor(v) else v) for k, v in out.items()},
                      "inputs": list(inputs), "result": result.clone(), "policy": policy})
        return result, entropy, metrics

    trainer.parts.teachers.logps = wrapped
    return calls


FAST_TEACHER = [*ONE, "trainer.max_steps=2", "trainer.prompts_per_step=4", "algo.num_generations=4",
                "trainer.micro_batch_size=8", "trainer.eval_size=0", "data.train_size=64", "trainer.save_steps=0",
                "trainer.max_completion_length=24"]


def test_teacher_logp_is_the_frozen_teachers_forward_once_per_generation_batch(tiny_model_path, throwaway_teacher, tmp_path):
    trainer = _build([*FAST_TEACHER, "algo=kdrl", f"teacher.source.models=[{throwaway_teacher}]"], tiny_model_path, tmp_path / "run")
    teacher = trainer.parts.teachers.models[0]
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    calls = _record(trainer)
    losses = []
    compute_loss = trainer._compute_loss
    trainer._compute_loss = lambda *a, **k: losses.append(1) or compute_loss(*a, **k)
    trainer.train()
    # 2 optimizer steps x 2 micro-batches: 4 loss computations, 2 generation batches, 2 teacher scorings
    assert len(losses) == 4 and len(calls) == 2
    assert all(not p.requires_grad for p in teacher.parameters())
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())  # frozen: never updated
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(throwaway_teacher).eval()
    for call in calls:
        out, result = call["out"], call["result"]
        assert not result.requires_grad
        mask = out["completion_mask"].bool()
        assert torch.isnan(result[~mask]).all() and torch.isfinite(result[mask]).all()
        for i in range(mask.shape[0]):
            prompt = out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist()
            completion = out["completion_ids"][i][mask[i]].tolist()
            expect = _reference_logps(ref, prompt, completion)
            assert result[i, : len(completion)].tolist() == pytest.approx(expect, abs=1e-4)
    metrics = trainer.state.log_history[0]
    assert metrics["teacher/scored_tokens"] == float(calls[0]["out"]["completion_mask"].sum())
    assert "loss/distill" in metrics and "beta" in metrics


def test_privileged_self_teacher_scores_with_the_solution_in_its_prompt(tiny_model_path, tmp_path):
    trainer = _build([*FAST_TEACHER, "algo=opsd", "trainer.max_steps=1", "teacher.source.template='{privileged} {prompt}'"],
                     tiny_model_path, tmp_path / "run")
    assert trainer.parts.teachers.models and trainer.parts.teachers.spec.is_self  # no second model loaded
    calls = _record(trainer, snapshot_policy=tiny_model_path)
    trainer.train()
    assert len(calls) == 1
    call = calls[0]
    tok = trainer.processing_class
    out, result, policy = call["out"], call["result"], call["policy"]
    mask = out["completion_mask"].bool()
    for i, row in enumerate(call["inputs"]):
        text = f"{row['expert'][0]} {row['prompt']}"
        prompt = tok(text)["input_ids"]
        completion = out["completion_ids"][i][mask[i]].tolist()
        expect = _reference_logps(policy, prompt, completion)
        assert result[i, : len(completion)].tolist() == pytest.approx(expect, abs=1e-4)
        plain = _reference_logps(policy, out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist(), completion)
        assert plain != pytest.approx(expect, abs=1e-4)  # the context changes the teacher's distribution


def test_exopd_trains_2_steps_against_the_frozen_starting_student(tiny_model_path, throwaway_teacher, tmp_path):
    """algo=exopd (gopd_reward): the reference log-probs are those of the starting student at every
    step (TRL's frozen reference model), so after one update they differ from the behaviour
    log-probs and lam = 1.25 extrapolates against a fixed point rather than scaling OPD's step."""
    from transformers import AutoModelForCausalLM

    trainer = _build([*FAST_TEACHER, "algo=exopd", f"teacher.source.models=[{throwaway_teacher}]"], tiny_model_path, tmp_path / "run")
    seen = []
    compute_loss = trainer._compute_loss

    def spy(model, inputs):
        seen.append({k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in inputs.items()})
        return compute_loss(model, inputs)

    trainer._compute_loss = spy
    trainer.train()
    assert int(trainer.state.global_step) == 2 and len(seen) == 4
    start = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    last = seen[-1]  # step 2: the policy has had one update
    mask = last["completion_mask"].bool()
    for i in range(2):
        prompt = last["prompt_ids"][i][last["prompt_mask"][i].bool()].tolist()
        completion = last["completion_ids"][i][mask[i]].tolist()
        assert last["ref_per_token_logps"][i, : len(completion)].tolist() == pytest.approx(
            _reference_logps(start, prompt, completion), abs=1e-4)
    logs = [h for h in trainer.state.log_history if "loss/distill" in h]
    assert len(logs) == 2 and all(math.isfinite(h["loss/distill"]) for h in logs)
    assert "opd/teacher_vs_ref" in logs[0]
