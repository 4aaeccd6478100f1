"""env=tools: the tool-calling BPE template against TRL's checks, the expert trajectories token-exact,
the tool tokens' provenance in a batch (rollouts, expert rows in the groups, CHORD's appended rows
through TRL's shuffle), expert rows kept out of TRL's tool loop, the warm start's tool-call accuracy,
and one training step through TRL's tool loop (GRPO, CHORD, LUFFY on the expert trajectories)."""

from __future__ import annotations

import pytest
import torch

from mixrl.core import provenance as prov
from mixrl.core.turns import written_spans
from mixrl.models import tiny_bpe, tiny_bpe_tools
from mixrl.sources.base import Rollouts
from mixrl.tasks import arith_tools
from mixrl.trainer.parts.batch_fields import assistant_turn_marks, provenance_fields


@pytest.fixture(scope="module")
def tok():
    return tiny_bpe_tools.set_templates(tiny_bpe.build_tokenizer(tiny_bpe_tools.corpus_texts(n=150), vocab_size=420))


@pytest.fixture(scope="module")
def problem():
    return arith_tools.train_split(1, seed=0)[0]


def test_template_passes_trls_tool_checks_and_parses_back(tok, problem):
    from trl.chat_template_utils import is_chat_template_prefix_preserving, parse_response, supports_tool_calling

    assert supports_tool_calling(tok) and is_chat_template_prefix_preserving(tok)
    msgs = arith_tools.expert_messages(problem)
    prompt = tok.apply_chat_template(msgs[:2], tools=[tiny_bpe_tools.calculator_schema()], add_generation_prompt=True,
                                     tokenize=True, return_dict=False)
    call_text = tiny_bpe_tools.turn_examples(tok, problem, True)[0][1] + tiny_bpe.IM_END
    parsed = parse_response(tok, tok(call_text, add_special_tokens=False)["input_ids"], prefix=list(prompt))
    assert parsed["tool_calls"] == [arith_tools.tool_call(problem)]


