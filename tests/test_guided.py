"""Guided rollouts: prefix-conditioned rollouts (Prefix-RFT, PrefixRL, UFT, POPE) and hints
when a group fails (Guide, GHPO).

The trainer-level tests build the real trainer on the tiny model and check what a term
sees: the prefix tokens' gradient is exactly the configured term's (zero by default), the
continuation tokens' old log-probs are a direct forward of prompt + prefix + continuation,
Guide's hinted tokens carry pi_old(y | x, h) and are trained under x, and regenerated
rollouts count toward the rollout budget."""

from __future__ import annotations

import random
import re

import pytest
import torch

from mixrl.config.builders import build_injection
from mixrl.config.compose import compose_config
from mixrl.core import provenance as prov
from mixrl.core.terms import TERMS, TermInputs
from mixrl.errors import ConfigError
from mixrl.sources import InjectContext, Rollouts
from mixrl.sources.hint import HINTED, HintOnFailure, with_hint
from mixrl.sources.prefix import PREFIX, PrefixCondition, PrefixLength, prompt_key
from mixrl.sources.rows import splice_prefixes


# ----------------------------------------------------------------------------- pure parts
def test_splice_prefixes_puts_the_prefix_first_with_its_provenance_and_no_logprob():
    ids, lp, ts = splice_prefixes(
        [[7, 8, 0], [5, 0], [1, 2, 3, 4]], [[-0.1, -0.2, -0.3], [-0.5, -0.6], [-1.0, -1.1, -1.2, -1.3]],
        [[40, 41], [], [30, 31, 32]], max_len=5, prefix_code=PREFIX, continuation_code=prov.ON_POLICY,
    )
    assert ids == [[40, 41, 7, 8, 0], [5, 0], [30, 31, 32, 1, 2]]  # the last continuation loses its tail
    assert lp == [[None, None, -0.1, -0.2, -0.3], [-0.5, -0.6], [None, None, None, -1.0, -1.1]]
    assert ts == [[PREFIX, PREFIX, prov.ON_POLICY, prov.ON_POLICY, prov.ON_POLICY], None,
                  [PREFIX] * 3 + [prov.ON_POLICY] * 2]
    assert splice_prefixes([[1]], None, [[9]], max_len=4, prefix_code=PREFIX, continuation_code=0)[1] is None


def test_prefix_provenance_has_no_behaviour_and_hinted_a_stored_one():
    assert prov.provenance("prefix").behaviour == "unknown"
    assert prov.provenance("hinted").behaviour == "stored"


def test_prefix_length_fixed_uniform_binomial_tokens_and_caps():
    rng = random.Random(0)
    assert PrefixLength(0.5).draw(rng, 10, 0, 32) == 5
    assert PrefixLength(1.0).draw(rng, 10, 0, 8) == 7  # at least one token is left to sample
    u = [PrefixLength([0.2, 0.6], sample="uniform").draw(rng, 10, 0, 32) for _ in range(300)]
    assert min(u) == 2 and max(u) == 6
    b = [PrefixLength(0.3, sample="binomial").draw(rng, 20, 0, 64) for _ in range(2000)]
    assert abs(sum(b) / len(b) - 6.0) < 0.3  # Binomial(20, 0.3) has mean 6
    assert PrefixLength(tokens=3).draw(rng, 10, 0, 32) == 3
    assert PrefixLength(tokens=30).draw(rng, 10, 0, 32) == 10
    sched = PrefixLength({"name": "linear", "start": 0.8, "end": 0.0, "steps": 10})
    assert sched.draw(rng, 10, 0, 32) == 8 and sched.draw(rng, 10, 5, 32) == 4 and sched.draw(rng, 10, 10, 32) == 0
    for bad in (dict(fraction=[0.2, 0.6]), dict(fraction=1.5), dict(fraction=0.5, sample="x"),
                dict(tokens=[3, 1]), dict(tokens=3, sample="binomial")):
        with pytest.raises(ConfigError):
            PrefixLength(**bad)


