"""Benchmarks as config: ``conf/benchmarks/NAME.yaml``, one file per benchmark or suite.

A benchmark file::

    name: aime24
    title: AIME 2024
    source: HuggingFaceH4/aime_2024   # hub id, a local .jsonl/.json/.parquet file or folder, or builtin:arith
    subset: null
    split: train
    columns: {problem: problem, answer: answer, id: id}   # dotted paths reach nested fields (final_answer.0)
    choices: null            # multiple choice: {column: options} | {column: choices.text, labels: choices.label}
                             # | {columns: [Correct Answer, Incorrect Answer 1, ...], correct: 0, shuffle_seed: 0}
    prompt:
      template: "{problem}"  # the user message; {choices} is the lettered options (A) ...)
      system_prompt: null    # null: the run's data.system_prompt (the recipe's); "" for none
    extract: boxed           # boxed | final_answer | choice | raw
    scorer: math_verify      # math_verify | choice | exact | reward (the run's own reward function)
    protocol: {samples: 32, temperature: 0.6, top_p: 1.0, max_new_tokens: 8192, metrics: [avg@32, pass@32, maj@32]}
    cite: where the source, columns and protocol come from

A suite file holds ``name``, ``title``, ``suite: [benchmark, ...]`` and ``cite``, and may hold
``set``: settings its benchmarks take when this suite selects them, as a paper evaluates them
(``set: {all: {protocol: {...}, prompt: {...}}, mmlu_pro: {protocol: {...}}}``; ``all`` is every
benchmark of the suite, a name one of them; merged into the benchmark's file, mapping by mapping,
before the command line's overrides). A benchmark that two selected suites set differently is refused.

The command line selects and changes them (:func:`select`): ``benchmarks=math6`` (a suite or a
benchmark), ``benchmarks=[aime24,math500]``, ``benchmarks.aime24.source=PATH``,
``benchmarks.all.protocol.samples=4`` (every selected benchmark), ``benchmarks.source_dir=DIR``
(each benchmark reads ``DIR/NAME.jsonl``, e.g. the fixtures in ``tests/fixtures/benchmarks``),
``benchmarks.limit=N`` (the first N problems), ``benchmarks.backend=auto|hf|vllm``,
``benchmarks.cache_dir=DIR``. Every mistake is one :class:`ConfigError` line naming the key
and the fix, raised before any model or dataset is loaded.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mixrl.config.recipe_index import conf_dir
from mixrl.errors import ConfigError, did_you_mean

EXTRACTORS = ("boxed", "final_answer", "choice", "raw")
SCORERS = ("math_verify", "choice", "exact", "reward")
BACKENDS = ("auto", "hf", "vllm")
_KEYS = {"name", "title", "source", "subset", "split", "columns", "choices", "prompt", "extract", "scorer",
         "protocol", "cite", "notes"}
_SUITE_KEYS = {"name", "title", "suite", "cite", "notes", "set"}
_COLUMN_KEYS = {"problem", "answer", "id"}
_CHOICE_KEYS = {"column", "labels", "columns", "correct", "shuffle_seed"}
_PROMPT_KEYS = {"template", "system_prompt"}
_PROTOCOL_KEYS = {"samples", "temperature", "top_p", "max_new_tokens", "metrics"}
_GLOBAL_KEYS = {"source_dir", "limit", "backend", "cache_dir", "seed"}
_METRIC = re.compile(r"(avg|pass|maj)@(\d+)")


@dataclass
class Protocol:
    samples: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int | None = None  # None: the run's trainer.max_completion_length
    metrics: list[str] = field(default_factory=lambda: ["avg@1"])

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Benchmark:
    name: str
    title: str
    source: str
    split: str = "test"
    subset: str | None = None
    columns: dict[str, str] = field(default_factory=lambda: {"problem": "problem", "answer": "answer"})
    choices: dict[str, Any] | None = None
    template: str = "{problem}"
    system_prompt: str | None = None
    extract: str = "boxed"
    scorer: str = "math_verify"
    protocol: Protocol = field(default_factory=Protocol)
    cite: str = ""
    notes: str = ""

    @property
    def builtin(self) -> bool:
        return self.source.startswith("builtin:")

    def key_payload(self) -> dict:
        """What a benchmark's samples depend on (the cache key's benchmark part)."""
        return {"source": self.source, "subset": self.subset, "split": self.split, "columns": self.columns,
                "choices": self.choices, "template": self.template, "system_prompt": self.system_prompt,
                "protocol": [self.protocol.samples, self.protocol.temperature, self.protocol.top_p,
                             self.protocol.max_new_tokens]}


@dataclass
class Selection:
    """The benchmarks a command evaluates, with the command line's global settings."""

    name: str  # the suite's (or the single benchmark's) name, as typed
    benchmarks: list[Benchmark]
    limit: int | None = None
    backend: str = "auto"
    cache_dir: str | None = None
    seed: int = 0


