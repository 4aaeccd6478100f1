"""``mixrl data prepare chord-openr1``: CHORD's OpenR1-Math split, as the authors' script makes it.

Reference: Trinity-RFT examples/mix_chord/get_openr1_data.py (commit 9051d637 of the
yanxi-chen/Trinity-RFT mirror). The expected rows below are worked out by hand from its filters
(lines 61-100), and its draws are replayed from its call sequence: random.seed(42) (line 32),
random.sample(filtered, SFT size) (108), random.choice(generations) per sampled problem (112),
then random.sample(RL-eligible rest, RL size) (138).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.data.prepare_chord import SFT_SYSTEM_PROMPT, contains_cjk, int_answer

FIXTURES = Path(__file__).parent / "fixtures"
TOKENIZER = str(FIXTURES / "pin-model")
runner = CliRunner()

LONG = "<think>\n" + "step " * 200 + "\n</think>\n\\boxed{5}"


def _row(problem, answer, generations, correct):
    return {"problem": problem, "solution": "s", "answer": answer, "problem_type": "Algebra",
            "question_type": "math-word-problem", "source": "olympiads", "uuid": problem,
            "is_reasoning_complete": [True] * len(generations), "generations": generations,
            "correctness_math_verify": correct, "correctness_llama": None, "finish_reasons": None,
            "correctness_count": sum(correct), "messages": []}


def g(text):
    return f"<think>\n{text}\n</think>\n\\boxed{{{text}}}"


ROWS = [
    _row("Add 1 and 2.", "3", [g("3"), g("1+2")], [True, True]),          # 0 kept, 2 traces, int: RL-eligible
    _row("计算 1 + 1", "2", [g("2"), g("2")], [True, True]),                 # 1 CJK problem: dropped
    _row("Half of 3?", "\\frac{3}{2}", [g("1.5"), g("3/2")], [True, True]),  # 2 kept, answer not int: SFT only
    _row("Times 3 4", "12", [g("12"), g("13")], [True, False]),            # 3 one verified trace: SFT only
    _row("Five", "5", [LONG, g("5")], [True, True]),                      # 4 long trace dropped: 1 kept, SFT only
    _row("All wrong", "7", [g("6"), g("8")], [False, False]),             # 5 none verified: dropped
    _row("Short list", "4", [g("4"), g("2+2"), g("4.0")], [True, True]),   # 6 third trace has no verdict: 2 kept
    _row("Padded", " 8 ", [g("8"), g("2*4")], [True, True]),              # 7 int(" 8 ") = 8: RL-eligible
    *[_row(f"Plus {i}", str(i + 1), [g(str(i + 1)), g(f"{i}+1")], [True, True]) for i in range(10, 16)],  # 8-13
]
#: by hand: rows 1 and 5 dropped; row 4 keeps its short trace; row 6 keeps two traces
KEPT = {0: 2, 2: 2, 3: 1, 4: 1, 6: 2, 7: 2, **{i: 2 for i in range(8, 14)}}


def _sample(tmp_path: Path) -> Path:
    path = tmp_path / "openr1.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ROWS), encoding="utf-8")
    return path


def _max_tokens() -> int:
    """A budget that keeps every short trace and drops LONG (both measured with the tokenizer)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    short = max(len(tok.tokenize(t)) for r in ROWS for t in r["generations"] if t != LONG)
    assert len(tok.tokenize(LONG)) > short + 10
    return short + 5


def _authors_draws(sft_size: int, rl_size: int):
    """Their script's draws on the filtered rows (worked out above), replayed call by call."""
    filtered = []
    for i, n in KEPT.items():
        r = ROWS[i]
        gens = [t for t, c in zip(r["generations"], r["correctness_math_verify"]) if c and t != LONG][:n]
        filtered.append({"problem": r["problem"], "answer": r["answer"], "generations": gens})
    rng = random.Random(42)
    sampled = rng.sample(filtered, min(sft_size, len(filtered)))
    sft = [(d["problem"], rng.choice(d["generations"])) for d in sampled]
    rest = [d for d in filtered if d not in sampled]
    eligible = [d for d in rest if d["answer"].strip().isdigit() and len(d["generations"]) >= 2]
    rl = [(d["problem"], d["answer"]) for d in rng.sample(eligible, min(rl_size, len(eligible)))]
    return filtered, sft, rl


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _prepare(src, out, *extra):
    return runner.invoke(app, ["data", "prepare", "chord-openr1", "--source", str(src), "--out", str(out),
                               "--tokenizer", TOKENIZER, *extra])


