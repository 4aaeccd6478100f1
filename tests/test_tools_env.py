"""env=tools: the tool-calling BPE template against TRL's checks, the expert trajectories token-exact,
the tool tokens' provenance in a batch, and one training step through TRL's tool loop (GRPO, and
CHORD on the expert trajectories); LUFFY-style rows inside the groups are refused for now."""

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


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo"])
def test_one_step_through_trls_tool_loop(tmp_path_factory, algo):
    from mixrl.config.compose import compose_config
    from mixrl.trainer.build import trainer_from_config

    model = tiny_bpe_tools.warm_start(tmp_path_factory.mktemp("m"), steps=3, progress=False)
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


def test_expert_rows_inside_groups_are_refused_with_tools():
    from mixrl.config.compose import compose_config
    from mixrl.errors import ConfigError

    for algo in ("luffy", "chord"):
        with pytest.raises(ConfigError, match="not supported yet"):
            compose_config(["env=tools", f"algo={algo}"])