def benchmarks_dir() -> Path:
    return conf_dir() / "benchmarks"


def names() -> list[str]:
    """Every shipped benchmark and suite name."""
    return sorted(p.stem for p in benchmarks_dir().glob("*.yaml"))


def _read(name: str) -> dict:
    p = benchmarks_dir() / f"{name}.yaml"
    if not p.is_file():
        raise ConfigError(f"unknown benchmark or suite '{name}'{did_you_mean(name, names())}; "
                          f"choose from {', '.join(names())} (conf/benchmarks/)")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{p} is not valid YAML ({str(e).splitlines()[0]}); fix the file") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must hold a mapping (name, source, ...); fix the file")
    return data


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def parse_metric(metric: str, where: str) -> tuple[str, int]:
    m = _METRIC.fullmatch(str(metric))
    _need(m is not None and int(m.group(2)) >= 1,
          f"{where}: metric {metric!r} is not avg@k, pass@k or maj@k with k >= 1; fix the metrics list")
    return m.group(1), int(m.group(2))


def build(data: dict, where: str) -> Benchmark:
    """A validated :class:`Benchmark` from a mapping (a file's, with overrides applied)."""
    unknown = set(data) - _KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key '{sorted(unknown)[0]}'{did_you_mean(sorted(unknown)[0], _KEYS)}; "
                          f"a benchmark takes {', '.join(sorted(_KEYS))}")
    for key in ("name", "title", "source", "split"):
        _need(isinstance(data.get(key), str) and data[key].strip() != "",
              f"{where}.{key} must be a non-empty string; set it in conf/benchmarks/ or with {where}.{key}=...")
    _need(data.get("subset") is None or isinstance(data["subset"], str), f"{where}.subset must be a string or null")
    columns = data.get("columns") or {"problem": "problem", "answer": "answer"}
    _need(isinstance(columns, dict) and {"problem", "answer"} <= set(columns) and set(columns) <= _COLUMN_KEYS
          and all(isinstance(v, str) and v for v in columns.values()),
          f"{where}.columns must map problem and answer (and optionally id) to column names, got {columns!r}")
    choices = data.get("choices")
    if choices is not None:
        _need(isinstance(choices, dict) and set(choices) <= _CHOICE_KEYS,
              f"{where}.choices must be a mapping with keys from {', '.join(sorted(_CHOICE_KEYS))}, got {choices!r}")
        _need(("column" in choices) != ("columns" in choices),
              f"{where}.choices needs exactly one of column (a list of options) or columns (one option per column)")
        if "columns" in choices:
            _need(isinstance(choices["columns"], list) and len(choices["columns"]) >= 2,
                  f"{where}.choices.columns must list at least 2 columns")
            _need(isinstance(choices.get("correct", 0), int) and 0 <= choices.get("correct", 0) < len(choices["columns"]),
                  f"{where}.choices.correct must index choices.columns")
    prompt = data.get("prompt") or {}
    _need(isinstance(prompt, dict) and set(prompt) <= _PROMPT_KEYS,
          f"{where}.prompt takes template and system_prompt, got {prompt!r}")
    template = prompt.get("template", "{problem}")
    _need(isinstance(template, str) and "{problem}" in template,
          f"{where}.prompt.template must be a string containing {{problem}}, got {template!r}")
    _need(choices is not None or "{choices}" not in template,
          f"{where}.prompt.template uses {{choices}} but the benchmark has no choices; set {where}.choices")
    system = prompt.get("system_prompt")
    _need(system is None or isinstance(system, str), f"{where}.prompt.system_prompt must be a string or null")
    extract, scorer = data.get("extract", "boxed"), data.get("scorer", "math_verify")
    _need(extract in EXTRACTORS, f"{where}.extract={extract!r} is unknown{did_you_mean(str(extract), EXTRACTORS)}; "
                                 f"choose from {', '.join(EXTRACTORS)}")
    _need(scorer in SCORERS, f"{where}.scorer={scorer!r} is unknown{did_you_mean(str(scorer), SCORERS)}; "
                             f"choose from {', '.join(SCORERS)}")
    _need(scorer != "choice" or choices is not None, f"{where}.scorer=choice needs {where}.choices")
    proto = data.get("protocol") or {}
    _need(isinstance(proto, dict) and set(proto) <= _PROTOCOL_KEYS,
          f"{where}.protocol takes {', '.join(sorted(_PROTOCOL_KEYS))}, got {proto!r}")
    samples, temperature = proto.get("samples", 1), proto.get("temperature", 0.0)
    top_p, max_new = proto.get("top_p", 1.0), proto.get("max_new_tokens")
    _need(isinstance(samples, int) and not isinstance(samples, bool) and samples >= 1,
          f"{where}.protocol.samples={samples!r} is out of range: needs an integer >= 1")
    _need(isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and 0 <= temperature <= 10,
          f"{where}.protocol.temperature={temperature!r} is out of range: needs 0 (greedy) <= temperature <= 10")
    _need(isinstance(top_p, (int, float)) and not isinstance(top_p, bool) and 0 < top_p <= 1,
          f"{where}.protocol.top_p={top_p!r} is out of range: needs 0 < top_p <= 1")
    _need(max_new is None or (isinstance(max_new, int) and not isinstance(max_new, bool) and max_new >= 1),
          f"{where}.protocol.max_new_tokens={max_new!r} is out of range: needs an integer >= 1 (or null: trainer.max_completion_length)")
    _need(not (temperature == 0 and samples > 1),
          f"{where}.protocol: temperature 0 is greedy decoding, which gives the same sample every time; "
          f"set protocol.samples=1 or a temperature > 0")
    metrics = proto.get("metrics") or [f"avg@{samples}"]
    _need(isinstance(metrics, list) and metrics, f"{where}.protocol.metrics must be a list like [avg@{samples}, pass@{samples}]")
    for m in metrics:
        _, k = parse_metric(m, f"{where}.protocol")
        _need(k <= samples, f"{where}.protocol: metric {m} needs k <= samples ({samples}); "
                            f"raise {where}.protocol.samples or lower k")
    return Benchmark(
        name=data["name"], title=data["title"], source=data["source"], split=data["split"], subset=data.get("subset"),
        columns=dict(columns), choices=dict(choices) if choices else None, template=template, system_prompt=system,
        extract=extract, scorer=scorer,
        protocol=Protocol(int(samples), float(temperature), float(top_p), max_new, [str(m) for m in metrics]),
        cite=str(data.get("cite") or ""), notes=str(data.get("notes") or ""),
    )


