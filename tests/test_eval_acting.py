"""Held-out evaluation that acts (mixrl.evaluation.acting): the tool loop for env=tools (a scripted
model's call is run and its answer after the result scored; a hostile `python` call is contained;
the batched greedy loop equals a row-by-row loop built on TRL 1.16's own suffix code), and a stateful
environment's episodes for env=arith_retry (a retry after "wrong" counts)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from mixrl.evaluation.accuracy import evaluate_accuracy
from mixrl.evaluation.acting import acting_generator, tool_suffix_ids
from mixrl.models import tiny_bpe, tiny_bpe_tools
from mixrl.rewards.builtin import exact_reward
from mixrl.tasks import arith_tools

TOOLS_ENV = OmegaConf.create({"name": "tools", "tools": ["calculator", "python"], "max_tool_calls": 2, "max_turns": None})


@pytest.fixture(scope="module")
def tok():
    return tiny_bpe_tools.set_templates(tiny_bpe.build_tokenizer(tiny_bpe_tools.corpus_texts(n=150), vocab_size=420))


@pytest.fixture(scope="module")
def problems():
    return arith_tools.heldout_split(8)


def _rows(problems):
    return [{"prompt": arith_tools.expert_messages(p)[:2], "answer": p["answer"]} for p in problems]


class Scripted(torch.nn.Module):
    """A model whose turn is ``script(context_text)`` (then end of turn): greedy and batched like
    HF generate (new tokens right-padded), so the loop under test is all that varies."""

    def __init__(self, tok, script):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.tok, self.script = tok, script
        self.config = SimpleNamespace(max_position_embeddings=1 << 20)

    def generate(self, input_ids, attention_mask, max_new_tokens, pad_token_id, **_):
        rows = []
        for ids, m in zip(input_ids.tolist(), attention_mask.tolist()):
            context = self.tok.decode([t for t, k in zip(ids, m) if k])
            rows.append(self.tok(self.script(context) + tiny_bpe.IM_END, add_special_tokens=False)["input_ids"][:max_new_tokens])
        width = max(len(r) for r in rows)
        new = torch.tensor([r + [pad_token_id] * (width - len(r)) for r in rows])
        return torch.cat([input_ids, new], 1)


def _call(name: str, args: dict) -> str:
    import json

    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def _caller(context: str) -> str:
    """Calls the calculator on the prompt's sum, then answers with whatever the tool returned."""
    if "<tool_response>" in context:
        return "#### " + re.findall(r"<tool_response>(.*?)</tool_response>", context)[-1]
    expr = re.findall(r"(\d+\+\d+)=", context)[-1]
    return _call("calculator", {"expression": expr})


def test_tool_call_is_run_and_the_answer_after_its_result_scored(tok, problems):
    rows, reward = _rows(problems), exact_reward()
    model = Scripted(tok, _caller)
    examples: list[dict] = []
    acted = evaluate_accuracy(model, tok, rows, reward, max_new_tokens=64, batch_size=3, examples=examples,
                              generate=acting_generator(TOOLS_ENV), samples=2)
    assert acted["accuracy"] == 1.0 and acted["sampled_accuracy"] == 1.0
    p = problems[0]
    assert f"<tool_response>{p['answer']}</tool_response>" in examples[0]["completion"]
    assert examples[0]["completion"].endswith(f"#### {p['answer']}")
    # without the loop the same model is scored on its unexecuted call (the bug this module fixes)
    plain = evaluate_accuracy(model, tok, rows, reward, max_new_tokens=64)
    assert plain["accuracy"] == 0.0
    # the reward sees TRL's message list: a wrong answer after the result is wrong
    wrong = Scripted(tok, lambda c: "#### 1" if "<tool_response>" in c else _caller(c))
    assert evaluate_accuracy(wrong, tok, rows, reward, max_new_tokens=64, generate=acting_generator(TOOLS_ENV))["accuracy"] == 0.0


def test_max_tool_calls_and_the_budget_end_the_loop(tok, problems):
    """A model that calls forever: env.max_tool_calls rounds run, then the row ends on its last call;
    a budget too small for the result ends the row on its first call (TRL rolls the result back)."""
    rows = _rows(problems[:2])
    looping = Scripted(tok, lambda c: _call("calculator", {"expression": "1+1"}))
    out = acting_generator(TOOLS_ENV)(looping, tok, rows, max_new_tokens=400)
    assert [m["role"] for m in out[0][0]] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert out[0][0][1]["content"] == "2"
    short = acting_generator(TOOLS_ENV)(looping, tok, rows, max_new_tokens=30)
    assert [m["role"] for m in short[0][0]] == ["assistant"]


