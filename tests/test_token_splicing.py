"""Token-exact splicing on a byte-level BPE tokenizer, with chat-formatted prompts.

A character tokenizer hides two facts that every method joining material from two sources
depends on: with byte-level BPE (Qwen2.5's pipeline, :mod:`mixrl.models.tiny_bpe`) text cut
at a character position is not always a token boundary (``" ####"`` is one token), and
re-tokenizing joined text does not give back the ids that were joined. These tests drive
the real path (source -> injection -> ``MixrlGRPOTrainer._generate_and_score_completions``)
on an untrained tiny Qwen2 model over that tokenizer, with prompts rendered by its chat
template, and assert on the batch the trainer builds, for each family:

* expert rows (CHORD's appended rows) and in-group injection (LUFFY): the off-policy tokens
  are exactly the demonstration's ids (plus eos), under the chat prompt's ids;
* prefixes (PrefixRL) cut where a character cut would fall inside ``" ####"``: the prefix is
  a cut of the demonstration's ids, the policy is asked to continue exactly
  ``prompt ids + prefix ids``, the row is ``prefix ids + the sampled ids``, behaviour
  log-probs line up with them, and the loss reaches exactly the sampled tokens;
* hints (Guide, GHPO in the prompt, POPE as a completion prefix): the ids generated from are
  the ids trained under (or scored as behaviour), the hint sits inside the user turn;
* replay: a replayed row has the stored ids and the log-probs they were sampled with;
* a teacher with the same tokenizer scores exactly the student's ids; one whose merges (or
  vocabulary) differ is refused in one line before any model loads.

Generation is scripted (TRL's ``_generate_single_turn`` replaced): the "sampled" completions
spell ``" ####"`` as five tokens (``Ġ``, ``#`` x 4), a sequence the tokenizer itself would never
produce, so any step that decoded and re-tokenized them would change the ids and fail the
equalities below.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import fail_model_loading
from mixrl.config.compose import compose_config
from mixrl.core import provenance as prov
from mixrl.errors import ConfigError
from mixrl.models import tiny_arch, tiny_bpe
from mixrl.sources.hint import HINTED, HintOnFailure, with_hint
from mixrl.sources.prefix import PREFIX
from mixrl.sources.replay import REPLAY
from mixrl.tasks import arith

GEN = 4  # rollouts per group
FAST = ["trainer.prompts_per_step=2", f"algo.num_generations={GEN}", "trainer.micro_batch_size=8",
        "trainer.eval_size=0", "trainer.max_completion_length=48", "logger.progress=false",
        "hardware.torch_threads=1", "trainer.save_steps=0"]


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """The BPE tokenizer, an untrained tiny Qwen2 model over it, a second one (a teacher with
    the same tokenizer, other weights) and a JSONL file of ``arith`` rows with solutions."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("bpe")
    tok = tiny_bpe.build_tokenizer()
    for name, seed in (("model", 0), ("teacher", 1)):
        torch.manual_seed(seed)
        tiny_arch.build_model(tok).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    rows = arith.train_split(16, seed=0, levels=[4, 5])
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": r["prompt"], "answer": r["answer"], "solution": r["solution"]}) + "\n"
                            for r in rows))
    return SimpleNamespace(tok=tok, model=str(root / "model"), teacher=str(root / "teacher"), data=str(data), root=root)


def _ids(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _chat_ids(tok, messages) -> list[int]:
    """The prompt as the chat template renders it for generation, tokenized once."""
    return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])


def _spelled(tok, value: int) -> list[int]:
    """``"{value} #### {value}"`` as five-token ``" ####"`` (``Ġ`` then four ``#``): not what the tokenizer makes of that text."""
    sp, hash_ = tok.convert_tokens_to_ids("Ġ"), tok.convert_tokens_to_ids("#")
    return _ids(tok, str(value)) + [sp] + [hash_] * 4 + [sp] + _ids(tok, str(value))