class _Tok:
    eos_token_id, pad_token_id = 0, 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def _ctx(process_index=0, num_processes=1, G=4, max_len=32, step=0, logs=None, gathered=None):
    return InjectContext(
        tokenizer=_Tok(), process_index=process_index, num_processes=num_processes, num_generations=G,
        max_completion_length=max_len, global_step=step, micro_step=0, device=torch.device("cpu"),
        tokenize_prompts=lambda ps: [[ord(c) for c in p] for p in ps],
        gather=(lambda t: t) if gathered is None else gathered,
        log=None if logs is None else (lambda k, v: logs.setdefault(k, []).append(v)),
    )


class _Expert:
    provenances = ("expert",)
    requires_expert_column = False

    def for_prompt(self, row):
        return row.get("expert") or []

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def test_prefix_injection_prefixes_the_first_slots_of_each_group_by_global_index():
    inj = PrefixCondition(fraction=0.5, per_group=1, source=_Expert())
    rows = [{"prompt": "1+2=", "expert": ["abcdef"]}] * 2 + [{"prompt": "3+4=", "expert": ["uvwxyz"]}] * 2
    # process 1 of 2, groups of 4: its rows are global 4..7, i.e. group 1 slots 0..3
    p = inj.generation_prefixes(_ctx(process_index=1, num_processes=2, G=4), rows)
    assert p == [[ord(c) for c in "abc"], [], [], []]
    # process 0 of 2 with groups of 2: slots 0, 1, 0, 1
    p = inj.generation_prefixes(_ctx(process_index=0, num_processes=2, G=2), rows)
    assert p == [[ord(c) for c in "abc"], [], [ord(c) for c in "uvw"], []]
    assert inj.generation_prefixes(_ctx(G=2), [{"prompt": "9+9=", "expert": []}] * 2) == [[], []]  # no solution: free


def test_pope_memory_prefixes_prompts_whose_free_rollouts_all_failed_and_checkpoints_it():
    inj = PrefixCondition(fraction=0.5, prompts="failed", source=_Expert())
    hard = {"prompt": "9+9=", "expert": ["18 #### 18"]}
    easy = {"prompt": "1+1=", "expert": ["2 #### 2"]}
    rows = [hard, hard, easy, easy]
    logs: dict = {}
    ctx = _ctx(G=2, logs=logs)
    assert inj.generation_prefixes(ctx, rows) == [[]] * 4  # never seen: free
    ctx.primary_rewards = torch.tensor([0.0, 0.0, 1.0, 0.0])
    inj.after_rewards(ctx, rows, ctx.primary_rewards)
    assert inj.failed == {prompt_key("9+9="): True, prompt_key("1+1="): False}
    p = inj.generation_prefixes(ctx, rows)
    assert p[0] == [ord(c) for c in "18 ##"] == p[1] and p[2] == [] == p[3]  # half of "18 #### 18"
    # a fully prefixed group says nothing about the policy alone: the memory keeps "failed"
    ctx.primary_rewards = torch.tensor([1.0, 1.0, 1.0, 1.0])
    inj.after_rewards(ctx, rows, ctx.primary_rewards)
    assert inj.failed[prompt_key("9+9=")] is True
    assert logs["prefix/groups"][-1] == 0.5 and logs["prefix/success"][-1] == 1.0
    fresh = PrefixCondition(fraction=0.5, prompts="failed", source=_Expert())
    fresh.load_state_dict(__import__("json").loads(__import__("json").dumps(inj.state_dict())))
    assert fresh.failed == inj.failed


def test_with_hint_places_the_hint_in_text_and_in_the_last_user_message():
    assert with_hint("3+5=", "8", "{prompt}{hint}") == "3+5=8"
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    out = with_hint(msgs, "h", "{prompt}\nHint: {hint}")
    assert out[1]["content"] == "q\nHint: h" and msgs[1]["content"] == "q"


