"""Chats given as ShareGPT turns, read as the role/content turns they stand for.

Many public chat corpora (ShareGPT, Hermes function-calling, sharegpt_deepl_ko, koVast) give each chat as a
list of ``{"from": speaker, "value": text}`` turns. ``role_content_chats`` reads every such turn as
``{"role": SHAREGPT_ROLES[speaker], "content": value}``, its other fields kept (a tool turn's ``name``, an
assistant turn's ``tool_calls``), so the split (cleaning, the split key, answer spans, rendering) and predict
read a ShareGPT chat exactly as the same chat given as role/content turns.

The speakers read are axolotl's default mapping (``chat_template`` strategy: ``human``/``user`` -> user,
``gpt``/``assistant`` -> assistant, ``system``, ``tool``). TRL's ``maybe_convert_to_chatml`` renames the keys
alone (``from`` -> ``role``, ``value`` -> ``content``) and hands ``human``/``gpt`` to the chat template as
they are; both read ``user``/``assistant``/``system``/``tool`` alike. Other speakers are refused, not
guessed: LLaMA-Factory's ``observation`` and ``function_call`` (a call as JSON text, which its own formatter
turns into the call markup: trained as text it would not be the call a template writes), Llama-3.1's
``ipython``, a raw dump's ``bing`` or ``chatgpt``. Each turn is read alone, as TRL converts each turn: a chat
may mix both forms, and a ``from`` turn may hold its text as ``content`` (TRL keeps it so). A turn giving both
``from`` and ``role``, or both ``value`` and ``content``, is refused (a null is no value: a Parquet struct
column fills the keys of the other form with nulls).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from fastlm.errors import InputDataError

__all__ = ["SHAREGPT_ROLES", "role_content_chats"]

# The role each ShareGPT speaker (a turn's ``from``) is read as: axolotl's default ``roles`` mapping.
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "tool": "tool",
}
_FIX = (
    "give each turn as {from, value} with from one of human, gpt, system, tool (a function's result: tool; "
    "a function call: an assistant turn of tool_calls, as role/content turns), or as {role, content}; or "
    "leave those rows out of the data."
)


def role_content_chats(values: pd.Series, parameter: str, place=None) -> tuple[pd.Series, int]:
    """``values`` with each chat of ShareGPT turns read as role/content turns (the module docstring), and the
    number of rows read so; ``values`` itself when none is (any other value is left for the cleaning to
    judge). A turn the mapping does not read refuses the data in one line naming ``parameter`` (the column
    and the file it was read from), the row and message (counted from 1, as a file's lines are; ``place``:
    what names a row where not ``row N``, a shard's) and the value."""
    read, count = [], 0
    place = place or (lambda number: f"row {number}")
    for row, value in enumerate(values, start=1):
        turns = _sharegpt_turns(value, place(row), parameter)
        count += turns is not None
        read.append(value if turns is None else turns)
    if not count:
        return values, 0
    return pd.Series(read, index=values.index, dtype=object, name=values.name), count


def _sharegpt_turns(value, row: str, parameter: str) -> list | None:
    """The role/content turns of a chat holding ShareGPT turns, None for any other value."""
    if not isinstance(value, list | tuple | np.ndarray) or not any(
        isinstance(turn, Mapping) and turn.get("from") is not None for turn in value
    ):
        return None
    return [_turn(turn, row, index, parameter) for index, turn in enumerate(value, start=1)]


def _turn(turn, row: str, index: int, parameter: str):
    """One turn as role/content: a ShareGPT turn read through ``SHAREGPT_ROLES``, any other as given."""
    if not isinstance(turn, Mapping) or turn.get("from") is None:
        return turn
    where = f"{parameter}: {row}, message {index}"
    for sharegpt, other in (("from", "role"), ("value", "content")):
        if turn.get(sharegpt) is not None and turn.get(other) is not None:
            raise InputDataError(
                f"{where} gives both {sharegpt} and {other}: a turn is either a ShareGPT turn "
                "({from, value}) or a role/content one.",
                fix=f"drop one of the two from that turn ({_FIX})",
            )
    speaker = turn["from"]
    if not isinstance(speaker, str) or speaker not in SHAREGPT_ROLES:
        shown = repr(speaker if not isinstance(speaker, str) or len(speaker) <= 40 else speaker[:40] + "…")
        raise InputDataError(
            f"{where}: the speaker {shown} (from) is none of those read as a role "
            f"({', '.join(f'{name} -> {role}' for name, role in SHAREGPT_ROLES.items())}).",
            fix=_FIX,
        )
    rest = {key: item for key, item in turn.items() if key not in ("from", "value", "role", "content")}
    text = turn.get("value") if turn.get("value") is not None else turn.get("content")  # TRL keeps content
    return {"role": SHAREGPT_ROLES[speaker], "content": text, **rest}