def _trainer(bpe, overrides, tmp_path):
    from mixrl.trainer import build

    cfg = compose_config([*FAST, *overrides, f"model.path={bpe.model}", f"data.source={bpe.data}",
                          f"data.system_prompt='{tiny_bpe.SYSTEM_PROMPT}'", "data.expert_column=solution",
                          f"run_dir={tmp_path / 'run'}"])
    torch.manual_seed(0)
    trainer = build.trainer_from_config(cfg)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps  # set by Trainer.train()
    return trainer


def _batch(trainer, first=0, prompts=2):
    ds = trainer.train_dataset
    return [dict(ds[i]) for i in range(first, first + prompts) for _ in range(GEN)]


def _script(monkeypatch, tok, right=lambda i, guided: i % 2 == 0):
    """Replace TRL's generation: each prompt gets ``_spelled(answer)`` + eos, the right answer
    when ``right(i, guided)`` (guided: a hint after the problem or a prefix after the turn),
    else answer + 1. Returns the list of prompt ids the policy was asked to continue."""
    import trl

    asked: list[list[int]] = []
    eos = tok.eos_token_id

    def generate(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        out = []
        for i, ids in enumerate(prompt_ids):
            asked.append(list(ids))
            text = tok.decode(ids, skip_special_tokens=False)
            problem = re.findall(r"user\n(\d+(?:\+\d+)+)=([^<]*)<\|im_end\|>", text)[-1]
            after_turn = text.rsplit("<|im_start|>assistant\n", 1)[-1]
            answer = sum(int(d) for d in problem[0].split("+"))
            guided = bool(problem[1]) or bool(after_turn)
            out.append(_spelled(tok, answer if right(i, guided) else answer + 1) + [eos])
        return out, None

    monkeypatch.setattr(trl.GRPOTrainer, "_generate_single_turn", generate)
    return asked


def _rows(out):
    """Per row: (prompt ids, completion ids) under their masks."""
    prompt = [ids[m.bool()].tolist() for ids, m in zip(out["prompt_ids"], out["prompt_mask"])]
    comp = [ids[m.bool()].tolist() for ids, m in zip(out["completion_ids"], out["completion_mask"])]
    return prompt, comp


def _direct_logps(model, prompt_ids, completion_ids, temperature=1.0):
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1: -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion_ids).unsqueeze(1)).squeeze(1)


def _assert_mask_is(out, i, n_tokens):
    """Row ``i``'s completion mask covers exactly its first ``n_tokens`` positions."""
    m = out["completion_mask"][i]
    assert int(m.sum()) == n_tokens and bool(m[:n_tokens].all())


# ----------------------------------------------------------------------------- the hazard
def test_re_tokenizing_joined_text_is_not_the_id_level_splice(bpe):
    """What a text-level splice would do on this tokenizer: every equality fails."""
    tok = bpe.tok
    solution = "9 11 17 25 30 #### 30"
    ids = _ids(tok, solution)
    assert len(_ids(tok, " ####")) == 1 and tok.convert_tokens_to_ids("Ġ####") in ids
    cut = solution.index("####") + 2  # a character cut inside " ####": "... 30 ##" | "## 30"
    head, tail = _ids(tok, solution[:cut]), _ids(tok, solution[cut:])
    assert head + tail != ids  # cut text, tokenized in two pieces: other ids than the demonstration's
    assert head != ids[: len(head)]  # the text prefix is not even a prefix of the demonstration's ids
    # a prefix of ids followed by what the policy sampled (five tokens for " ####"), decoded and re-tokenized
    prefix = ids[:ids.index(tok.convert_tokens_to_ids("Ġ####"))]
    sampled = [tok.convert_tokens_to_ids("Ġ")] + [tok.convert_tokens_to_ids("#")] * 4 + _ids(tok, " 30") + [tok.eos_token_id]
    joined = prefix + sampled
    assert _ids(tok, tok.decode(joined, skip_special_tokens=False)) != joined
    # the completions the scripted policy samples below are of that kind
    assert _ids(tok, tok.decode(_spelled(tok, 30))) != _spelled(tok, 30)