def test_hint_injection_regenerates_only_failed_groups_and_counts_what_it_discards():
    """Group 0 fails, group 1 succeeds once: only group 0 is generated again, with the hint,
    and its failed completions are recorded as discarded (their tokens)."""
    rows = [{"prompt": "9+9=", "expert": ["18 #### 18"], "answer": "18"}] * 2 + [{"prompt": "1+1=", "expert": ["2 #### 2"], "answer": "2"}] * 2
    calls = {"generate": [], "score": 0}

    def generate(prompts):
        calls["generate"].append(prompts)
        return [[ord("Z")] * 3 for _ in prompts], None

    def score(inputs, completions):
        calls["score"] += 1
        ok = [1.0 if c and c[0] in (ord("Z"), ord("2")) else 0.0 for c in completions]
        return torch.tensor(ok).unsqueeze(1)

    ctx = _ctx(G=2)
    ctx.generate, ctx.score = generate, score
    ctx.behaviour_logps = lambda p, c: [[-0.5] * len(x) for x in c]
    inj = HintOnFailure(fraction=0.5, source=_Expert())
    r = Rollouts([[ord("7"), 0], [ord("8"), ord("8"), 0], [ord("2"), 0], [ord("5"), 0]], None, [prov.ON_POLICY] * 4,
                 prompt_ids=[[1], [1], [2], [2]])
    r = inj.after_generation(ctx, rows, r)
    assert calls["generate"] == [[[ord(c) for c in "9+9=18 ##"]] * 2]  # hinted prompt: half the solution
    assert r.completion_ids[:2] == [[ord("Z")] * 3] * 2 and r.completion_ids[2:] == [[ord("2"), 0], [ord("5"), 0]]
    assert r.discarded_tokens == [2, 3]
    assert r.guided == [2, 2, 0, 0]
    assert r.token_source[:2] == [[HINTED] * 3] * 2 and r.token_source[2:] == [None, None]
    assert r.behaviour_logp[:2] == [[-0.5] * 3] * 2
    assert r.prompt_ids == [[1], [1], [2], [2]]  # Guide trains under the unhinted prompt


def test_hint_injection_escalates_the_hint_while_the_group_fails_and_plain_training_uses_the_hinted_prompt():
    rows = [{"prompt": "9+9=", "expert": ["18 #### 18"], "answer": "18"}] * 2
    seen = []

    def generate(prompts):
        seen.append(prompts)
        good = len(seen) == 3  # succeeds only with the third (longest) hint
        return [[ord("Z") if good else ord("N")] for _ in prompts], None

    ctx = _ctx(G=2)
    ctx.generate = generate
    ctx.score = lambda inputs, comps: torch.tensor([[1.0 if c[0] == ord("Z") else 0.0] for c in comps])
    inj = HintOnFailure(fraction=[0.2, 0.5, 0.8], train_under="hinted", source=_Expert())
    r = Rollouts([[ord("7")], [ord("8")]], None, [prov.ON_POLICY] * 2, prompt_ids=[[1], [1]])
    r = inj.after_generation(ctx, rows, r)
    # 20%, 50%, 80% of the 10-character solution, each tried while the group still fails
    assert [p[0] for p in seen] == [[ord(c) for c in "9+9=" + h] for h in ("18", "18 ##", "18 #### ")]
    assert r.completion_ids == [[ord("Z")], [ord("Z")]] and r.discarded_tokens == [1, 1, 1, 1, 1, 1]
    assert r.prompt_ids == [[ord(c) for c in "9+9=18 #### "]] * 2 and r.token_source == [None, None]
    with pytest.raises(ConfigError):
        HintOnFailure(fraction=0.0)
    with pytest.raises(ConfigError):
        HintOnFailure(template="{prompt}")


# ----------------------------------------------------------------------------- the term
def test_advantage_nll_value_and_gradient_by_hand_with_top_entropy():
    logp = torch.tensor([[-0.5, -1.0, -2.0, -0.1], [-0.3, -0.7, -0.2, -0.4]], requires_grad=True)
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    ent = torch.tensor([[0.9, 0.1, 0.5, 3.0], [0.2, 0.8, 5.0, 5.0]])
    A = torch.tensor([2.0, -1.0])
    out = TERMS.get("advantage_nll")(TermInputs(logp, mask, A, logp.detach(), entropies=ent), top_entropy=0.4)
    # 5 selected tokens, top 40% -> 2 tokens: entropies 0.9 (row 0, t 0) and 0.8 (row 1, t 1)
    keep = torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0]])
    expected = -A.unsqueeze(1) * keep * logp.detach()
    assert torch.allclose(out.per_token, expected)
    out.per_token.sum().backward()
    assert torch.allclose(logp.grad, -A.unsqueeze(1) * keep)
    full = TERMS.get("advantage_nll")(TermInputs(logp.detach(), mask, A, logp.detach(), entropies=ent))
    assert torch.allclose(full.per_token, -A.unsqueeze(1) * mask.float() * logp.detach())


