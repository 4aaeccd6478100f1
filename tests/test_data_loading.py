"""Data loading: local fixtures in the paper recipes' schemas, column mapping, expert extraction, errors."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from mixrl.data import answer_to_str, expert_completions, load_dataset_rows, to_chat_prompt  # noqa: E402
from mixrl.errors import ConfigError, DataError  # noqa: E402
from mixrl.rewards import build_reward  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
GSM8K = str(FIXTURES / "gsm8k.jsonl")
MATH = str(FIXTURES / "math.jsonl")
OPENR1 = str(FIXTURES / "openr1_math.jsonl")
OPENR1_PARQUET = str(FIXTURES / "openr1_math.parquet")
LUFFY = str(FIXTURES / "luffy_openr1.jsonl")


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg, msg
    return msg


def write_jsonl(path: Path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


# ----------------------------------------------------------------------------- fixtures in recipe schemas


def test_gsm8k_jsonl():
    ds = load_dataset_rows(GSM8K, prompt_column="question")
    assert len(ds) == 5
    assert ds.column_names == ["prompt", "answer"]  # 'question' is mapped onto 'prompt'
    row = ds[0]
    assert isinstance(row["prompt"], str) and row["prompt"].startswith("A baker")
    assert row["answer"].endswith("#### 108")
    # the GSM8K solution works as gold for both built-in rewards
    for name in ("exact", "math"):
        rewards = build_reward(name)(prompts=ds["prompt"][:2], completions=["#### 108", "#### 41"], answer=ds["answer"][:2])
        assert rewards == [1.0, 0.0]


def test_math_jsonl_solution_as_answer_and_expert():
    ds = load_dataset_rows(MATH, prompt_column="problem", answer_column="solution", expert_column="solution")
    assert ds.column_names == ["prompt", "answer", "expert", "level", "type"]
    assert ds[0]["expert"] == [ds[0]["answer"]]
    fn = build_reward("math")
    completions = ["\\boxed{\\dfrac{5}{6}}", "x = 4", "\\boxed{9\\pi}", "\\boxed{2\\sqrt3}", "\\boxed{120}"]
    assert fn(prompts=ds["prompt"], completions=completions, answer=ds["answer"]) == [1.0] * 5


@pytest.mark.parametrize("source", [OPENR1, OPENR1_PARQUET])
def test_openr1_generations_as_expert(source):
    ds = load_dataset_rows(source, prompt_column="problem", expert_column="generations")
    assert len(ds) == 5
    assert ds.column_names[:3] == ["prompt", "answer", "expert"]
    assert "generations" not in ds.column_names  # mapped
    for kept in ("solution", "messages", "correctness_math_verify", "uuid"):
        assert kept in ds.column_names  # other columns stay (rewards receive them)
    assert len(ds[0]["expert"]) == 2 and all(isinstance(x, str) for x in ds[0]["expert"])
    assert ds[1]["correctness_math_verify"] == [True, False]
    assert ds[2]["answer"] == "\\frac{3}{4}"


@pytest.mark.parametrize("source", [OPENR1, OPENR1_PARQUET])
def test_openr1_messages_expert_takes_assistant_content(source):
    ds = load_dataset_rows(source, prompt_column="problem", expert_column="messages")
    assert "messages" not in ds.column_names
    for row in ds:
        assert len(row["expert"]) == 1
        assert row["expert"][0].startswith("<think>")
        assert row["prompt"] not in row["expert"][0]  # the user turn is not part of it


def test_openr1_messages_as_prompt_drops_assistant_turn():
    ds = load_dataset_rows(OPENR1, prompt_column="messages", expert_column="generations")
    prompt = ds[0]["prompt"]
    assert prompt == [{"role": "user", "content": "Find the sum of the first 10 positive integers."}]


def test_luffy_verl_schema_nested_answer_chat_prompt():
    ds = load_dataset_rows(LUFFY, answer_column="reward_model.ground_truth", expert_column="target")
    assert ds.column_names == ["prompt", "answer", "expert", "data_source", "ability", "extra_info"]
    row = ds[4]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["answer"] == "0.75"
    assert len(row["expert"]) == 1 and "\\boxed" in row["expert"][0]
    # the expert trace earns the math reward
    fn = build_reward("math")
    assert fn(prompts=ds["prompt"], completions=[e[0] for e in ds["expert"]], answer=ds["answer"]) == [1.0] * 5


def test_system_prompt_makes_chat_prompts():
    ds = load_dataset_rows(GSM8K, prompt_column="question", system_prompt="Answer after ####.")
    assert ds[0]["prompt"][0] == {"role": "system", "content": "Answer after ####."}
    assert ds[0]["prompt"][1]["role"] == "user" and ds[0]["prompt"][1]["content"].startswith("A baker")
    # an existing system message is replaced
    ds = load_dataset_rows(LUFFY, answer_column="reward_model.ground_truth", system_prompt="Be brief.")
    assert ds[0]["prompt"][0] == {"role": "system", "content": "Be brief."}
    assert len(ds[0]["prompt"]) == 2


def test_limit():
    ds = load_dataset_rows(GSM8K, prompt_column="question", limit=2)
    assert len(ds) == 2 and ds[1]["answer"].endswith("#### 42")
    assert len(load_dataset_rows(GSM8K, prompt_column="question", limit=100)) == 5
    for bad in (0, -3, 1.5, True):
        with pytest.raises(ConfigError) as e:
            load_dataset_rows(GSM8K, prompt_column="question", limit=bad)
        assert "data.limit" in one_line(e)


def test_split_slice_on_a_file():
    assert len(load_dataset_rows(GSM8K, prompt_column="question", split="train[:3]")) == 3
    # a single file is all of its data, whatever the split name
    assert len(load_dataset_rows(GSM8K, prompt_column="question", split="test")) == 5


# ----------------------------------------------------------------------------- formats and sources


def test_csv_numbers_cast_to_str(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("question,answer,difficulty\nOne plus one?,2,1\nHalf of five?,2.5,2\nTen times ten?,100,3\n")
    ds = load_dataset_rows(str(path), prompt_column="question")
    assert ds["answer"] == ["2", "2.5", "100"]
    assert ds["difficulty"] == [1, 2, 3]


def test_jsonl_int_and_float_answers(tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "answer": 72.0}, {"prompt": "b", "answer": 0.5}])
    assert load_dataset_rows(src)["answer"] == ["72", "0.5"]


def test_json_array_and_json_object_with_rows(tmp_path):
    rows = [{"question": "q1", "answer": 1}, {"question": "q2", "answer": 2}]
    (tmp_path / "array.json").write_text(json.dumps(rows))
    (tmp_path / "object.json").write_text(json.dumps({"data": rows}))
    for name in ("array.json", "object.json"):
        ds = load_dataset_rows(str(tmp_path / name), prompt_column="question")
        assert ds["prompt"] == ["q1", "q2"] and ds["answer"] == ["1", "2"]


def test_directory_with_split_files(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": f"t{i}", "answer": str(i)} for i in range(3)])
    write_jsonl(tmp_path / "test.jsonl", [{"prompt": "e0", "answer": "0"}])
    assert load_dataset_rows(str(tmp_path))["prompt"] == ["t0", "t1", "t2"]
    assert load_dataset_rows(str(tmp_path), split="test")["prompt"] == ["e0"]
    with pytest.raises(DataError) as e:
        load_dataset_rows(str(tmp_path), split="validation")
    msg = one_line(e)
    assert "split 'validation' not found" in msg and "test, train" in msg and "data.split" in msg


def test_directory_without_split_names_is_one_dataset(tmp_path):
    write_jsonl(tmp_path / "part-0.jsonl", [{"prompt": "a", "answer": "1"}])
    write_jsonl(tmp_path / "part-1.jsonl", [{"prompt": "b", "answer": "2"}])
    assert sorted(load_dataset_rows(str(tmp_path))["prompt"]) == ["a", "b"]


def test_glob_source(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"prompt": "a", "answer": "1"}])
    write_jsonl(tmp_path / "b.jsonl", [{"prompt": "b", "answer": "2"}])
    assert load_dataset_rows(str(tmp_path / "*.jsonl"))["prompt"] == ["a", "b"]


def test_saved_to_disk_dataset(tmp_path):
    import datasets

    datasets.Dataset.from_list([{"prompt": "p", "answer": 3}]).save_to_disk(str(tmp_path / "saved"))
    ds = load_dataset_rows(str(tmp_path / "saved"))
    assert ds[0] == {"prompt": "p", "answer": "3"}


def test_answer_column_none_and_existing_prompt_column_replaced(tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "old", "question": "new", "meta": 1}])
    ds = load_dataset_rows(src, prompt_column="question", answer_column=None)
    assert ds.column_names == ["prompt", "meta"]
    assert ds[0]["prompt"] == "new"


def test_rows_with_empty_prompt_are_dropped(tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "answer": "1"}, {"prompt": "", "answer": "2"},
                                             {"prompt": None, "answer": "3"}, {"prompt": "d", "answer": None}])
    ds = load_dataset_rows(src)
    assert ds["prompt"] == ["a", "d"] and ds["answer"] == ["1", ""]


def test_chat_expert_formats(tmp_path):
    user = {"role": "user", "content": "q"}
    rows = [
        {"prompt": "q", "answer": "1", "expert": [user, {"role": "assistant", "content": "A1"}]},
        {"prompt": "q", "answer": "1", "expert": [[user, {"role": "assistant", "content": "B1"}],
                                                  [user, {"role": "assistant", "content": "B2"}]]},
        {"prompt": "q", "answer": "1", "expert": []},
        {"prompt": "q", "answer": "1", "expert": None},
    ]
    # a column mixing one conversation and a list of conversations cannot be one Arrow type: write two files
    one = write_jsonl(tmp_path / "one.jsonl", [rows[0], rows[3]])
    many = write_jsonl(tmp_path / "many.jsonl", [rows[1], rows[2]])
    assert load_dataset_rows(one, expert_column="expert")["expert"] == [["A1"], []]
    assert load_dataset_rows(many, expert_column="expert")["expert"] == [["B1", "B2"], []]


def test_expert_completions_unit():
    assert expert_completions(None) == []
    assert expert_completions("") == []
    assert expert_completions("  ") == []
    assert expert_completions("sol") == ["sol"]
    assert expert_completions(["a", "", None, "b"]) == ["a", "b"]
    assert expert_completions({"role": "assistant", "content": "x"}) == ["x"]
    assert expert_completions([{"role": "user", "content": "q"}]) == []
    conv = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}]
    assert expert_completions(conv) == ["r"]
    assert expert_completions([conv, conv[:2], conv]) == ["r", "r"]
    assert expert_completions([{"role": "assistant", "content": [{"type": "text", "text": "parts"}]}]) == ["parts"]
    # records without a role (AMPO's target_lst: {content, source, quality_score}): one completion each, in order
    records = [{"content": "t1", "source": "a", "quality_score": 2.0}, {"content": "", "source": "b"}, {"content": "t3"}]
    assert expert_completions(records) == ["t1", "t3"]


def test_answer_to_str_and_chat_prompt_units():
    assert answer_to_str(72) == "72"
    assert answer_to_str(72.0) == "72"
    assert answer_to_str(2.5) == "2.5"
    assert answer_to_str(None) == ""
    assert answer_to_str(float("nan")) == ""
    assert answer_to_str([1, 2]) == "1, 2"
    assert to_chat_prompt("hi") == [{"role": "user", "content": "hi"}]
    assert to_chat_prompt("hi", "sys")[0] == {"role": "system", "content": "sys"}
    assert to_chat_prompt("") == []


# ----------------------------------------------------------------------------- errors


def test_missing_column_message():
    with pytest.raises(DataError) as e:
        load_dataset_rows(GSM8K, prompt_column="problem")
    msg = one_line(e)
    assert msg == (
        f"column 'problem' not found in {GSM8K}; columns present: question, answer; set data.prompt_column=question"
    )


def test_missing_answer_and_expert_columns_name_their_keys():
    with pytest.raises(DataError) as e:
        load_dataset_rows(MATH, prompt_column="problem")
    msg = one_line(e)
    assert "column 'answer' not found" in msg and "data.answer_column=solution" in msg
    with pytest.raises(DataError) as e:
        load_dataset_rows(OPENR1, prompt_column="problem", expert_column="generation")
    assert "data.expert_column=generations" in one_line(e)
    with pytest.raises(DataError) as e:
        load_dataset_rows(LUFFY, answer_column="reward_model.truth")
    assert "data.answer_column=reward_model.ground_truth" in one_line(e)


@pytest.mark.parametrize("columns, kwargs, expected", [
    # a usual name for the role, never a column that belongs to another role (was: prompt_column=expert)
    (["question", "expert", "answer"], {}, "prompt_column=question"),
    (["expert", "problem", "answer"], {}, "prompt_column=problem"),
    (["input", "output"], {}, "prompt_column=input"),
    (["input", "output"], {"prompt_column": "input"}, "answer_column=output"),
    (["question", "solution"], {"prompt_column": "question"}, "answer_column=solution"),
])
def test_missing_column_suggests_a_plausible_column(tmp_path, columns, kwargs, expected):
    src = write_jsonl(tmp_path / "d.jsonl", [{c: "1" for c in columns}])
    with pytest.raises(DataError) as e:
        load_dataset_rows(src, **kwargs)
    assert one_line(e).endswith(f"set data.{expected}")


def test_missing_column_never_suggests_a_column_another_role_uses(tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "target": "t"}])
    with pytest.raises(DataError) as e:  # 'question' is the prompt: the answer is 'target', not 'question'
        load_dataset_rows(src, prompt_column="question", answer_column="solution")
    assert one_line(e).endswith("set data.answer_column=target")


def test_absent_expert_column_is_skipped_unless_required(tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1=", "answer": "2"}])
    ds = load_dataset_rows(src, expert_column="solution", expert_required=False)
    assert ds.column_names == ["prompt", "answer"]
    with pytest.raises(DataError) as e:
        load_dataset_rows(src, expert_column="solution")
    msg = one_line(e)
    assert "column 'solution' not found" in msg and "trains on expert completions" in msg and "data.expert_column" in msg
    # present: still mapped when not required
    both = write_jsonl(tmp_path / "e.jsonl", [{"prompt": "1+1=", "answer": "2", "solution": "1+1=2 #### 2"}])
    assert load_dataset_rows(both, expert_column="solution", expert_required=False)["expert"] == [["1+1=2 #### 2"]]


@pytest.mark.parametrize("name, text, says", [
    ("empty.jsonl", "", "data file {path} is empty"),
    ("blank.jsonl", "\n  \n", "data file {path} is empty"),
    ("header.csv", "prompt,answer\n", "{path} has no rows"),
    ("list.json", "[]", "{path} has no rows"),
])
def test_empty_file_says_it_is_empty(tmp_path, name, text, says):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DataError) as e:
        load_dataset_rows(str(path))
    msg = one_line(e)
    assert msg.startswith(says.format(path=path)) and "data.source" in msg


def test_empty_file_in_a_folder_is_skipped(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"prompt": "1+1=", "answer": "2"}])
    (tmp_path / "b.jsonl").write_text("")
    assert load_dataset_rows(str(tmp_path))["prompt"] == ["1+1="]


def test_config_prefix_in_messages():
    with pytest.raises(DataError) as e:
        load_dataset_rows(GSM8K, prompt_column="problem", config_prefix="eval")
    assert "set eval.prompt_column=question" in one_line(e)


def test_missing_file():
    with pytest.raises(DataError) as e:
        load_dataset_rows("data/does_not_exist.jsonl")
    msg = one_line(e)
    assert "data/does_not_exist.jsonl" in msg and "not found" in msg and "data.source" in msg
    with pytest.raises(DataError) as e:
        load_dataset_rows(str(FIXTURES / "nope.parquet"))
    assert str(FIXTURES / "nope.parquet") in one_line(e)


def test_unsupported_and_broken_files(tmp_path):
    (tmp_path / "notes.txt").write_text("hello\n")
    with pytest.raises(DataError) as e:
        load_dataset_rows(str(tmp_path / "notes.txt"))
    assert "'.txt'" in one_line(e) and ".jsonl" in str(e.value)
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "answer": 1}\n{not json\n')
    with pytest.raises(DataError) as e:
        load_dataset_rows(str(tmp_path / "bad.jsonl"))
    assert "could not read" in one_line(e)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError):
        load_dataset_rows(str(tmp_path / "empty.jsonl"))


def test_bad_cell_type_names_the_row(tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", [{"prompt": ["a", "b"], "answer": "1"}])
    with pytest.raises(DataError) as e:
        load_dataset_rows(src)
    assert "row 0" in one_line(e) and "'prompt'" in str(e.value)


def test_hub_id_not_cached_offline():
    with pytest.raises(DataError) as e:
        load_dataset_rows("mixrl-test/definitely-not-cached", subset="main")
    msg = one_line(e)
    assert "'mixrl-test/definitely-not-cached'" in msg
    assert "offline" in msg and "local" in msg and "HF_HUB_OFFLINE unset" in msg


def test_builtin_source_and_empty_source():
    with pytest.raises(DataError) as e:
        load_dataset_rows("builtin:arith")
    one_line(e)
    with pytest.raises(ConfigError):
        load_dataset_rows("  ")