def test_hostile_python_call_in_eval_is_contained(tok, problems, tmp_path):
    target = tmp_path / "escaped.txt"
    code = f"open({str(target)!r}, 'w').write('x')"
    model = Scripted(tok, lambda c: "#### 0" if "<tool_response>" in c else _call("python", {"code": code}))
    bad_args = Scripted(tok, lambda c: "#### 0" if "<tool_response>" in c else _call("calculator", {"nope": "1"}))
    out = acting_generator(TOOLS_ENV)(model, tok, _rows(problems[:1]), max_new_tokens=4000)[0][0]
    assert out[1]["role"] == "tool" and "refused: open" in out[1]["content"] and not target.exists()
    out = acting_generator(TOOLS_ENV)(bad_args, tok, _rows(problems[:1]), max_new_tokens=4000)[0][0]
    assert out[1]["content"].startswith("{'error': ") and "nope" in out[1]["content"]  # TRL's failure message


def _hand_loop(model, tok, prompt, tools, budget, rounds):
    """One row, unbatched: HF generate, trl's parse_response, the calculator, TRL's own
    GRPOTrainer._get_tool_suffix_ids (trl 1.16, trl/trainer/grpo_trainer.py) for the result's ids."""
    from trl import GRPOTrainer
    from trl.chat_template_utils import parse_response

    me = SimpleNamespace(processing_class=tok, _tokenizer=tok, _is_vlm=False, chat_template=None, chat_template_kwargs={})
    fns = {f.__name__: f for f in tools}

    def gen(ids, n):
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), max_new_tokens=n,
                             do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)[0, len(ids):].tolist()
        return out[: out.index(tok.eos_token_id) + 1] if tok.eos_token_id in out else out

    p_ids = list(tok.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False))
    comp = gen(p_ids, budget)
    msgs = [parse_response(tok, comp, prefix=p_ids, tools=tools)]
    for _ in range(rounds):
        calls = msgs[-1].get("tool_calls")
        if not calls:
            break
        tool_msgs = [{"role": "tool", "name": c["function"]["name"], "content": str(fns[c["function"]["name"]](**c["function"]["arguments"]))}
                     for c in calls]
        hist = p_ids + comp + GRPOTrainer._get_tool_suffix_ids(me, tool_msgs)
        if len(hist) - len(p_ids) > budget:
            break
        msgs += tool_msgs
        post = gen(hist, budget - (len(hist) - len(p_ids)))
        comp = hist[len(p_ids):] + post
        msgs.append(parse_response(tok, post, prefix=hist, tools=tools))
    return msgs, comp


@pytest.mark.slow  # a 3-step warm start of the tool model and TRL's trainer module: ~30 s on the loaded 2-core machine
def test_batched_greedy_loop_equals_a_hand_loop_on_the_tiny_tool_model(problems, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mixrl.tools.builtin import calculator

    path = tiny_bpe_tools.warm_start(tmp_path_factory.mktemp("m"), steps=3, progress=False)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = tiny_bpe_tools.set_templates(AutoTokenizer.from_pretrained(path))
    env = OmegaConf.create({"name": "tools", "tools": ["calculator"], "max_tool_calls": 2, "max_turns": None})
    rows, reward = _rows(problems), exact_reward()
    acted = acting_generator(env)(model, tok, rows, max_new_tokens=64, batch_size=5)
    hand = [_hand_loop(model, tok, r["prompt"], [calculator], 64, 2) for r in rows]
    assert [list(a[0]) for a in acted] == [h[0] for h in hand]
    assert [a[0].text for a in acted] == [tok.decode(h[1], skip_special_tokens=True) for h in hand]
    got = evaluate_accuracy(model, tok, rows, reward, max_new_tokens=64, generate=acting_generator(env))["accuracy"]
    assert got == sum(reward(completions=[h[0]], answer=[r["answer"]])[0] for h, r in zip(hand, rows)) / len(rows)


def test_arith_retry_is_evaluated_over_its_turns(tok):
    """A model that answers wrong first and right after "wrong": solved within env.max_turns=3, not
    within 1; the example shows the observation turn."""
    from mixrl.tasks import arith

    probs = arith.generate(4, seed=0)
    rows = [{"prompt": [{"role": "user", "content": p["prompt"]}], "answer": p["answer"]} for p in probs]
    answers = {p["prompt"]: p["answer"] for p in probs}

    def script(context):
        prompt = max((k for k in answers if k in context), key=len)
        return f"#### {answers[prompt]}" if "wrong" in context else "#### 0"

    model, reward = Scripted(tok, script), exact_reward()
    env = lambda turns: OmegaConf.create({"name": "arith_retry", "tools": [], "max_tool_calls": None, "max_turns": turns})
    examples: list[dict] = []
    assert evaluate_accuracy(model, tok, rows, reward, max_new_tokens=64, generate=acting_generator(env(3)),
                             examples=examples)["accuracy"] == 1.0
    assert "wrong" in examples[0]["completion"] and examples[0]["completion"].endswith(f"#### {probs[0]['answer']}")
    assert evaluate_accuracy(model, tok, rows, reward, max_new_tokens=64, generate=acting_generator(env(1)))["accuracy"] == 0.0
    assert acting_generator(OmegaConf.create({"name": "single"})) is None
