"""Registry behaviour and the contract every registered component must meet."""

import ast
import inspect
import pathlib

import pytest

import mixrl.core as core
from mixrl.core import REGISTRIES, Registry, UnknownComponentError
from mixrl.errors import ConfigError

CORE_DIR = pathlib.Path(core.__file__).parent
# dict | None: a term's nested component spec ({name, params...}: a policy loss, a token weight)
ALLOWED_ANNOTATIONS = {float, int, bool, str, float | None, int | None, dict | None}
ALLOWED_IMPORTS = {"torch", "math", "dataclasses", "inspect", "typing", "collections",
                   "types", "sys", "re", "__future__", "mixrl"}


def test_register_get_names_contains_params():
    reg = Registry("widget")

    @reg.register("b")
    def b(x, *, alpha: float = 0.5, n: int | None = None):
        return x

    @reg.register("a")
    def a(x):
        return x

    assert reg.get("b") is b and reg.names() == ["a", "b"]
    assert "a" in reg and "zzz" not in reg
    params = reg.params("b")
    assert list(params) == ["alpha", "n"]
    assert params["alpha"].default == 0.5 and params["n"].annotation == (int | None)
    assert reg.params("a") == {}


def test_unknown_component_error_is_one_line_with_suggestion():
    with pytest.raises(UnknownComponentError) as e:
        core.POLICY_LOSSES.get("ppo_clp")
    msg = str(e.value)
    assert msg.startswith("unknown policy loss 'ppo_clp' (did you mean: ppo_clip")  # (, sppo?)
    assert "?); choices: " in msg
    assert "\n" not in msg and "sapo" in msg
    assert isinstance(e.value, KeyError) and isinstance(e.value, ConfigError)


def test_check_params():
    core.POLICY_LOSSES.check_params("ppo_clip", {"clip_low": 0.1, "dual_clip_c": None})
    core.POLICY_LOSSES.check_params("ppo_clip", {"dual_clip_c": 3})  # int is fine for float
    with pytest.raises(TypeError) as e:
        core.POLICY_LOSSES.check_params("ppo_clip", {"clip_hi": 0.3})
    assert "did you mean: clip_high" in str(e.value)
    with pytest.raises(TypeError):
        core.POLICY_LOSSES.check_params("ppo_clip", {"clip_low": True})


def test_expected_names_are_registered():
    assert set(core.POLICY_LOSSES.names()) == {
        "ppo_clip", "reinforce", "topr", "cispo", "gspo", "sapo", "m2po", "sft", "reshaped_ppo",
        "opmd", "asymre", "rec", "sppo", "vespo", "clip_cov", "kl_cov", "gmpo", "turn_ppo",
        "minpro", "etr", "r2vpo"}
    assert set(core.TOKEN_WEIGHTS.names()) == {"one", "p", "chord_phi", "chord_phi_clamp", "luffy"}
    assert set(core.AGGREGATIONS.names()) == {
        "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"}
    assert set(core.ADVANTAGES.names()) == {"grpo", "dr_grpo", "rloo", "reinforce", "batch_norm",
                                             "reinforce_pp", "reinforce_pp_baseline", "opo", "remax", "gae", "mt_grpo",
                                             "positive_amplified", "capo", "polychromic", "uis1"}
    assert set(core.KL_ESTIMATORS.names()) == {"k1", "k2", "k3", "k3_clamped"}
    assert set(core.CONTROLLERS.names()) == {"bapo", "entropic", "entropic_sign", "palu", "vcpo_ess", "r2vpo_dual"}
    assert set(core.SHAPINGS.names()) == {"none", "sign_weight", "psr_nsr", "ace", "arm", "dgpo", "row_weight", "calibrl", "egpo", "tempsamp",
                                             "aspo"}


def test_declaration_parses_summary_formula_paper():
    reg = Registry("widget")

    @reg.register("w")
    def w(x, *, alpha: float = 0.5, name_like: str = "k3"):
        """Widget weight: scales things
        by alpha. More prose here.

        Formula: ``w = {alpha} * x``, with KL_{name_like}
        and {unknown} braces kept; sum_{b,t} too

        Paper: "A Paper Title" (2025).
        Parameters:
            alpha (0.5): the scale.
            name_like (k3): a name.
        """
        return x

    @reg.register("bare")
    def bare(x, *, beta: int = 3, gamma: float | None = None):
        """A bare component without a formula.

        Formula: y = f(x)
        Parameters:
            beta (3): b.
            gamma (None): g.
        """
        return x

    @reg.register("undocumented")
    def undocumented(x):
        return x

    d = reg.declaration("w")
    assert d["summary"] == "Widget weight: scales things by alpha."
    assert d["formula"] == "w = {alpha} * x, with KL_{name_like} and {unknown} braces kept; sum_{b,t} too"
    assert d["paper"] == '"A Paper Title" (2025).'
    assert reg.declaration("bare") == {
        "name": "bare", "kind": "widget", "summary": "A bare component without a formula.",
        "formula": "y = f(x)", "paper": None,
    }
    assert reg.declaration("undocumented")["formula"] is None

    # placeholders filled from params, missing ones from the defaults; unknown braces untouched
    assert reg.formula("w") == "w = 0.5 * x, with KL_k3 and {unknown} braces kept; sum_{b,t} too"
    assert reg.formula("w", {"alpha": 2.0, "name_like": "k1"}).startswith("w = 2 * x, with KL_k1 and")
    assert reg.formula("w", {"alpha": 1e-6}).startswith("w = 1e-06 * x")
    # no placeholders: every config parameter with its value, after the formula
    assert reg.formula("bare") == "y = f(x) [beta=3, gamma=unset]"  # never "None" (issue 27)
    assert reg.formula("bare", {"gamma": 0.25}) == "y = f(x) [beta=3, gamma=0.25]"
    # a nested component reads as its name
    assert reg.formula("w", {"name_like": {"name": "chord_phi", "cutoff": None}}).endswith("KL_chord_phi and {unknown} braces kept; sum_{b,t} too")
    # no formula declared: the summary stands in
    assert reg.formula("undocumented") == "undocumented"


