"""Expert rows inside TRL's tool loop (``env=tools`` with an injection that fills group slots).

An injection that replaces rollouts inside their groups (LUFFY's ``group_replace``, SFT's
``replace_all``) hands TRL a finished multi-turn trajectory: the expert's call, the tool's result
and the answer, as the chat template writes them. TRL's tool loop would parse the first call of
that text and run it again, appending a second result and generating after the trajectory's end.
:func:`finished_trajectories` keeps those rows out of the loop (the trainer's ``_tool_call_loop``
hook calls it first): the tool has already answered in them. Their completion, for the reward functions, is the trajectory's text as one assistant
message (the answer after ``####`` is read from its end), and their tool turn is marked
provenance ``environment`` from the template's turn marks
(:func:`mixrl.trainer.parts.batch_fields.provenance_fields`), so no loss trains it.
"""

from __future__ import annotations

from mixrl.core import provenance as prov


def written_rows(row_source: list[int] | None, n: int) -> list[int]:
    """Indices of the ``n`` rows no policy sampled this turn (an injection wrote them)."""
    if row_source is None or len(row_source) != n:
        return []
    return [i for i, s in enumerate(row_source) if int(s) != prov.ON_POLICY]


def finished_trajectories(completions: list, completion_ids: list, row_source: list[int] | None, decode) -> list[int]:
    """Rewrites, in place, each row an injection wrote as one finished assistant message (its
    decoded text), so TRL's tool loop finds no call to run in it; returns those rows' indices."""
    written = written_rows(row_source, len(completions))
    for i in written:  # no tool call to run: the trajectory holds its result already
        completions[i] = [{"role": "assistant", "content": decode(completion_ids[i])}]
    return written