def test_config_checks_for_guided_methods():
    for algo in ("prefix_rft", "prefixrl", "uft", "pope", "guide", "ghpo"):
        compose_config([f"algo={algo}"])
    with pytest.raises(ConfigError, match="importance ratio"):  # no ratio on prefix tokens
        compose_config(["algo=prefixrl", "algo.terms.policy.tokens=[on_policy,prefix]"])
    with pytest.raises(ConfigError, match="hinted"):  # Guide's hinted tokens must be trained
        compose_config(["algo=guide", "algo.terms.policy.tokens=[on_policy]"])
    with pytest.raises(ConfigError, match="per_group"):
        compose_config(["algo=prefix_rft", "algo.inject.per_group=9"])


@pytest.mark.parametrize("template, words", [
    ("{prompt}{hint} {answer}", "has an unknown placeholder {answer}; it may use only {prompt}, {hint}"),
    ("{prompt}{}{hint}", "has a positional placeholder {}"),
    ("{prompt}{hint} {", "is not a valid template (Single '{' encountered"),
    ("{prompt}{hint!r}", "{hint} takes no conversion or format spec"),
])
def test_a_hint_template_may_use_only_its_placeholders(template, words):
    """A template is checked when the config is composed: an unknown placeholder would raise a
    KeyError mid-run, the first time a group fails."""
    with pytest.raises(ConfigError, match=re.escape(f"algo.inject.template={template!r}") + ".*" + re.escape(words)):
        compose_config(["algo=guide", f"algo.inject.template='{template}'"])
    cfg = compose_config(["algo=guide", "algo.inject.template='{prompt} {{note}} {hint}'"])  # literal braces, doubled
    assert with_hint("1+1=", "2", cfg.algo.inject.template) == "1+1= {note} 2"
    assert build_injection(cfg).texts() == [" {note} "]


# ----------------------------------------------------------------------------- the trainer
def _trainer(overrides, model_path, tmp_path):
    from mixrl.trainer import build

    cfg = compose_config([*overrides, f"model.path={model_path}", f"run_dir={tmp_path / 'run'}", "trainer.save_steps=0"])
    torch.manual_seed(0)
    trainer = build.trainer_from_config(cfg)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps  # set by Trainer.train()
    return trainer


def _batch(trainer, prompts=2):
    ds = trainer.train_dataset
    G = trainer.num_generations
    return [dict(ds[i]) for i in range(prompts) for _ in range(G)]


def _direct_logps(model, prompt_ids, completion_ids):
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion_ids).unsqueeze(1)).squeeze(1)


def _leaf_logps(trainer):
    """Make the trainer's per-token log-probs a leaf tensor (to read dL/dlogp)."""
    captured = {}
    forward = trainer.parts.forwards.by_row_kind

    def leaf(model, inputs):
        logps, ent = forward(model, inputs)
        captured["logp"] = logps.detach().requires_grad_(True)
        captured["entropies"] = ent.detach()
        return captured["logp"], ent

    trainer.parts.forwards.by_row_kind = leaf
    return captured


def _rows(out):
    prompt = [ids[m.bool()].tolist() for ids, m in zip(out["prompt_ids"], out["prompt_mask"])]
    comp = [ids[m.bool()].tolist() for ids, m in zip(out["completion_ids"], out["completion_mask"])]
    return prompt, comp


