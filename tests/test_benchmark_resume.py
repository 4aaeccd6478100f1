"""A resumed ``mixrl eval MODEL benchmarks=...`` equals an uninterrupted one (issue 50): every
sample is drawn from (seed, problem, sample index) alone, a torn or foreign line of the samples
file is dropped and its sample drawn again, a sample is never counted twice, and the cache's
other mistakes (a file where the folder should be, a row without a gold answer) are one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mixrl.cli import benchmarks as command
from mixrl.cli.main import app

from conftest import fail_model_loading

cli = CliRunner()
FIXTURES = Path(__file__).parent / "fixtures" / "benchmarks"


def _eval(model, cache, *extra):
    return command.evaluate(model, ["benchmarks=arith", f"benchmarks.cache_dir={cache}", "trainer.eval_size=12",
                                    "benchmarks.arith.protocol.samples=4", "benchmarks.arith.protocol.temperature=1.0",
                                    "benchmarks.arith.protocol.metrics=[avg@4,pass@4]", "benchmarks.backend=hf",
                                    "trainer.max_completion_length=8", "hardware.torch_threads=1",
                                    "trainer.eval_batch_size=6", *extra], quiet=True)


def _by_pair(path) -> dict:
    out = {}
    for line in Path(path).read_bytes().splitlines():
        try:
            r = json.loads(line)
        except ValueError:  # the torn line stays in the file, skipped
            continue
        out.setdefault((r["problem"], r["sample"]), r["completion"])
    return out


def test_a_resumed_evaluation_equals_an_uninterrupted_one(tiny_model_path, tmp_path):
    whole = _eval(tiny_model_path, tmp_path / "a")["benchmarks"][0]
    assert whole["generated"] == 48 and whole["reused"] == 0
    want = _by_pair(whole["samples_file"])
    assert len(set(want.values())) > 12  # sampled: the pairs differ

    first = _eval(tiny_model_path, tmp_path / "b")["benchmarks"][0]
    path = Path(first["samples_file"])
    data = path.read_bytes()
    cut = data.index(b"\n", len(data) * 3 // 7) + 15  # a kill during a write: the file ends inside a line
    path.write_bytes(data[:cut])
    kept = data[:cut].count(b"\n")
    again = _eval(tiny_model_path, tmp_path / "b")["benchmarks"][0]
    assert (again["reused"], again["generated"]) == (kept, 48 - kept)
    assert again["metrics"] == whole["metrics"] and again["per_problem"] == whole["per_problem"]
    assert again["skipped_lines"] == 1 and _by_pair(path) == want
    third = _eval(tiny_model_path, tmp_path / "b")["benchmarks"][0]  # the torn line swallowed no record
    assert (third["reused"], third["generated"], third["skipped_lines"]) == (48, 0, 1)
    assert third["metrics"] == whole["metrics"]


def test_which_samples_are_cached_changes_no_other_sample(tiny_model_path, tmp_path):
    """Samples scattered over the batches missing (not a cut at the end): the rest are drawn as before."""
    whole = _eval(tiny_model_path, tmp_path / "a")["benchmarks"][0]
    want = _by_pair(whole["samples_file"])
    path = Path(_eval(tiny_model_path, tmp_path / "b")["benchmarks"][0]["samples_file"])
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(line for i, line in enumerate(lines) if i % 5 != 2))
    again = _eval(tiny_model_path, tmp_path / "b")["benchmarks"][0]
    assert again["generated"] == sum(1 for i in range(48) if i % 5 == 2)
    assert again["metrics"] == whole["metrics"] and _by_pair(path) == want


def test_foreign_duplicated_and_non_utf8_lines_are_skipped_and_counted_once(tiny_model_path, tmp_path):
    whole = _eval(tiny_model_path, tmp_path)["benchmarks"][0]
    path = Path(whole["samples_file"])
    lines = path.read_bytes().splitlines(keepends=True)
    first = json.loads(lines[0])
    wrong = json.dumps({**first, "correct": not first["correct"]}).encode() + b"\n"  # a second copy of pair 0, disagreeing
    path.write_bytes(b"".join([b"\xff\xfe not utf-8\n", b"[1, 2]\n", b"{\"problem\": \"x\"}\n", *lines, wrong, lines[3]]))
    again = _eval(tiny_model_path, tmp_path)["benchmarks"][0]
    assert (again["reused"], again["generated"]) == (48, 0)
    assert again["metrics"] == whole["metrics"]  # the first copy of a pair counts, once
    assert again["skipped_lines"] == 3


def test_a_cache_dir_that_is_a_file_is_one_line_before_any_model_loads(tiny_model_path, tmp_path, monkeypatch):
    monkeypatch.setattr("mixrl.evaluation.saved.load_saved_model", fail_model_loading)
    f = tmp_path / "cache"
    f.write_text("")
    res = cli.invoke(app, ["eval", tiny_model_path, "benchmarks=aime24", f"benchmarks.source_dir={FIXTURES}",
                           f"benchmarks.cache_dir={f}"])
    assert res.exit_code == 2, res.output[-2000:]
    assert "benchmarks.cache_dir" in res.stderr and "not a folder" in res.stderr
    assert res.stderr.count("\n") <= 2 and "Traceback" not in res.output


def test_a_row_without_a_gold_answer_is_refused_naming_it(tiny_model_path, tmp_path, monkeypatch):
    monkeypatch.setattr("mixrl.evaluation.saved.load_saved_model", fail_model_loading)
    rows = [json.loads(line) for line in (FIXTURES / "aime24.jsonl").read_text().splitlines()]
    rows[1]["answer"] = None
    src = tmp_path / "aime.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = cli.invoke(app, ["eval", tiny_model_path, "benchmarks=aime24", f"benchmarks.aime24.source={src}",
                           f"benchmarks.cache_dir={tmp_path / 'c'}"])
    assert res.exit_code == 2, res.output[-2000:]
    last = res.stderr.strip().splitlines()[-1]  # (after the datasets library's progress line)
    assert "row 1 " in last and "no gold answer" in last and "Traceback" not in res.output
    assert not (tmp_path / "c").exists()


def test_vllm_requests_are_seeded_per_pair(monkeypatch):
    """vLLM's path (faked here: vllm is optional): one request per (problem, sample) pair, its seed
    ``pair_seed(seed, pair)``, whatever else is in the call."""
    import sys
    import types

    from mixrl.benchmarks import runner
    from mixrl.benchmarks.engine import pair_seed

    seen = []

    class SamplingParams:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    class LLM:
        def __init__(self, model, **kw):
            self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=64))

        def generate(self, requests, params, use_tqdm=False):
            seen.extend(params)
            return [types.SimpleNamespace(outputs=[types.SimpleNamespace(text=f"s{p.seed}")]) for p in params]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    tok = lambda text, add_special_tokens=True: {"input_ids": [1, 2, 3]}  # noqa: E731
    gen = runner.VLLMGenerator("m", tok, dtype="float32")
    out = gen.generate(["a", "a", "b"], pairs=[5, 6, 9], temperature=0.6, top_p=0.95, max_new_tokens=8, seed=3)
    assert out == [f"s{pair_seed(3, j)}" for j in (5, 6, 9)]
    assert [(p.n, p.temperature, p.top_p, p.max_tokens) for p in seen] == [(1, 0.6, 0.95, 8)] * 3
    seen.clear()
    assert gen.generate(["b"], pairs=[9], temperature=0.6, top_p=0.95, max_new_tokens=8, seed=3) == [out[2]]


class _Echo:
    """A generator whose completion names its pair and the whole batch it was drawn in."""

    name = "echo"

    def __init__(self):
        self.calls = []

    def generate(self, prompts, *, pairs, temperature, top_p, max_new_tokens, seed):
        self.calls.append(list(pairs))
        return [f"{seed}:{j} in {pairs}" for j in pairs]


def _aime(tmp_path):
    from mixrl.benchmarks import data, spec

    (bench,) = spec.select(["benchmarks=aime24", f"benchmarks.source_dir={FIXTURES}", "benchmarks.aime24.protocol.samples=3",
                            "benchmarks.aime24.protocol.temperature=1.0"]).benchmarks
    return bench, data.load_problems(bench)


def test_a_batch_with_a_sample_missing_is_drawn_whole_as_it_was(tmp_path):
    """Model-free: batches are a fixed grid over the pairs, so a resumed sample comes from the very
    batch it came from in the uninterrupted run, and only missing samples are written."""
    from mixrl.benchmarks import runner

    bench, problems = _aime(tmp_path)
    prompts = [p.problem for p in problems]

    def run(gen):
        return runner.evaluate_benchmark(bench, problems, prompts=prompts, generator_factory=lambda: gen,
                                         scorer=lambda ps, ts, es: [False] * len(ts), key="k", cache_dir=tmp_path,
                                         max_new_tokens=4, batch_size=4, seed=5)

    whole = _Echo()
    res = run(whole)
    assert whole.calls == [[0, 1, 2, 3], [4, 5, 6, 7], [8]] and res["generated"] == 9
    path = Path(res["samples_file"])
    want = _by_pair(path)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:5]) + lines[5][:9])  # pairs 0-4 kept, pair 5 torn
    again = _Echo()
    res = run(again)
    assert again.calls == [[4, 5, 6, 7], [8]] and (res["reused"], res["generated"], res["skipped_lines"]) == (5, 4, 1)
    assert _by_pair(path) == want and len(path.read_text().splitlines()) == 5 + 1 + 4


def test_a_samples_file_that_is_a_folder_is_one_line(tmp_path):
    from mixrl.benchmarks import runner
    from mixrl.errors import ConfigError

    bench, problems = _aime(tmp_path)
    (tmp_path / "aime24-k.jsonl").mkdir()
    with pytest.raises(ConfigError, match="aime24-k.jsonl there is not a file"):
        runner.evaluate_benchmark(bench, problems, prompts=[p.problem for p in problems], generator_factory=_Echo,
                                  scorer=lambda ps, ts, es: [False] * len(ts), key="k", cache_dir=tmp_path,
                                  max_new_tokens=4, batch_size=4)
