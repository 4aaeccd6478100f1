"""Pull the final answer out of a completion.

Everything here is total: weird input (``None``, numbers, nested lists, broken LaTeX)
gives ``""`` or ``None``, never an exception.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["completion_text", "extract_after_marker", "extract_boxed", "extract_last_number"]


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


_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\b")


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (nested braces allowed; also ``\\boxed 5`` and ``\\fbox``)."""
    if not isinstance(text, str):
        return None
    matches = list(_BOXED_RE.finditer(text))
    for m in reversed(matches):
        i = m.end()
        n = len(text)
        while i < n and text[i] == " ":
            i += 1
        if i < n and text[i] == "{":
            depth = 0
            for j in range(i, n):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j].strip()
            continue  # unbalanced: try an earlier one
        # \boxed 5 -- the token up to whitespace or '$'
        token = re.match(r"[^\s$]+", text[i:])
        if token and i > m.end():
            return token.group(0)
    return None


_NUMBER_RE = re.compile(
    r"[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?|\.\d+)"
)


def extract_last_number(text: str) -> str | None:
    """The last number in ``text`` (``1,234.5``, ``-3``, ``3/4``, ``.5``), or ``None``."""
    if not isinstance(text, str):
        return None
    found = _NUMBER_RE.findall(text)
    if not found:
        return None
    return found[-1].replace(" ", "")