FAST = ["trainer.prompts_per_step=2", "algo.num_generations=4", "trainer.micro_batch_size=8", "trainer.eval_size=0",
        "trainer.max_completion_length=24", "data.train_size=16", "data.levels=[4,5]", "logger.progress=false",
        "hardware.torch_threads=1", "trainer.num_iterations=2"]  # TRL computes old log-probs from 2 iterations


@pytest.mark.slow
@pytest.mark.parametrize("algo, prefix_grad", [("prefixrl", "zero"), ("prefix_rft", "advantage_nll")])
def test_prefixed_rows_gradient_and_old_logps(tiny_model_path, tmp_path, algo, prefix_grad):
    over = [f"algo={algo}", *FAST, "algo.inject.per_group=2", "algo.inject.sample=fixed", "algo.inject.fraction=0.5"]
    if algo == "prefix_rft":
        over.append("algo.terms.prefix.top_entropy=null")
    trainer = _trainer(over, tiny_model_path, tmp_path)
    inputs = _batch(trainer)
    out = trainer._generate_and_score_completions(inputs)
    prompts, comps = _rows(out)
    ts = out["token_source"]
    tok = trainer.processing_class
    for i in range(len(inputs)):
        sol = list(tok(text=inputs[i]["expert"][0], add_special_tokens=False)["input_ids"])
        n_prefix = int((ts[i] == PREFIX).sum())
        if i % 4 < 2:  # the first two slots of each group continue from half the solution
            assert n_prefix == round(0.5 * len(sol)) and comps[i][:n_prefix] == sol[:n_prefix]
            assert bool((ts[i, :n_prefix] == PREFIX).all())
        else:
            assert n_prefix == 0
        # the continuation's old log-probs are a direct forward of prompt + prefix + continuation
        direct = _direct_logps(trainer.model, prompts[i], comps[i])
        old = out["old_per_token_logps"][i, n_prefix : len(comps[i])]
        assert torch.allclose(old, direct[n_prefix:], atol=1e-5), (old, direct[n_prefix:])
    assert trainer.batch_in_flight.normalisers is not None
    captured = _leaf_logps(trainer)
    loss = trainer._compute_loss(trainer.model, out)
    loss.backward()
    g = captured["logp"].grad
    mask = out["completion_mask"].bool()
    prefix = mask & (ts == PREFIX)
    on = mask & (ts == prov.ON_POLICY)
    A = out["advantages"].unsqueeze(1).expand_as(g)
    key = "on_policy+prefix" if algo == "prefix_rft" else "on_policy"
    N = trainer.batch_in_flight.normalisers[key][0]
    if prefix_grad == "zero":
        assert bool(prefix.any()) and torch.equal(g[prefix], torch.zeros_like(g[prefix]))
    else:  # l = -A log p on every prefix token, normalised over rollout + prefix tokens
        assert torch.allclose(g[prefix], -A[prefix] / N, atol=1e-6)
    # sampled tokens: PPO-clip at r = 1 (old = current policy): dL/dlogp = -A / N
    assert torch.allclose(g[on], -A[on] / N, atol=1e-5)
    assert not bool(torch.isnan(g).any())