def _merge(base: dict, extra: dict) -> dict:
    """``base`` with ``extra`` merged in, mapping by mapping (lists and scalars replace)."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _suite_settings(name: str, data: dict) -> dict[str, dict]:
    """A suite's ``set``, validated, as the settings each of its benchmarks takes (``all`` merged first)."""
    members = [str(b) for b in data["suite"]]
    raw = data.get("set") or {}
    where = f"conf/benchmarks/{name}.yaml: set"
    _need(isinstance(raw, dict), f"{where} must map all or a benchmark of the suite to its settings; fix the file")
    for key, value in raw.items():
        _need(key == "all" or key in members, f"{where}.{key} is not a benchmark of the suite{did_you_mean(str(key), members)}; "
                                              f"use all or one of {', '.join(members)}")
        _need(isinstance(value, dict) and set(value) <= _KEYS - {"name"},
              f"{where}.{key} must be a mapping with keys from {', '.join(sorted(_KEYS - {'name'}))}; fix the file")
    return {m: _merge(raw.get("all") or {}, raw.get(m) or {}) for m in members}


def _value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _set(data: dict, dotted: list[str], value: Any, where: str) -> None:
    node = data
    for part in dotted[:-1]:
        if node.get(part) is None:
            node[part] = {}
        _need(isinstance(node[part], dict), f"{where}: '{part}' is not a mapping; fix the override")
        node = node[part]
    node[dotted[-1]] = value


def is_benchmark_override(override: str) -> bool:
    key = override.split("=", 1)[0].lstrip("+~")
    return key == "benchmarks" or key.startswith("benchmarks.")


def _split_overrides(overrides: list[str]) -> tuple[list[str] | None, dict[str, list[tuple[list[str], Any, str]]], dict[str, Any]]:
    """``(chosen, per, glob)`` of the ``benchmarks...`` overrides: the names ``benchmarks=`` selects (None
    without it), ``{benchmark or "all": [(dotted key, value, override key)]}`` and the global keys."""
    chosen: list[str] | None = None
    per: dict[str, list[tuple[list[str], Any, str]]] = {}
    glob: dict[str, Any] = {}
    for ov in overrides:
        _need("=" in ov, f"'{ov}' is not key=value; write benchmarks=math6 or benchmarks.NAME.KEY=VALUE")
        key, raw = ov.split("=", 1)
        key = key.lstrip("+")
        value = _value(raw)
        if key == "benchmarks":
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            _need(isinstance(value, list) and value and all(isinstance(v, str) for v in value),
                  f"benchmarks={raw!r} must name a suite or benchmarks (benchmarks=math6, benchmarks=[aime24,math500])")
            chosen = value
            continue
        parts = key.split(".")[1:]
        if len(parts) == 1:
            _need(parts[0] in _GLOBAL_KEYS, f"unknown key '{key}'{did_you_mean(parts[0], _GLOBAL_KEYS)}; "
                                            f"benchmarks takes {', '.join(sorted(_GLOBAL_KEYS))} or NAME.KEY")
            glob[parts[0]] = value
            continue
        per.setdefault(parts[0], []).append((parts[1:], value, key))
    return chosen, per, glob


