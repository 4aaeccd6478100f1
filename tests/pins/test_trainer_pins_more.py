"""Trainer pins for the algos the first 21 cases left out (``trainer_pins_more.json``, made at
commit 452baff by ``make_pins.py --only trainer-more``; the algos added since, by
``make_pins.py --only trainer-more --missing``, each case with the commit that made it): with these,
every ``conf/algo/*.yaml`` has at least one trainer pin (``test_every_shipped_algo_is_pinned``).

Same harness, model and tolerances as ``test_trainer_pins.py`` (read its docstring): each case
runs ``harness.run_one_step`` on the committed pin model for one optimizer step (two for the
replay algos, whose buffer needs a past step), with the rollouts the case names
(``rollouts.tolerant_completion``: prompts may carry a hint or a demonstration prefix;
``rollouts.collapsing_completion`` for ExGRPO and RePO: every group of the second step fails,
so their replay fill acts), and
compares every micro-batch loss, every pinned metric and the gradient (norm and 4 random
projections) to ``|got - pinned| <= ABS + REL * |pinned|`` (projections: floor ABS x norm).

Teachers: the pin model folder itself (``@PIN_MODEL@`` in the stored overrides), with the
expert solution or the answer in its prompt (``teacher.source.privileged``), so its log-probs
differ from the student's; no built-in teacher is built. What these rollouts do not reach:
AMPO's teacher refill (no group fails, and the teacher's candidates would be sampled by HF
generate, which is not patched); that case pins the rest of AMPO's step (its on-policy term,
Dr. GRPO advantages, normalisers over rollout and teacher tokens, entropy bonus).
``algo=critique_grpo|old reading`` is the case made at 452baff for mixrl's earlier Critique-GRPO
preset, with the overrides that restore it (``algo.inject.refine=failed algo.loss.clip=true
algo.aggregation.name=token-mean algo.entropy_coef=0.0``), its values unchanged; ``algo=critique_grpo``
pins the preset's loss that follows the authors' script (unclipped, token sums over the maximum length,
entropy 0.001; issue 49, by hand in ``tests/test_feedback_presets.py``), made with ``--missing`` at the
commit it records, with the refinement rule it was made with (``algo.inject.refine=failed``, added to
its stored overrides when the preset moved to the authors' ``refine=all``, values unchanged).
``algo=osp|old reading`` is the pin of the earlier OSP preset (the strength from the run's reward), with
the overrides that restore it (``algo.inject.name=group_pairs algo.terms.osp.strength=reward``), values
unchanged; the self-judged preset (issue 52) is pinned by the coordinator.

Measured on one avx512 machine (``-s`` prints each case's largest fraction of tolerance): under
``ATEN_CPU_CAPABILITY=avx2`` (the kernels the pins were made with) 0 (bit for bit); under
avx512 at most 5.8% and under default at most 5.3% (the second step of
``algo=remix|max_steps=2``); first steps at most 4.3% (``algo=exopd``). A 0.1% change of the
k2 estimator moves ``algo=opd`` by 9.5x the tolerance
(``test_the_new_pins_catch_a_one_line_distillation_change``). Time: about 1.1 s a case, 24 s
for the file alone (~6 s of it first-call imports that other trainer tests share).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import rollouts  # noqa: E402
from harness import run_one_step  # noqa: E402

PINS = json.loads((HERE / "trainer_pins_more.json").read_text())
FIRST = json.loads((HERE / "trainer_pins.json").read_text())
PIN_MODEL = HERE.parent / "fixtures" / "pin-model"
PLACEHOLDER = "@PIN_MODEL@"
REL, ABS = 1e-4, 1e-5  # as test_trainer_pins.py


def _frac(got: float, want: float, abs_: float = ABS) -> float:
    """|got - want| as a fraction of the tolerance (> 1: outside)."""
    return abs(got - want) / (abs_ + REL * abs(want))


def deviations(want: dict, got: dict) -> tuple[list[str], float]:
    """(every difference beyond tolerance, the largest fraction of tolerance used)."""
    for what in ("steps",):
        if got[what] != want[what]:
            return [f"{got[what]} optimizer steps, pinned {want[what]}"], float("inf")
    for what in ("losses", "metrics", "grads"):
        if len(got[what]) != len(want[what]):
            return [f"{len(got[what])} {what}, pinned {len(want[what])}"], float("inf")
    checks: list[tuple[str, float, float, float]] = []  # (name, got, want, absolute floor)
    checks += [(f"loss of micro-batch {i}", g, w, ABS) for i, (g, w) in enumerate(zip(got["losses"], want["losses"]))]
    bad = []
    for i, (g, w) in enumerate(zip(got["metrics"], want["metrics"])):
        for k, v in w.items():
            if k not in g:
                bad.append(f"step row {i}: {k} missing")
            else:
                checks.append((f"step row {i}: {k}", g[k], v, ABS))
    for i, (g, w) in enumerate(zip(got["grads"], want["grads"])):
        if g["numel"] != w["numel"]:
            bad.append(f"step {i}: {g['numel']} gradient entries, pinned {w['numel']}")
            continue
        checks.append((f"step {i}: grad norm", g["norm"], w["norm"], ABS))
        floor = ABS * max(1.0, w["norm"])
        checks += [(f"step {i}: grad projection {j}", a, b, floor) for j, (a, b) in enumerate(zip(g["proj"], w["proj"]))]
    worst = max((_frac(g, w, f) for _, g, w, f in checks), default=0.0)
    bad += [f"{name}: {g!r}, pinned {w!r}" for name, g, w, f in checks if _frac(g, w, f) > 1.0]
    return bad, worst


@pytest.fixture(scope="module")
def pin_model() -> str:
    digest = hashlib.sha256((PIN_MODEL / "model.safetensors").read_bytes()).hexdigest()
    assert digest == PINS["meta"]["model_sha256"], f"{PIN_MODEL} is not the model the pins were made with"
    return str(PIN_MODEL)


def test_every_shipped_algo_is_pinned():
    """Each conf/algo/*.yaml is the algo of a trainer pin (sft_then_rl: through its stages)."""
    from mixrl.config.compose import conf_dir

    shipped = {p.stem for p in (conf_dir() / "algo").glob("*.yaml")}
    assert len(shipped) >= 27
    pinned = {k.split("|")[0].removeprefix("algo=") for k in [*FIRST["cases"], *PINS["cases"]] if k.startswith("algo=")}
    # a staged algo (``stages:``) is pinned through its stages' algos, each of which must be pinned
    staged = {name: [st["algo"] for st in spec["stages"]] for name in shipped - pinned
              if (spec := yaml.safe_load((conf_dir() / "algo" / f"{name}.yaml").read_text())).get("stages")}
    assert {name for name, algos in staged.items() if set(algos) <= pinned} == set(staged)
    assert shipped - pinned - set(staged) == EPISODIC


#: presets whose rollouts are episodes of a chat environment (env=arith_steps): the pin model has no chat
#: template and the harness scripts single-turn completions only; their per-token gradients are computed
#: by hand in tests/test_episode_injections.py instead
EPISODIC = {"uis1", "bepa"}


#: a preference term's margin below this is float noise (at the pinned step the policy is its reference)
TIED_MARGIN = 1e-6


def sign_of_noise(pinned_row: dict) -> set[str]:
    """The ``<term>/accuracy`` metrics (share of pairs with margin > 0) of a pinned row whose
    ``<term>/margin`` is float noise: their value is the sign of that noise, which differs between
    CPU kernel sets (the avx2 run gave 1/3 where avx512 gave 0). The margin itself stays pinned."""
    return {k.removesuffix("/margin") + "/accuracy" for k, v in pinned_row.items()
            if k.endswith("/margin") and abs(v) < TIED_MARGIN}


def comparable(result: dict, pinned: dict) -> dict:
    rows = [{k: v for k, v in row.items() if not k.endswith("seconds") and k not in sign_of_noise(p)}
            for row, p in zip(result["metrics"], pinned["metrics"])]
    return {**result, "metrics": rows}


def test_only_tied_preference_accuracies_are_left_out():
    assert sign_of_noise({"dpo/margin": -2.5e-08, "dpo/accuracy": 0.0, "wpo/margin": 0.3, "accuracy": 0.5}) == {"dpo/accuracy"}


@pytest.mark.parametrize("key", list(PINS["cases"]))
def test_trainer_pin_more(key, pin_model, tmp_path):
    case = PINS["cases"][key]
    overrides = [o.replace(PLACEHOLDER, pin_model) for o in case["overrides"]]
    got = run_one_step(overrides, pin_model, tmp_path, completion=getattr(rollouts, case["rollouts"]))
    got["metrics"] = [{k: v for k, v in row.items() if not k.endswith("seconds")} for row in got["metrics"]]
    bad, worst = deviations(comparable(case["result"], case["result"]), comparable(got, case["result"]))
    print(f"{key}: {worst:.4f} of the tolerance")  # shown with -s: the measure in the docstring
    assert not bad, f"{key}: " + "; ".join(bad[:8]) + (f" (+{len(bad) - 8} more)" if len(bad) > 8 else "")


def test_the_new_pins_catch_a_one_line_distillation_change(pin_model, tmp_path, monkeypatch):
    """k2 = x^2 / 2 -> 1.001 x^2 / 2 (a 0.1% change of the teacher KL) is caught by algo=opd,
    whose loss is that KL alone: the tolerance is loose across CPUs, not blind."""
    from mixrl.core import regularizers

    k2 = regularizers.KL_ESTIMATORS.get("k2")
    assert "k2" in regularizers.KL_ESTIMATORS._items
    monkeypatch.setitem(regularizers.KL_ESTIMATORS._items, "k2", lambda logp, ref: 1.001 * k2(logp, ref))
    case = PINS["cases"]["algo=opd"]
    got = run_one_step([o.replace(PLACEHOLDER, pin_model) for o in case["overrides"]], pin_model, tmp_path,
                       completion=getattr(rollouts, case["rollouts"]))
    bad, worst = deviations(case["result"], got)
    print(f"k2 x 1.001: {worst:.1f}x the tolerance")
    assert bad and worst > 2, f"a 0.1% change of k2 used only {worst:.2f} of the tolerance"
