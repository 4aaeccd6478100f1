"""The text of a completion and the answer after a marker (``exact``); math answers are
parsed by ``math-verify`` (:class:`mixrl.rewards.builtin.MathVerifier`).

Everything here is total: weird input (``None``, numbers, nested lists, broken LaTeX)
gives ``""`` or ``None``, never an exception.
"""

from __future__ import annotations

from typing import Any

__all__ = ["completion_text", "extract_after_marker"]


def _content_text(content: Any) -> str:
    """Text of a message ``content``: a string, or a list of parts like ``{"type": "text", "text": ...}``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                text = part.get("text", part.get("content"))
                if isinstance(text, str):
                    parts.append(text)
        return "".join(parts)
    return str(content)


def completion_text(completion: Any) -> str:
    """The text of one TRL completion: a string, or a chat list ``[{"role": "assistant", "content": ...}]``.

    For a chat list, the assistant messages' contents are joined (normally there is exactly one);
    with no assistant message, the last message's content is used.
    """
    try:
        if completion is None:
            return ""
        if isinstance(completion, str):
            return completion
        if isinstance(completion, dict):
            return _content_text(completion.get("content"))
        if isinstance(completion, (list, tuple)):
            messages = [m for m in completion if isinstance(m, dict)]
            if not messages:
                return "".join(x for x in completion if isinstance(x, str))
            assistant = [m for m in messages if m.get("role") == "assistant"]
            chosen = assistant or messages[-1:]
            return "\n".join(_content_text(m.get("content")) for m in chosen)
        return str(completion)
    except Exception:  # noqa: BLE001 - a reward must never fail on model output
        return ""


def extract_after_marker(text: str, marker: str = "####") -> str | None:
    """The first non-empty line after the last ``marker`` (GSM8K's ``#### 72``), or ``None``."""
    if not marker or not isinstance(text, str):
        return None
    idx = text.rfind(marker)
    if idx < 0:
        return None
    rest = text[idx + len(marker) :]
    for line in rest.splitlines():
        if line.strip():
            return line.strip()
    return ""