def select(overrides: list[str]) -> Selection:
    """The benchmarks the ``benchmarks=...`` overrides name, each validated with its overrides applied."""
    chosen, per, glob = _split_overrides(overrides)
    _need(chosen is not None, "benchmark overrides given without benchmarks=SUITE; add e.g. benchmarks=math6 "
                              f"(choose from {', '.join(names())})")
    order: list[str] = []
    settings: dict[str, tuple[str, dict]] = {}  # benchmark: (the suite or name that selected it, its settings)
    for name in chosen:
        data = _read(name)
        if "suite" in data:
            unknown = set(data) - _SUITE_KEYS
            if unknown:
                raise ConfigError(f"conf/benchmarks/{name}.yaml: unknown key '{sorted(unknown)[0]}'; a suite takes "
                                  f"{', '.join(sorted(_SUITE_KEYS))}")
            _need(isinstance(data["suite"], list) and data["suite"], f"conf/benchmarks/{name}.yaml: suite must list benchmarks")
            got = _suite_settings(name, data)
        else:
            got = {name: {}}
        for bench, sets in got.items():
            if bench in settings:
                _need(settings[bench][1] == sets, f"benchmarks={','.join(chosen)}: {bench} is in {settings[bench][0]} and {name} "
                                                  "under different protocols; select one of them")
            else:
                settings[bench] = (name, sets)
            order.append(bench)
    order = list(dict.fromkeys(order))
    for name in per:
        _need(name == "all" or name in order,
              f"benchmarks.{name}.* names a benchmark that is not selected{did_you_mean(name, order)}; "
              f"selected: {', '.join(order)}")
    source_dir = glob.get("source_dir")
    out = []
    for name in order:
        data = copy.deepcopy(_read(name))
        _need("suite" not in data, f"suite '{name}' inside a suite: list its benchmarks instead")
        data = _merge(data, settings[name][1])
        _need(data.get("name") == name, f"conf/benchmarks/{name}.yaml: name must be '{name}' (the file's name)")
        if source_dir is not None and not str(data.get("source", "")).startswith("builtin:"):
            p = Path(str(source_dir)).expanduser() / f"{name}.jsonl"
            _need(p.is_file(), f"benchmarks.source_dir={source_dir}: no {p.name} there; add it or drop source_dir")
            data["source"] = str(p)
        for dotted, value, key in per.get("all", []) + per.get(name, []):
            _need(dotted[0] in _KEYS, f"unknown key '{key}'{did_you_mean(dotted[0], _KEYS)}; "
                                      f"a benchmark takes {', '.join(sorted(_KEYS))}")
            if (dotted == ["protocol", "samples"] and isinstance(value, int) and value >= 1
                    and not any(d == ["protocol", "metrics"] for d, _, _ in per.get("all", []) + per.get(name, []))):
                # the file's metrics follow: k = all samples stays all samples, other k are capped at the new number
                proto = data.setdefault("protocol", {})
                old = proto.get("samples", 1)
                capped = [f"{kind}@{value if k == old else min(k, value)}"
                          for kind, k in (parse_metric(m, key) for m in proto.get("metrics") or [])]
                proto["metrics"] = list(dict.fromkeys(capped)) or None
            _set(data, dotted, value, key)
        out.append(build(data, f"benchmarks.{name}"))
    limit = glob.get("limit")
    _need(limit is None or (isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1),
          f"benchmarks.limit={limit!r} is out of range: needs an integer >= 1 (the first N problems)")
    backend = glob.get("backend", "auto")
    _need(backend in BACKENDS, f"benchmarks.backend={backend!r} is unknown; choose from {', '.join(BACKENDS)}")
    seed = glob.get("seed", 0)
    _need(isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0, f"benchmarks.seed={seed!r} must be an integer >= 0")
    return Selection(name=",".join(chosen), benchmarks=out, limit=limit, backend=backend,
                     cache_dir=str(glob["cache_dir"]) if glob.get("cache_dir") else None, seed=int(seed))


def check_all() -> list[str]:
    """Validate every shipped file (tests); returns the names."""
    for name in names():
        select([f"benchmarks={name}"])
    return names()