def test_real_formulas_fill_in_config_values():
    assert core.POLICY_LOSSES.formula("ppo_clip", {"clip_high": 0.28}).startswith(
        "l_t = max(-A r_t, -A clip(r_t, 1 - 0.2, 1 + 0.28))")
    assert core.TERMS.formula("shaped", {"gamma": 0.3}) == (
        "l_t = -A f(p_t), f(p) = p / (p + 0.3) (behaviour probability taken as 1)")
    assert core.TERMS.formula("policy", {"loss": {"name": "cispo"}}).startswith("l_t = cispo(r_t, A)")
    assert core.ADVANTAGES.formula("dr_grpo") == "A_i = R_i - mean_g R over the prompt's group g (no std division)"
    assert core.AGGREGATIONS.formula("token-mean").endswith("[max_len=unset]")
    assert core.AGGREGATIONS.formula("seq-mean-token-sum-norm").startswith("L = (1 / N) sum_b sum_t l_t / T,")
    assert core.AGGREGATIONS.formula("seq-mean-token-sum-norm", {"max_len": 32}).startswith("L = (1 / N) sum_b sum_t l_t / 32,")


def _all_registries():
    from mixrl.sources import INJECTIONS, SOURCES

    return {**REGISTRIES, "source": SOURCES, "injection": INJECTIONS}


DECLARED = [(key, name) for key, reg in _all_registries().items() for name in reg.names()]


@pytest.mark.parametrize("key,name", DECLARED)
def test_every_component_declares_a_formula(key, name):
    reg = _all_registries()[key]
    d = reg.declaration(name)
    assert d["summary"], f"{key} {name}: no summary line"
    assert d["formula"], f"{key} {name}: no 'Formula:' line in its docstring"
    assert "METHODS.md" not in (inspect.getdoc(reg.get(name)) or ""), f"{key} {name}: cite the paper by title"
    reg.formula(name)  # fills in with the defaults


COMPONENTS = [(key, name) for key, reg in REGISTRIES.items() for name in reg.names()]


@pytest.mark.parametrize("key,name", COMPONENTS)
def test_component_contract(key, name):
    reg = REGISTRIES[key]
    obj = reg.get(name)
    for p in reg.params(name).values():
        assert p.default is not inspect.Parameter.empty, f"{key} {name}.{p.name} has no default"
        assert p.annotation in ALLOWED_ANNOTATIONS, f"{key} {name}.{p.name}: {p.annotation}"
    doc = inspect.getdoc(obj) or ""
    assert "Paper" in doc and "Parameters" in doc, f"{key} {name}: docstring lacks Paper/Parameters"
    for pname in reg.params(name):
        assert pname in doc, f"{key} {name}: parameter {pname} undocumented"


@pytest.mark.parametrize(
    "path", sorted(p for p in CORE_DIR.glob("*.py") if p.name != "objective.py"), ids=lambda p: p.name
)
def test_core_is_pure_tensor_math(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mods = [node.module or ""]
        else:
            continue
        for mod in mods:
            top = mod.split(".")[0]
            assert top in ALLOWED_IMPORTS, f"{path.name} imports {mod}"
            if top == "mixrl":
                # mixrl.registry: the one registry type, standard library only
                assert mod.startswith(("mixrl.core", "mixrl.errors", "mixrl.registry")), f"{path.name}: {mod}"


def test_docs_cover_terms_sources_injections_and_provenances():
    from mixrl.sources.docs import render_components_markdown

    text = render_components_markdown()
    for title in ("## Terms", "## Off-policy sources", "## Injections", "## Token provenances"):
        assert title in text
    for name in ("shaped", "teacher_kl", "expert", "group_replace", "append_rows", "replace_all"):
        assert f"### `{name}`" in text
    assert "| `on_policy` | `policy` |" in text and "| `expert` | `unknown` |" in text
    assert "Formula: `l_t = -A f(p_t), f(p) = p / (p + {gamma}) (behaviour probability taken as 1)`" in text
    assert "METHODS.md" not in text