def _hint_generation(trainer):
    """Deterministic rollouts: wrong without a hint; with one (a prompt longer than the
    problem), right on every other row."""
    tok = trainer.processing_class

    def generate(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        out = []
        for i, ids in enumerate(prompt_ids):
            text = tok.decode(ids, skip_special_tokens=True)
            expr, _, rest = text.partition("=")
            answer = sum(int(d) for d in expr.split("+"))
            good = bool(rest) and i % 2 == 0
            out.append(list(tok(text=f"{answer if good else answer + 1} #### {answer if good else answer + 1}",
                                add_special_tokens=False)["input_ids"]) + [tok.eos_token_id])
        return out, None

    return generate


@pytest.mark.slow
@pytest.mark.parametrize("train_under", ["unhinted", "hinted"])
def test_hinted_rows_ratio_prompt_and_budget(tiny_model_path, tmp_path, monkeypatch, train_under):
    import trl

    trainer = _trainer(["algo=guide", *FAST, f"algo.inject.train_under={train_under}"]
                       + (["algo.terms.policy.tokens=[on_policy]"] if train_under == "hinted" else []),
                       tiny_model_path, tmp_path)
    monkeypatch.setattr(trl.GRPOTrainer, "_generate_single_turn", _hint_generation(trainer))
    inputs = _batch(trainer)
    out = trainer._generate_and_score_completions(inputs)
    prompts, comps = _rows(out)
    tok = trainer.processing_class
    n = len(inputs)
    assert trainer.mixrl_rollouts == 2 * n  # every group failed: n first rollouts + n hinted ones
    expected_tokens = sum(len(c) for c in comps) + sum(len(x) for x in [  # first pass (discarded) + hinted (trained)
        tok(text=f"{a} #### {a}", add_special_tokens=False)["input_ids"] + [0]
        for a in (sum(int(d) for d in r["prompt"].rstrip("=").split("+")) + 1 for r in inputs)])
    assert trainer.mixrl_generated_tokens == expected_tokens
    rewards = trainer.batch_in_flight.rewards_per_func[:, 0]
    assert rewards.tolist() == [1.0, 0.0] * (n // 2)  # the hinted regeneration, scored
    for i, row in enumerate(inputs):
        sol = list(tok(text=row["expert"][0], add_special_tokens=False)["input_ids"])
        hint = tok.decode(sol[: round(0.5 * len(sol))], skip_special_tokens=True)
        hinted_prompt = trainer._tokenize_prompts([row["prompt"] + hint])[0][0]
        plain_prompt = trainer._tokenize_prompts([row["prompt"]])[0][0]
        if train_under == "unhinted":
            assert prompts[i] == plain_prompt  # trained under x
            assert bool((out["token_source"][i, : len(comps[i])] == HINTED).all())
            direct = _direct_logps(trainer.model, hinted_prompt, comps[i])  # pi_old(y | x, h)
            assert torch.allclose(out["behaviour_logp"][i, : len(comps[i])], direct, atol=1e-5)
            old = _direct_logps(trainer.model, plain_prompt, comps[i])  # pi_old(y | x)
            assert torch.allclose(out["old_per_token_logps"][i, : len(comps[i])], old, atol=1e-5)
        else:
            assert prompts[i] == hinted_prompt  # plain hinted training: x + h is the prompt
            assert bool((out["token_source"][i, : len(comps[i])] == prov.ON_POLICY).all())
    captured = _leaf_logps(trainer)
    loss = trainer._compute_loss(trainer.model, out)
    loss.backward()
    g, logp = captured["logp"].grad, captured["logp"].detach()
    mask = out["completion_mask"].bool()
    A = out["advantages"].unsqueeze(1).expand_as(g)
    key = "on_policy+hinted" if train_under == "unhinted" else "on_policy"
    N = trainer.batch_in_flight.normalisers[key][0]
    if train_under == "unhinted":
        # PPO-clip on r = pi_theta(y|x) / pi_old(y|x,h) (eps = 0.2): gradient -A r / N where the
        # unclipped branch is the minimum, 0 where the clipped one is
        r = torch.exp(logp - out["behaviour_logp"])
        unclipped = ((A > 0) & (r <= 1.2)) | ((A < 0) & (r >= 0.8))
        expected = torch.where(unclipped, -A * r / N, torch.zeros_like(r))
        assert bool((r[mask] < 0.999).any())  # the ratio really is against the hinted behaviour
    else:
        expected = -A / N
    assert torch.allclose(g[mask], expected[mask], atol=1e-5)


@pytest.mark.slow
def test_injections_never_run_outside_training(tiny_model_path, tmp_path):
    """Held-out generation is unprefixed and unhinted: with the model in eval mode the
    trainer neither asks for prefixes nor calls any hook."""
    trainer = _trainer(["algo=prefixrl", *FAST], tiny_model_path, tmp_path)
    called = []
    inj = trainer.parts.injections.injections[0]
    inj.generation_prefixes = lambda *a, **k: called.append("prefix") or None
    trainer.model.eval()
    out = trainer._generate_and_score_completions(_batch(trainer))
    assert called == [] and not bool((out["token_source"] == PREFIX).any())