def test_expert_trajectory_is_token_exact_and_its_tool_turn_is_written(tok, problem):
    """The trajectory's tokens (plus eos, as the expert source adds it) are the chat template's tokens
    of the whole conversation after the prompt; written_spans marks exactly the tool's turn."""
    msgs = arith_tools.expert_messages(problem)
    tools = [tiny_bpe_tools.calculator_schema()]
    full = tok.apply_chat_template(msgs, tools=tools, tokenize=True, return_dict=False)
    prompt = tok.apply_chat_template(msgs[:2], tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False)
    ids = tok(tiny_bpe_tools.trajectory_text(problem), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert list(prompt) + ids == list(full)[: len(prompt) + len(ids)]
    assert tok.decode(list(full)[len(prompt) + len(ids):]) == "\n"  # the template's newline after the last turn
    written = written_spans(ids, *assistant_turn_marks(tok))
    tool_text = tok.decode([t for t, w in zip(ids, written) if w])
    assert tool_text == f"\n<|im_start|>user\n<tool_response>{problem['answer']}</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode([t for t, w in zip(ids, written) if not w]).endswith(f"#### {problem['answer']}<|im_end|>")


def test_provenance_fields_mark_tool_tokens_and_number_turns(tok, problem):
    ids = tok(tiny_bpe_tools.trajectory_text(problem), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    written = torch.tensor(written_spans(ids, *assistant_turn_marks(tok)))
    n = len(ids)
    out = {"completion_ids": torch.tensor([ids, ids]), "completion_mask": torch.ones(2, n, dtype=torch.long),
           "tool_mask": torch.stack([(~written).long(), torch.ones(n, dtype=torch.long)])}
    rollouts = Rollouts([ids, ids], None, [prov.ON_POLICY, prov.EXPERT])
    f = provenance_fields(out, rollouts, assistant_turn_marks(tok))
    assert (f["token_source"][0] == prov.ENVIRONMENT).tolist() == written.tolist()  # TRL's tool_mask
    assert (f["token_source"][1] == prov.ENVIRONMENT).tolist() == written.tolist()  # the expert row, read from its ids
    assert set(f["token_source"][1][~written].tolist()) == {prov.EXPERT}
    first_env = int(written.nonzero()[0])
    assert f["turn_id"][0, :first_env].eq(0).all() and f["turn_id"][0, -1] == 1 and f["turn_id"][0][written].eq(-1).all()


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    return tiny_bpe_tools.warm_start(tmp_path_factory.mktemp("m"), steps=3, progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "chord", "luffy"])
def test_one_step_through_trls_tool_loop(tmp_path_factory, tool_model, algo):
    """GRPO; CHORD's appended expert rows (they crashed TRL's batch shuffle: no turn_id); LUFFY's
    expert rows in the groups (kept out of the tool loop)."""
    from mixrl.config.compose import compose_config
    from mixrl.trainer.build import trainer_from_config

    model = tool_model
    cfg = compose_config(["env=tools", f"algo={algo}", f"model.path={model}", "trainer.max_steps=1",
                          "trainer.prompts_per_step=2", "algo.num_generations=2", "trainer.eval_size=0",
                          "hardware.torch_threads=1", "logger.progress=false", "data.train_size=8",
                          f"run_dir={tmp_path_factory.mktemp('run')}"])
    trainer = trainer_from_config(cfg)
    trainer.train()
    assert trainer.tools and torch.isfinite(torch.tensor(trainer.state.log_history[-1]["train_loss"]))


def test_samples_show_who_wrote_each_turn_and_what_trained(tok, problem):
    from mixrl.trainer.sample_log import _turns

    ids = tok(tiny_bpe_tools.trajectory_text(problem), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    written = torch.tensor(written_spans(ids, *assistant_turn_marks(tok)))
    src = torch.where(written, torch.tensor(prov.ENVIRONMENT), torch.tensor(prov.ON_POLICY))
    turns = _turns(tok, torch.tensor(ids), torch.ones(len(ids)), src)
    assert [(t["by"], t["trained"]) for t in turns] == [("policy", True), ("environment", False), ("policy", True)]
    assert turns[0]["text"].startswith("<tool_call>") and turns[2]["text"] == f"#### {problem['answer']}<|im_end|>"
    assert f"<tool_response>{problem['answer']}</tool_response>" in turns[1]["text"]
    from mixrl.trainer.sample_log import cells
    shown = cells({"step": 1, "source": "on_policy", "completion": "x", "turns": turns})[-1]
    assert shown.startswith("[policy] <tool_call>") and "[environment, not trained]" in shown


def test_injections_that_go_on_from_written_rows_are_refused_with_tools():
    from mixrl.config.compose import compose_config
    from mixrl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"env=tools with algo.inject=prefix is not supported; .*algo=luffy, sft, chord"):
        compose_config(["env=tools", "algo=prefix_rft"])


def test_appended_expert_rows_mark_tool_turns_and_survive_trls_shuffle(tok, problem):
    """CHORD's append_rows on a tool batch: the expert row's tool turn is provenance environment
    (the template's turn marks), its turn_id is appended (the missing [B, T] entry made TRL's
    shuffle index a shorter tensor), and TRL's shuffle and split keep every field row-aligned."""
    from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

    from mixrl.sources.inject import marked_turns
    from mixrl.sources.rows import append_rows

    marks = assistant_turn_marks(tok)
    ids = tok(tiny_bpe_tools.trajectory_text(problem), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    written = written_spans(ids, *marks)
    n = len(ids)
    out = {"prompt_ids": torch.ones(2, 3, dtype=torch.long), "prompt_mask": torch.ones(2, 3, dtype=torch.long),
           "completion_ids": torch.tensor([ids[:5], ids[:5]]), "completion_mask": torch.ones(2, 5, dtype=torch.long),
           "tool_mask": torch.ones(2, 5, dtype=torch.long), "advantages": torch.tensor([1.0, -1.0])}
    out.update(provenance_fields(out, Rollouts([ids[:5]] * 2, None, [prov.ON_POLICY] * 2), marks))
    out.pop("tool_mask")
    out["group_id"] = torch.zeros(2, dtype=torch.long)
    ts = marked_turns(ids, prov.EXPERT, marks)
    assert [t == prov.ENVIRONMENT for t in ts] == written and set(t for t, w in zip(ts, written) if not w) == {prov.EXPERT}
    new = append_rows(out, [[1, 1]], [ids], pad_id=0, row_source=torch.tensor([prov.EXPERT]), token_source=[ts])
    first_env = written.index(True)
    assert new["turn_id"].shape == (3, n) and new["turn_id"][:2, 5:].eq(-1).all()
    assert new["turn_id"][2].tolist() == [0] * first_env + [-1] * sum(written) + [1] * (n - first_env - sum(written))
    shuffled = shuffle_sequence_dict(new)
    for chunk in split_tensor_dict(shuffled, 3):
        row = chunk["completion_ids"][0]
        assert chunk["turn_id"].shape == (1, n) and (chunk["turn_id"][0] == -1).tolist() == (
            (chunk["token_source"][0] == prov.ENVIRONMENT) | (chunk["token_source"][0] == -1)).tolist()
        assert int(chunk["row_source"][0]) == (prov.EXPERT if row.tolist() == ids else prov.ON_POLICY)


def test_expert_rows_skip_trls_tool_loop(tok, problem):
    """A row an injection wrote in the groups holds its tool result already: TRL's loop gets it without
    tool calls (never runs the call again) and the reward reads its whole text; rollouts go through."""
    from mixrl.trainer.grpo import OVERRIDDEN
    from mixrl.trainer.tool_rows import finished_trajectories

    assert "_tool_call_loop" in OVERRIDDEN  # the trainer's hook calls finished_trajectories before TRL's loop
    ids = tok(tiny_bpe_tools.trajectory_text(problem), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    call = [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "1+1"}}}]
    completions = [[{"role": "assistant", "content": "", "tool_calls": call}] for _ in range(2)]
    written = finished_trajectories(completions, [ids, ids], [prov.ON_POLICY, prov.EXPERT],
                                    lambda x: tok.decode(x, skip_special_tokens=True))
    assert written == [1]
    assert [c[0].get("tool_calls") for c in completions] == [call, None]
    text = completions[1][0]["content"]
    assert text.startswith("<tool_call>") and text.endswith(f"#### {problem['answer']}")
    assert finished_trajectories(completions, [ids, ids], None, str) == []  # no record of the rows: nothing rewritten


def test_call_accuracy_reads_the_copied_expression(tok, problem):
    """call_accuracy: 1 for a model that writes the call's expression after the prefix, 0 otherwise."""
    prefix, target = tiny_bpe_tools.call_prefix(problem)
    assert prefix.endswith('{"expression": "') and target == problem["prompt"].rstrip("=") + '"}}</tool_call>'
    want = tok(target, add_special_tokens=False)["input_ids"]

    class Copier(torch.nn.Module):  # writes `want` (or a wrong digit first) whatever the prompt
        def __init__(self, right):
            super().__init__()
            self.right = right

        def generate(self, input_ids, attention_mask, max_new_tokens, **_):
            out = list(want) if self.right else [tok.convert_tokens_to_ids("9")] + list(want[1:])
            return torch.cat([input_ids, torch.tensor([out[:max_new_tokens]] * len(input_ids))], 1)

    assert tiny_bpe_tools.call_accuracy(Copier(True), tok, [problem]) == 1.0
    assert tiny_bpe_tools.call_accuracy(Copier(False), tok, [problem]) == 0.0