# ----------------------------------------------------------------------------- expert rows
@pytest.mark.parametrize("algo", ["chord", "luffy"])
def test_expert_tokens_are_exactly_the_demonstrations_ids(bpe, tmp_path, monkeypatch, algo):
    """CHORD appends expert rows; LUFFY puts one in the last slot of each group (in-group
    injection). Either way the row is (chat prompt ids, demonstration ids + eos), with provenance
    expert on exactly those tokens and no behaviour log-prob; the rollouts keep their sampled ids."""
    trainer = _trainer(bpe, [f"algo={algo}"], tmp_path)
    tok = trainer.processing_class
    _script(monkeypatch, tok)
    inputs = _batch(trainer)
    out = trainer._generate_and_score_completions(inputs)
    prompts, comps = _rows(out)
    expert = prov.code("expert")
    by_prompt = {tuple(_chat_ids(tok, r["prompt"])): r["expert"][0] for r in trainer.train_dataset}
    ts, rs = out["token_source"], out["row_source"]
    n_expert = 0
    for i in range(len(comps)):
        if int(rs[i]) == expert:
            n_expert += 1
            demo = _ids(tok, by_prompt[tuple(prompts[i])]) + [tok.eos_token_id]
            assert comps[i] == demo
            _assert_mask_is(out, i, len(demo))
            assert bool((ts[i, : len(demo)] == expert).all())
            assert bool(torch.isnan(out["behaviour_logp"][i, : len(demo)]).all())
        else:  # a rollout: the scripted ids, unchanged, all on-policy
            row = inputs[i]
            assert prompts[i] == _chat_ids(tok, row["prompt"])
            answer = int(row["answer"])
            assert comps[i] in (_spelled(tok, answer) + [tok.eos_token_id], _spelled(tok, answer + 1) + [tok.eos_token_id])
            assert bool((ts[i, : len(comps[i])] == prov.ON_POLICY).all())
    if algo == "luffy":
        assert [int(r) == expert for r in rs] == [s == GEN - 1 for s in range(GEN)] * 2  # the last slot of each group
    else:
        assert n_expert >= 1 and all(int(r) == prov.ON_POLICY for r in rs[: len(inputs)])
    # what each term sees: expert tokens are exactly the demonstrations' tokens, the policy's its sampled ones
    mask = out["completion_mask"].bool()
    assert int((mask & (ts == expert)).sum()) == sum(len(c) for c, r in zip(comps, rs) if int(r) == expert)
    assert int((mask & (ts == prov.ON_POLICY)).sum()) == sum(len(c) for c, r in zip(comps, rs) if int(r) == prov.ON_POLICY)


