"""Write the rehearsal's schema samples, mixrl/data/samples/<data config>.jsonl (package data), one per
conf/data/*.yaml that names a hub dataset: ``python scripts/make_rehearsal_samples.py``.

Each file has the hub dataset's own columns, types and nesting (sources in mixrl/data/samples/README.md);
the problems are small arithmetic word problems made up here, so that the built-in BPE model's context
holds them and math-verify checks their answers (``\\boxed{}`` in every expert trace, ``#### N`` for GSM8K).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "mixrl" / "data" / "samples"
N = 24

#: LUFFY's system prompt (ElliottYan/LUFFY luffy/scripts/data/prepare_openr1_data_spec_sys.py), shortened to its last sentence
LUFFY_SYSTEM = "If applicable, include the answer in \\boxed{} for closed-form results like multiple choices or mathematical solutions."


def problems() -> list[dict]:
    """N problems: a word problem, its numbers, the answer, a short worked solution."""
    out = []
    for i in range(N):
        a, b, c = 3 + (7 * i) % 41, 2 + (5 * i) % 17, 1 + i % 6
        kind = i % 4
        if kind == 0:
            q, ans = f"What is {a} + {b}?", a + b
            work = f"{a} + {b} = {a + b}"
            gsm = f"Ann has {a} apples and buys {b} more. How many apples does she have?"
            calc = f"She has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples."
        elif kind == 1:
            q, ans = f"What is {a} + {b} - {c}?", a + b - c
            work = f"{a} + {b} = {a + b}, then {a + b} - {c} = {a + b - c}"
            gsm = f"A shelf holds {a} books. {b} are added and {c} are taken. How many books are on it?"
            calc = f"After adding there are {a} + {b} = <<{a}+{b}={a + b}>>{a + b} books.\nAfter taking some there are {a + b} - {c} = <<{a + b}-{c}={a + b - c}>>{a + b - c} books."
        elif kind == 2:
            q, ans = f"Compute {c} * {b}.", c * b
            work = f"{c} * {b} = {c * b}"
            gsm = f"Tom has {c} boxes with {b} pens each. How many pens does he have?"
            calc = f"He has {c} * {b} = <<{c}*{b}={c * b}>>{c * b} pens."
        else:
            q, ans = f"Find x if x - {b} = {a}.", a + b
            work = f"x = {a} + {b} = {a + b}"
            gsm = f"After spending ${b}, Maria has ${a} left. How much did she have?"
            calc = f"She had {a} + {b} = <<{a}+{b}={a + b}>>{a + b} dollars."
        out.append({"i": i, "problem": q, "answer": str(ans), "work": work, "gsm": gsm, "calc": calc})
    return out


def trace(p: dict) -> str:
    """An R1-style trace: thinking, then the answer boxed."""
    return f"<think>\n{p['work']}\n</think>\nThe answer is $\\boxed{{{p['answer']}}}$."


def openr1(ps: list[dict]) -> list[dict]:
    rows = []
    for p in ps:
        wrong = f"<think>\n{p['work']}? Not sure.\n</think>\n$\\boxed{{{int(p['answer']) + 1}}}$"
        gens = [trace(p), wrong] if p["i"] % 3 == 0 else [trace(p)]
        correct = [True, False] if p["i"] % 3 == 0 else [True]
        rows.append({
            "problem": p["problem"],
            "solution": f"${p['work']}$, so the answer is ${p['answer']}$.",
            "answer": p["answer"],
            "problem_type": "Algebra",
            "question_type": "math-word-problem",
            "source": "olympiads" if p["i"] % 2 else "cn_contest",
            "uuid": f"5e1f0000-0000-4000-8000-{p['i']:012d}",
            "is_reasoning_complete": [True] * len(gens),
            "generations": gens,
            "correctness_math_verify": correct,
            "correctness_llama": None,
            "finish_reasons": None,
            "correctness_count": sum(correct),
            "messages": [{"content": p["problem"], "role": "user"}, {"content": gens[0], "role": "assistant"}],
        })
    return rows


def luffy(ps: list[dict]) -> list[dict]:
    return [{
        "data_source": "openr1",
        "prompt": [{"content": LUFFY_SYSTEM, "role": "system"}, {"content": p["problem"], "role": "user"}],
        "target": [{"content": trace(p), "role": "assistant"}],
        "ability": "math",
        "reward_model": {"ground_truth": p["answer"], "style": "rule"},
        "extra_info": {"index": p["i"], "split": "default"},
    } for p in ps]


def critique_grpo(ps: list[dict]) -> list[dict]:
    """data=critique-grpo-openr1-4k: verl rows as the authors' openr1_math_4k_train_qwenformat/ parquet
    files hold them (zhangxy-2019/critique-GRPO @ e8f03a20): the chat prompt with their system message
    and instruction, the gold answer in reward_model.ground_truth; no expert trace."""
    return [{
        "data_source": "openr1",
        "prompt": [{"content": "You are a helpful assistant.", "role": "system"},
                   {"content": f"{p['problem']}\nPlease reason step by step, and put your final answer within \\boxed{{}}.",
                    "role": "user"}],
        "ability": "math",
        "reward_model": {"ground_truth": p["answer"], "style": "rule"},
        "extra_info": {"index": p["i"], "split": "default"},
    } for p in ps]


#: AMPO's system prompt (EnigmaYYYY/AMPO @ 647e2e4, data/valid.parquet: every row's system message)
AMPO_SYSTEM = ("You are a helpful assistant. Please reason step by step to solve the problem and put the final answer "
               "within the <answer> </answer> tags.")


def ampo(ps: list[dict]) -> list[dict]:
    """data=ampo-openr1-4longcots (SII-Enigma/OpenR1-Math-4LongCoTs-8.5k): verl rows as the authors'
    reader takes them (EnigmaYYYY/AMPO @ 647e2e4, ampo/verl/verl/adaptive_mix_src/rl_dataset_with_target.py:
    83, 186-207): the chat prompt with their system message, the gold answer in reward_model.ground_truth,
    and ``target_lst``: 4 teacher answers {content, source, quality_score}, one of them wrong (the authors
    inject answers whether right or wrong); the teacher names are made up."""
    rows = []
    for p in ps:
        right = f"<think>\n{p['work']}\n</think>\n<answer>$\\boxed{{{p['answer']}}}$</answer>"
        wrong = f"<think>\n{p['work']}? Not sure.\n</think>\n<answer>$\\boxed{{{int(p['answer']) + 1}}}$</answer>"
        answers = [right, f"Quickly: {right}", wrong, f"Checking again. {right}"]
        rows.append({
            "data_source": "openr1",
            "prompt": [{"content": AMPO_SYSTEM, "role": "system"}, {"content": p["problem"], "role": "user"}],
            "target_lst": [{"content": a, "source": f"teacher-{k + 1}", "quality_score": float(4 - k)}
                           for k, a in enumerate(answers)],
            "ability": "math",
            "reward_model": {"ground_truth": p["answer"], "style": "rule"},
            "extra_info": {"index": p["i"], "split": "default"},
        })
    return rows


def ghpo(ps: list[dict]) -> list[dict]:
    return [{
        "problem": p["problem"],
        "solution": f"${p['work']}$. The answer is $\\boxed{{{p['answer']}}}$.",
        "solution_hint": f"First, {p['work']}. So the final answer is $\\boxed{{{p['answer']}}}$.",
    } for p in ps]


def chord_openr1(openr1_rows: list[dict]) -> list[dict]:
    """data=chord-openr1 (what `mixrl data prepare chord-openr1` writes): one file serving as both the
    RL rows (problem, answer) and the SFT rows (response: the first verified trace)."""
    out = []
    for r in openr1_rows:
        traces = [g for g, ok in zip(r["generations"], r["correctness_math_verify"]) if ok]
        if traces:
            out.append({"problem": r["problem"], "answer": r["answer"], "response": traces[0]})
    return out


def gsm8k(ps: list[dict]) -> list[dict]:
    return [{"question": p["gsm"], "answer": f"{p['calc']}\n#### {p['answer']}"} for p in ps]


def ultrafeedback(ps: list[dict]) -> list[dict]:
    """HuggingFaceH4/ultrafeedback_binarized (split train_prefs): the prompt, its sha256 id, the chosen and
    rejected conversations (user turn + assistant reply), ``messages`` (= chosen) and both GPT-4 scores."""
    rows = []
    for p in ps:
        user = {"content": p["gsm"], "role": "user"}
        good = f"{p['calc']} The answer is {p['answer']}."
        bad = f"I think it is {int(p['answer']) + 1 + p['i'] % 3}."
        chosen = [user, {"content": good, "role": "assistant"}]
        rows.append({
            "prompt": p["gsm"],
            "prompt_id": hashlib.sha256(p["gsm"].encode()).hexdigest(),
            "chosen": chosen,
            "rejected": [user, {"content": bad, "role": "assistant"}],
            "messages": chosen,
            "score_chosen": 8.0 + p["i"] % 3,
            "score_rejected": 2.0 + p["i"] % 4 * 0.5,
        })
    return rows


def write(name: str, rows: list[dict]) -> None:
    with open(OUT / f"{name}.jsonl", "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def main() -> None:
    ps = problems()
    write("openr1-math", openr1(ps))
    write("chord-openr1", chord_openr1(openr1(ps)))
    write("luffy-openr1-46k", luffy(ps))
    write("critique-grpo-openr1-4k", critique_grpo(ps))
    write("ampo-openr1-4longcots", ampo(ps))
    write("ghpo-math3to5", ghpo(ps))
    write("gsm8k", gsm8k(ps))
    write("ultrafeedback-binarized", ultrafeedback(ps))


if __name__ == "__main__":
    main()