def test_filters_by_hand():
    assert contains_cjk("计算") and contains_cjk("\u3400") and not contains_cjk("x^2 + 1 = 0, é")
    assert int_answer("12") and int_answer(" 8 ") and int_answer("-3") and int_answer(7)
    assert not int_answer("\\frac{3}{2}") and not int_answer("1.5") and not int_answer(None)


def test_prepare_matches_the_authors_draws(tmp_path):
    out = tmp_path / "chord"
    res = _prepare(_sample(tmp_path), out, "--sft-size", "4", "--rl-size", "5", "--max-tokens", str(_max_tokens()))
    assert res.exit_code == 0, res.output
    filtered, sft_want, rl_want = _authors_draws(4, 5)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["rows"] == {"source": len(ROWS), "filtered": len(KEPT), "sft": 4, "rl": 5}
    assert manifest["seed"] == 42 and manifest["max_tokens"] == _max_tokens()
    sft, rl = _read(out / "sft" / "train.jsonl"), _read(out / "rl" / "train.jsonl")
    assert [(r["problem"], r["response"]) for r in sft] == sft_want
    assert [(r["problem"], r["answer"]) for r in rl] == rl_want
    for r in sft:
        assert r["messages"] == [{"role": "system", "content": SFT_SYSTEM_PROMPT},
                                 {"role": "user", "content": r["problem"]},
                                 {"role": "assistant", "content": r["response"]}]
        assert r["response"] != LONG
    assert set(rl[0]) == {"problem", "answer"}
    # disjoint; RL rows have integer answers and two kept traces; CJK and unverified rows nowhere
    assert not {r["problem"] for r in sft} & {r["problem"] for r in rl}
    assert all(KEPT[[x["problem"] for x in ROWS].index(r["problem"])] >= 2 and int_answer(r["answer"]) for r in rl)
    assert not {"计算 1 + 1", "All wrong"} & {r["problem"] for r in sft + rl}
    # deterministic: a second run into the same folder writes the same bytes
    before = {p: (out / p).read_bytes() for p in ("sft/train.jsonl", "rl/train.jsonl")}
    assert _prepare(_sample(tmp_path), out, "--sft-size", "4", "--rl-size", "5",
                    "--max-tokens", str(_max_tokens())).exit_code == 0
    assert {p: (out / p).read_bytes() for p in before} == before


def test_prepared_data_loads_in_the_chord_recipe(tmp_path):
    from mixrl.config.compose import compose_config
    from mixrl.sources import SOURCES
    from mixrl.trainer.build import load_train_rows

    out = tmp_path / "chord"
    res = _prepare(_sample(tmp_path), out, "--sft-size", "3", "--rl-size", "5", "--max-tokens", str(_max_tokens()))
    assert res.exit_code == 0, res.output
    cfg = compose_config(["recipe=chord/qwen2.5-7b-openr1", f"data.source={out / 'rl'}",
                          f"offpolicy.source.dataset={out / 'sft'}"])
    train = load_train_rows(cfg)
    assert len(train) == json.loads((out / "manifest.json").read_text())["rows"]["rl"] > 0
    assert train[0]["prompt"][0] == {"role": "system", "content": cfg.data.system_prompt}
    src = SOURCES.get("expert")(dataset=cfg.offpolicy.source.dataset, column=cfg.offpolicy.source.column)
    src.prepare(train, cfg.data)
    assert len(src.pool) == 3 and all(p["expert"][0].startswith("<think>") for p in src.pool)


@pytest.mark.parametrize("case, needle", [
    ("missing-file", "not found"),
    ("missing-columns", "lacks the OpenR1-Math column(s) problem, generations, correctness_math_verify"),
    ("foreign-out", "holds files this command did not write"),
    ("unknown-name", "unknown preparation"),
])
def test_one_line_refusals(tmp_path, case, needle):
    out = tmp_path / "out"
    src = FIXTURES / "openr1_math.jsonl"
    if case == "missing-file":
        src = tmp_path / "nope.jsonl"
    elif case == "missing-columns":
        src = FIXTURES / "gsm8k.jsonl"
    elif case == "foreign-out":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    args = ["data", "prepare", "chord-openr2" if case == "unknown-name" else "chord-openr1", "--source", str(src),
            "--out", str(out), "--tokenizer", TOKENIZER]
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], res.output
    if case == "foreign-out":
        assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
