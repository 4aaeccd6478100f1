"""The models mixrl builds locally (``builtin:NAME``), for a policy (``model.path``) or a teacher
(``teacher.source.models``): each is warm-started on first use and cached (:mod:`mixrl.models.tiny`,
:mod:`mixrl.models.tiny_bpe`), or, for the BPE models, installed from the weights shipped in the
package (:mod:`mixrl.models.shipped`)."""

from __future__ import annotations

from mixrl.models import tiny, tiny_bpe, tiny_bpe_tools

PREFIX = "builtin:"
#: name -> (what it is, for messages)
MODELS = {
    "builtin:tiny": "the character-level tiny model",
    "builtin:tiny-bpe": "the BPE chat model",
    "builtin:tiny-teacher": "the character-level teacher (expert solutions only, every level)",
    "builtin:tiny-bpe-teacher": "the BPE chat teacher (expert solutions only, every level)",
    "builtin:tiny-bpe-tools": "the BPE chat model with a tool-calling template (the tool task, arith_tools)",
}


def is_builtin(path: str) -> bool:
    return str(path).startswith(PREFIX)


def resolve(name: str, *, progress: bool = True, why: str | None = None) -> str:
    """The cached folder of built-in model ``name`` (installed from the package's shipped weights, or
    built, first if needed: :mod:`mixrl.models.shipped`); ValueError if unknown. ``why``: what needs it
    (``model.path``, the teacher), said in the note printed before a build."""
    if name not in MODELS:
        raise ValueError(f"unknown built-in model '{name}'; the built-in models are {', '.join(MODELS)}")
    why = why or ("the teacher (teacher=tiny)" if name.endswith("-teacher") else f"model.path={name}")
    if name == "builtin:tiny":
        return str(tiny.warm_start(progress=progress, why=why))
    if name == "builtin:tiny-teacher":
        return str(tiny.teacher_warm_start(progress=progress, why=why))
    if name == "builtin:tiny-bpe":
        return str(tiny_bpe.warm_start(progress=progress, why=why))
    if name == "builtin:tiny-bpe-teacher":
        return str(tiny_bpe.teacher_warm_start(progress=progress, why=why))
    return str(tiny_bpe_tools.warm_start(progress=progress, why=why))


def teacher_for(student: str) -> str:
    """The built-in teacher of ``student``'s family (``teacher=tiny``): ``builtin:tiny-bpe-teacher``
    for the BPE chat model (``builtin:tiny-bpe`` or a folder it wrote), ``builtin:tiny-teacher``
    otherwise (the character model; another model's tokenizer is then refused, naming the fix)."""
    return "builtin:tiny-bpe-teacher" if tiny_bpe.is_tiny_bpe(str(student)) else "builtin:tiny-teacher"