# ----------------------------------------------------------------------------- prefixes
@pytest.mark.parametrize("algo", ["prefixrl", "prefix_rft"])
def test_prefix_is_a_cut_of_the_demonstrations_ids_where_a_character_cut_splits_a_token(bpe, tmp_path, monkeypatch, algo):
    """A fixed fraction 0.75 of the solution's *tokens*: 0.75 of its characters falls inside
    " ####" for these rows (a text cut there re-tokenizes otherwise); the prefix is the first
    round(0.75 L) ids of the demonstration, the policy continues from exactly prompt ids +
    prefix ids, and the trained row, its behaviour log-probs and its loss follow: PrefixRL's
    loss reaches exactly the sampled tokens, Prefix-RFT's (its prefix term on every prefix
    token) exactly the prefix and the sampled tokens, never padding."""
    f = 0.75
    over = [f"algo={algo}", "algo.inject.per_group=2", "algo.inject.sample=fixed", f"algo.inject.fraction={f}",
            "trainer.num_iterations=2"]  # TRL computes old log-probs
    if algo == "prefix_rft":
        over.append("algo.terms.prefix.top_entropy=null")
    trainer = _trainer(bpe, over, tmp_path)
    tok = trainer.processing_class
    asked = _script(monkeypatch, tok)
    inputs = _batch(trainer)
    out = trainer._generate_and_score_completions(inputs)
    prompts, comps = _rows(out)
    ts = out["token_source"]
    inside = 0
    for i, row in enumerate(inputs):
        text = row["expert"][0]
        demo = _ids(tok, text)
        chat = _chat_ids(tok, row["prompt"])
        c = round(f * len(text))
        hash_at = text.index(" ####")
        if hash_at < c < hash_at + 5:  # the character cut splits " ####"
            inside += 1
            assert _ids(tok, text[:c]) != demo[: len(_ids(tok, text[:c]))]
        n = round(f * len(demo)) if i % GEN < 2 else 0  # the first two slots of each group are prefixed
        prefix = demo[:n]
        assert asked[i] == chat + prefix  # the policy continued from exactly these ids
        sampled = comps[i][n:]
        assert comps[i] == prefix + sampled and sampled[-1] == tok.eos_token_id
        assert sampled in (_spelled(tok, int(row["answer"])) + [tok.eos_token_id],
                           _spelled(tok, int(row["answer"]) + 1) + [tok.eos_token_id])  # not re-tokenized
        assert prompts[i] == chat
        _assert_mask_is(out, i, n + len(sampled))
        assert ts[i, :n].tolist() == [PREFIX] * n and bool((ts[i, n: n + len(sampled)] == prov.ON_POLICY).all())
        # behaviour: the old log-prob of each sampled token is the policy's, in the context it was sampled in
        direct = _direct_logps(trainer.model, chat, comps[i])
        assert torch.allclose(out["old_per_token_logps"][i, n: n + len(sampled)], direct[n:], atol=1e-5)
    assert inside >= 2  # the case the test is about occurred
    # the loss reaches exactly the sampled tokens (advantages set to +-1 so every such token has a gradient)
    out["advantages"] = torch.tensor([1.0, -1.0] * (len(inputs) // 2))
    captured = {}
    forward = trainer.parts.forwards.by_row_kind

    def leaf(model, batch):
        logps, ent = forward(model, batch)
        captured["logp"] = logps.detach().requires_grad_(True)
        return captured["logp"], ent

    trainer.parts.forwards.by_row_kind = leaf
    trainer._compute_loss(trainer.model, out).backward()
    trained = out["completion_mask"].bool()
    if algo == "prefixrl":
        trained = trained & (ts == prov.ON_POLICY)
    assert bool((ts == PREFIX).any()) and torch.equal(captured["logp"].grad != 0, trained)


# ----------------------------------------------------------------------------- hints
@pytest.mark.parametrize("algo", ["guide", "ghpo", "pope"])
def test_hinted_rows_train_on_the_ids_they_were_generated_from(bpe, tmp_path, monkeypatch, algo):
    """Every group fails unhinted, then half of the hinted rollouts succeed. Guide: the hint is
    text inside the user turn, the rollout is trained under the plain prompt's ids with behaviour
    log-probs of a forward of exactly the hinted ids it was generated from; GHPO: trained under
    those hinted ids; POPE: the hint is the demonstration's first ids, spliced as a prefix."""
    trainer = _trainer(bpe, [f"algo={algo}"], tmp_path)
    tok = trainer.processing_class
    asked = _script(monkeypatch, tok, right=lambda i, guided: guided and i % 2 == 0)
    inputs = _batch(trainer)
    out = trainer._generate_and_score_completions(inputs)
    prompts, comps = _rows(out)
    inj = trainer.parts.injections.injections[0]
    regenerated = asked[len(inputs):]  # first pass, then one hinted round (half of each group succeeds)
    assert len(regenerated) == len(inputs)
    fraction = inj.fractions[0]
    ts = out["token_source"]
    for i, row in enumerate(inputs):
        demo = _ids(tok, row["expert"][0])
        n = round(fraction * len(demo))
        chat = _chat_ids(tok, row["prompt"])
        sampled = comps[i][n:] if algo == "pope" else comps[i]
        answer = int(row["answer"])
        assert sampled == _spelled(tok, answer if i % 2 == 0 else answer + 1) + [tok.eos_token_id]
        if algo == "pope":
            assert regenerated[i] == chat + demo[:n] and comps[i][:n] == demo[:n]
            assert prompts[i] == chat
            assert ts[i, :n].tolist() == [PREFIX] * n and bool((ts[i, n: len(comps[i])] == prov.ON_POLICY).all())
            continue
        hinted_msgs = with_hint(row["prompt"], tok.decode(demo[:n], skip_special_tokens=True), inj.template)
        hinted = _chat_ids(tok, hinted_msgs)
        assert regenerated[i] == hinted
        assert f"<|im_start|>user\n{row['prompt'][-1]['content']}{tok.decode(demo[:n])}<|im_end|>" in tok.decode(hinted)
        if algo == "guide":
            assert prompts[i] == chat  # trained under x
            assert bool((ts[i, : len(comps[i])] == HINTED).all())
            behaviour = out["behaviour_logp"][i, : len(comps[i])]
            assert torch.allclose(behaviour, _direct_logps(trainer.model, hinted, comps[i]), atol=1e-5)
        else:
            assert prompts[i] == hinted  # GHPO: the hinted ids are the row's prompt
            assert bool((ts[i, : len(comps[i])] == prov.ON_POLICY).all())
        _assert_mask_is(out, i, len(comps[i]))


def test_a_hint_in_the_prompt_ends_where_a_character_ends(bpe):
    """"×" is two byte tokens here: a hint cut between them would put U+FFFD in the prompt; it
    is cut one token earlier. As a completion prefix (ids), the cut stays where it was."""
    from mixrl.sources import InjectContext

    tok = bpe.tok
    text = "3×4=12 #### 12"
    demo = _ids(tok, text)
    assert tok.decode(demo[:2]) == "3\ufffd"  # the hazard: half a character

    class Source:
        def for_prompt(self, row):
            return [text]

    ctx = InjectContext(tokenizer=tok, process_index=0, num_processes=1, num_generations=GEN, max_completion_length=64,
                        global_step=0, micro_step=0, device=torch.device("cpu"), tokenize_prompts=None, gather=None)
    f = 2 / len(demo)  # round(f * L) = 2: between the two bytes of "×"
    hint = HintOnFailure(fraction=f, source=Source()).hint_text(ctx, {"prompt": "q"}, f, 0)
    assert hint == ("3", demo[:1])
    assert HintOnFailure(fraction=f, placement="prefix", source=Source()).hint_text(ctx, {"prompt": "q"}, f, 0)[1] == demo[:2]
    f = 4 / len(demo)  # a clean cut is kept
    assert HintOnFailure(fraction=f, source=Source()).hint_text(ctx, {"prompt": "q"}, f, 0) == ("3×4", demo[:4])


# ----------------------------------------------------------------------------- replay
def test_replayed_rows_keep_their_ids_and_the_logps_they_were_sampled_with(bpe, tmp_path, monkeypatch):
    """ReMix: rollouts of one step are stored after the first forward; the next step appends
    them with exactly the stored prompt and completion ids (the scripted non-canonical ones) and
    their behaviour log-probs on exactly those tokens."""
    trainer = _trainer(bpe, ["algo=remix"], tmp_path)
    tok = trainer.processing_class
    _script(monkeypatch, tok)
    first = trainer._generate_and_score_completions(_batch(trainer))
    trainer._compute_loss(trainer.model, first)  # records the rollouts (no optimizer step: weights unchanged)
    sampled = {(tuple(p), tuple(c)) for p, c in zip(*_rows(first))}
    trainer.state.global_step = 1
    out = trainer._generate_and_score_completions(_batch(trainer, first=2))
    prompts, comps = _rows(out)
    replayed = [i for i in range(len(comps)) if int(out["row_source"][i]) == REPLAY]
    assert replayed
    for i in replayed:
        assert (tuple(prompts[i]), tuple(comps[i])) in sampled  # the stored ids, as sampled
        _assert_mask_is(out, i, len(comps[i]))
        assert bool((out["token_source"][i, : len(comps[i])] == REPLAY).all())
        behaviour = out["behaviour_logp"][i]
        assert torch.allclose(behaviour[: len(comps[i])], _direct_logps(trainer.model, prompts[i], comps[i]), atol=1e-5)
        assert bool(torch.isnan(behaviour[len(comps[i]):]).all())


# ----------------------------------------------------------------------------- teachers
def test_a_teacher_with_the_same_tokenizer_scores_exactly_the_students_ids(bpe, tmp_path, monkeypatch):
    trainer = _trainer(bpe, ["algo=kdrl", f"teacher.source.models=[{bpe.teacher}]"], tmp_path)
    tok = trainer.processing_class
    _script(monkeypatch, tok)
    out = trainer._generate_and_score_completions(_batch(trainer))
    prompts, comps = _rows(out)
    from transformers import AutoModelForCausalLM

    teacher = AutoModelForCausalLM.from_pretrained(bpe.teacher).eval()
    lp = out["teacher_logp"]
    for i in range(len(comps)):
        assert torch.allclose(lp[i, : len(comps[i])], _direct_logps(teacher, prompts[i], comps[i]), atol=1e-4)
        assert bool(torch.isnan(lp[i, len(comps[i]):]).all())


def _teacher_without_merge(bpe, token: str) -> str:
    """A teacher folder whose tokenizer has the student's vocabulary, minus the merge that makes ``token``."""
    folder = bpe.root / f"teacher-no-{len(token)}"
    if folder.exists():
        return str(folder)
    bpe.tok.save_pretrained(folder)
    spec = json.loads((folder / "tokenizer.json").read_text())
    merges = spec["model"]["merges"]
    joined = ["".join(m.split(" ") if isinstance(m, str) else m) for m in merges]
    del merges[joined.index(token)]
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    (folder / "config.json").write_text(Path(bpe.model, "config.json").read_text())
    return str(folder)


def test_a_teacher_with_other_merges_or_vocabulary_is_refused_in_one_line(bpe, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from mixrl.sources.teacher import TeacherSource

    student = AutoTokenizer.from_pretrained(bpe.model)
    other = _teacher_without_merge(bpe, "Ġ####")
    theirs = AutoTokenizer.from_pretrained(other)
    assert theirs.get_vocab() == student.get_vocab()  # a vocabulary-only comparison would let it through
    assert _ids(theirs, " ####") != _ids(student, " ####")  # yet " ####" becomes other ids
    t = TeacherSource(models=[other])
    t.resolve(progress=False)
    with pytest.raises(ConfigError) as e:
        t.check_tokenizer(student)
    assert "another tokenizer" in str(e.value) and "merges" in str(e.value) and "\n" not in str(e.value)
    small = bpe.root / "teacher-small-vocab"
    tiny_bpe.build_tokenizer(vocab_size=300).save_pretrained(small)
    with pytest.raises(ConfigError, match="vocabulary"):
        TeacherSource(models=[str(small)]).check_tokenizer(student)
    TeacherSource(models=[bpe.teacher]).check_tokenizer(student)  # the same tokenizer passes
    # through the trainer's own path: refused before the policy (or the teacher) loads
    import transformers

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fail_model_loading)
    with pytest.raises(ConfigError, match="merges"):
        _trainer(bpe, ["algo=kdrl", f"teacher.source.models=[{other}]"], tmp_path)


def test_in_group_replay_fills_a_group_with_the_stored_ids_and_logps(bpe, tmp_path, monkeypatch):
    """RePO-replay: step 0 half succeeds (stored), step 1 every rollout fails, so the last two
    slots of each group are refilled in place with stored successes of the same prompt: their
    exact ids, under the same prompt ids, with the log-probs they were sampled with."""
    trainer = _trainer(bpe, ["algo=repo_replay", "algo.inject.revisit=0"], tmp_path)
    tok = trainer.processing_class
    phase = {"right": True}
    _script(monkeypatch, tok, right=lambda i, guided: phase["right"] and i % 2 == 0)
    inputs = _batch(trainer)
    first = trainer._generate_and_score_completions(inputs)
    trainer._compute_loss(trainer.model, first)  # records the rollouts
    stored = {(tuple(p), tuple(c)) for p, c in zip(*_rows(first))}
    phase["right"] = False
    trainer.state.global_step = 1
    out = trainer._generate_and_score_completions(inputs)
    prompts, comps = _rows(out)
    filled = [i for i in range(len(comps)) if int(out["row_source"][i]) == REPLAY]
    assert filled == [i for i in range(len(comps)) if i % GEN >= GEN - 2]  # the last two slots of each group
    for i in filled:
        answer = int(inputs[i]["answer"])
        assert comps[i] == _spelled(tok, answer) + [tok.eos_token_id]  # a stored success, ids as sampled
        assert (tuple(prompts[i]), tuple(comps[i])) in stored and prompts[i] == _chat_ids(tok, inputs[i]["prompt"])
        _assert_mask_is(out, i, len(comps[i]))
        assert bool((out["token_source"][i, : len(comps[i])] == REPLAY).all())
        assert torch.allclose(out["behaviour_logp"][i, : len(comps[i])],
                              _direct_logps(trainer.model, prompts[i], comps[i]), atol=1e-5)


def test_teacher_written_rows_keep_the_teachers_ids_and_its_logps(bpe, tmp_path, monkeypatch):
    """AMPO: every group fails, the teacher's correct candidates (one spelled as the tokenizer
    would, one not) replace the last two slots: the row is the candidate's ids under the chat
    prompt's ids, its behaviour log-probs the teacher's forward of exactly those ids."""
    trainer = _trainer(bpe, ["algo=ampo", f"teacher.source.models=[{bpe.teacher}]"], tmp_path)
    tok = trainer.processing_class
    _script(monkeypatch, tok, right=lambda i, guided: False)
    asked = []

    def sample(model, prompt_ids, n):
        asked.append(list(prompt_ids))
        a = sum(int(d) for d in re.findall(r"user\n([\d+]+)=", tok.decode(prompt_ids))[-1].split("+"))
        return [_spelled(tok, a) + [tok.eos_token_id], _ids(tok, f"{a} #### {a}") + [tok.eos_token_id]][:n]

    trainer.parts.teachers.sample = sample
    inputs = _batch(trainer)
    out = trainer._generate_and_score_completions(inputs)
    prompts, comps = _rows(out)
    from transformers import AutoModelForCausalLM

    teacher = AutoModelForCausalLM.from_pretrained(bpe.teacher).eval()
    code = prov.code("teacher")
    written = [i for i in range(len(comps)) if int(out["row_source"][i]) == code]
    assert written == [i for i in range(len(comps)) if i % GEN >= GEN - 2]
    assert asked == [_chat_ids(tok, inputs[0]["prompt"]), _chat_ids(tok, inputs[GEN]["prompt"])]
    for i in written:
        a = int(inputs[i]["answer"])
        assert comps[i] in (_spelled(tok, a) + [tok.eos_token_id], _ids(tok, f"{a} #### {a}") + [tok.eos_token_id])
        assert prompts[i] == _chat_ids(tok, inputs[i]["prompt"])
        _assert_mask_is(out, i, len(comps[i]))
        assert bool((out["token_source"][i, : len(comps[i])] == code).all())
        assert torch.allclose(out["behaviour_logp"][i, : len(comps[i])], _direct_logps(teacher, prompts[i], comps[i]), atol=1e-4)
    assert {tuple(comps[i]) for i in written[:2]} == {tuple(_spelled(tok, int(inputs[0]["answer"])) + [tok.eos_token_id]),
                                                     tuple(_ids(tok, f"{inputs[0]['answer']} #### {inputs[0]['answer']}") + [tok.eos_token_id])}


def test_a_privileged_self_teacher_scores_the_students_ids_under_its_own_chat_prompt(bpe, tmp_path, monkeypatch):
    """OPSD: the solution is text in the teacher's user turn (its prompt is re-rendered by the
    chat template); the completion it scores is the student's ids, unchanged."""
    trainer = _trainer(bpe, ["algo=opsd"], tmp_path)
    tok = trainer.processing_class
    _script(monkeypatch, tok)
    inputs = _batch(trainer)
    out = trainer._generate_and_score_completions(inputs)
    _, comps = _rows(out)
    for i, row in enumerate(inputs):
        teacher_prompt = trainer.parts.teachers.spec.teacher_prompt(row)
        assert row["expert"][0] in teacher_prompt[-1]["content"]
        expect = _direct_logps(trainer.model, _chat_ids(tok, teacher_prompt), comps[i])
        assert torch.allclose(out["teacher_logp"][i, : len(comps[i])], expect, atol=1e-5)
