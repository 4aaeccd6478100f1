"""The models mixrl builds locally (``builtin:NAME``), for a policy (``model.path``) or a teacher
(``teacher.source.models``): each is warm-started on first use and cached (:mod:`mixrl.models.tiny`,
:mod:`mixrl.models.tiny_bpe`)."""

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


def resolve(name: str, *, progress: bool = True) -> str:
    """The cached folder of built-in model ``name`` (built first if needed); ValueError if unknown."""
    if name == "builtin:tiny":
        return str(tiny.warm_start(progress=progress))
    if name == "builtin:tiny-teacher":
        return str(tiny.teacher_warm_start(progress=progress))
    if name == "builtin:tiny-bpe":
        return str(tiny_bpe.warm_start(progress=progress))
    if name == "builtin:tiny-bpe-teacher":
        return str(tiny_bpe.teacher_warm_start(progress=progress))
    if name == tiny_bpe_tools.BUILTIN:
        return str(tiny_bpe_tools.warm_start(progress=progress))
    raise ValueError(f"unknown built-in model '{name}'; the built-in models are {', '.join(MODELS)}")


def teacher_for(student: str) -> str:
    """The built-in teacher of ``student``'s family (``teacher=tiny``): ``builtin:tiny-bpe-teacher``
    for the BPE chat model (``builtin:tiny-bpe`` or a folder it wrote), ``builtin:tiny-teacher``
    otherwise (the character model; another model's tokenizer is then refused, naming the fix)."""
    return "builtin:tiny-bpe-teacher" if tiny_bpe.is_tiny_bpe(str(student)) else "builtin:tiny-teacher"
