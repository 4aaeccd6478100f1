"""One cell of a data row in the standard columns' form: a prompt as text or chat messages, the
gold answer as a string, the expert completions as a list of strings.

:func:`mixrl.data.loading.standardize_rows` maps every row through these; a cell of an unusable
type raises :class:`_RowError`, which the loader re-raises as a one-line ``DataError`` naming
the row and the column.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["to_chat_prompt", "answer_to_str", "expert_completions"]


class _RowError(ValueError):
    """A cell of an unusable type; re-raised as DataError naming the row."""


def _a(word: str) -> str:
    """``word`` with its indefinite article (``an int``, ``a float``)."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def _message_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):  # multimodal parts: keep the text ones
        return "".join(
            p if isinstance(p, str) else str(p.get("text") or "")
            for p in content
            if isinstance(p, (str, dict))
        )
    return str(content)


def _is_message(x: Any) -> bool:
    return isinstance(x, dict) and "content" in x


def _is_message_list(x: Any) -> bool:
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(_is_message(m) for m in x)


def _prompt_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "" if isinstance(value, float) and math.isnan(value) else str(value)
    raise _RowError(f"holds {_a(type(value).__name__)}, expected a string or a list of chat messages")


def to_chat_prompt(value: Any, system_prompt: str | None = None) -> list[dict[str, str]]:
    """A prompt as chat messages ``[{"role", "content"}]``: a string becomes one user message; a message list
    keeps its messages up to the last non-assistant one (a ``messages`` column that includes the answer
    becomes a prompt). ``system_prompt`` replaces an existing system message, or is put first."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return []
    if isinstance(value, dict):
        value = [value]
    if isinstance(value, (list, tuple)):
        if not all(_is_message(m) for m in value):
            raise _RowError("is a list but not of chat messages ({'role': ..., 'content': ...})")
        messages = [{"role": str(m.get("role") or "user"), "content": _message_text(m.get("content"))} for m in value]
        while messages and messages[-1]["role"] == "assistant":
            messages.pop()
    else:
        messages = [{"role": "user", "content": _prompt_text(value)}]
    if not messages:
        return []
    if system_prompt:
        if messages[0]["role"] == "system":
            messages[0] = {"role": "system", "content": system_prompt}
        else:
            messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def answer_to_str(value: Any) -> str:
    """The gold answer as a string: numbers cast (``72.0`` -> ``"72"``), lists joined with ``", "``, null -> ``""``."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return str(int(value)) if value.is_integer() and abs(value) < 1e16 else repr(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(answer_to_str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return str(value)


def _conversation_reply(messages: list[Any]) -> str | None:
    """The last assistant message's content of one conversation (a message without a role counts as one)."""
    replies = [m for m in messages if _is_message(m) and (m.get("role") in (None, "assistant"))]
    if not replies:
        return None
    return _message_text(replies[-1].get("content"))


def _is_record_list(x: Any) -> bool:
    """A list of completion records: dicts with ``content`` and no ``role`` (AMPO's ``target_lst``:
    ``{content, source, quality_score}`` per teacher answer), not one conversation."""
    return _is_message_list(x) and not any("role" in m for m in x)


def expert_completions(value: Any) -> list[str]:
    """Expert completions from one cell: a string, a list of strings, a chat message list (its assistant
    reply), a list of chat lists (one reply each), or a list of records ``{"content": ...}`` without a
    ``role`` (each record's content, in order). Empty / null -> ``[]``."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value.strip() else []
    if isinstance(value, float) and math.isnan(value):
        return []
    if _is_message(value):
        text = _conversation_reply([value])
        return [text] if text and text.strip() else []
    if isinstance(value, (list, tuple)):
        if _is_record_list(value):
            return [t for t in (_message_text(m.get("content")) for m in value) if t.strip()]
        if _is_message_list(value):
            text = _conversation_reply(list(value))
            return [text] if text and text.strip() else []
        out: list[str] = []
        for item in value:
            if item is None:
                continue
            if isinstance(item, str):
                text = item
            elif _is_message_list(item):
                text = _conversation_reply(list(item)) or ""
            elif _is_message(item):
                text = _conversation_reply([item]) or ""
            else:
                raise _RowError(f"holds a list with {_a(type(item).__name__)}, expected strings or chat messages")
            if text.strip():
                out.append(text)
        return out
    raise _RowError(f"holds {_a(type(value).__name__)}, expected a string, a list of strings or chat messages")


def texts_of(value: Any) -> list[str]:
    """The strings of a cell: a string, chat messages' contents, or a list of either."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return texts_of(value.get("content"))
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in texts_of(v)]
    return [str(value)]
