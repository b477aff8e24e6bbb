"""Function-calling chats: a row's tool schemas (``split.tools_column``), an assistant turn's ``tool_calls``,
and the text a chat template writes for a turn that calls tools.

* Tools: a row's value is a list of JSON-schema function descriptions (``{type: function, function: {name,
  description, parameters}}``, or the function mapping alone), or a JSON string of one; a missing value or an
  empty list is none. They go to every render of that row's chat (``tools=``), as TRL's SFTTrainer gives
  them. A malformed value refuses the data in one line naming its row and the column (``parse_tools``).
* Calls: an assistant turn's ``tool_calls`` is a list of ``{function: {name, arguments}}`` (or ``{name,
  arguments}``), the arguments a mapping or a JSON text of one (OpenAI's wire form), read as that mapping:
  templates write a mapping as the JSON a model asked with tools writes, and a text as it is (Qwen3: an
  ASCII-escaped ``json.dumps`` text) or quoted again (Llama-3.x); its content may be empty. A chat whose
  calls are not so is malformed.
* Texts: every text inside the tools and a call (a schema's descriptions, a call's name, its arguments' keys
  and values, a JSON text's once read) is cleaned as a message's content is (``cleaning.normalize_text``:
  NFC, LF line ends, the invisible marks removed; not stripped, an argument's spaces being its own), keys
  kept in order, by the split and predict alike: decomposed Hangul or a zero-width space in an argument is
  not written to the prompt or a trained call beside contents that never hold one. Two keys of one mapping
  that are one once cleaned (``city`` and ``city`` + a zero-width space) are not merged, one value lost: a
  call holding them makes its chat malformed (the split's ``malformed_messages``, a refused row in
  predict), a tools value holding them is refused as a malformed one is. So is a JSON text (a call's
  arguments, a tools value) that writes one key twice in one object (``{"city": "서울", "city": "부산"}``),
  of which Python's ``json`` would keep the last value alone.
* Nulls: Arrow reads a column of mappings (Parquet, and the JSON Lines reader) as one struct type, every
  row's mapping holding every key any row has, null where it has none (a ``get_time`` call's arguments get
  the ``city: null`` of ``get_weather``'s). A null value in a mapping of the tools or of a call (its
  arguments given as a mapping) is so read as absent; a JSON text's nulls are kept.
* The rendered turn (``rendered_turn``): the template's render of the chat up to and with the turn (no
  generation prompt) less its render of the turns before it with the generation prompt, which must be a
  prefix of it; the template's end of turn after the turn (what it writes after a plain answer's content,
  e.g. ``<|im_end|>\\n``) is left out, as a plain answer's is, so that the tokenizer's EOS ends it as it
  ends any answer. Where the template writes a chat's last turn with more in front than the same turn once
  the chat goes on (a tool's result after it), the turn is as the chat going on writes it: Qwen3's template
  gives a last turn the empty think block ``<think>\\n\\n</think>\\n\\n`` alone, which a plain answer trains
  without (as predict asks: the generation prompt ends at the header), so a call trains so too, as the
  prompts of the chat's next rounds and its earlier calls write it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from fastlm.corpus.chat_template import RESPONSE_ROLE, apply_template
from fastlm.corpus.cleaning import normalize_text
from fastlm.corpus.readers import KeyWrittenTwice, unique_keys_object
from fastlm.errors import InputDataError

__all__ = [
    "TOOL_TURN_FIELDS",
    "call_names",
    "clean_tool_calls",
    "has_tool_calls",
    "parse_tools",
    "plain",
    "rendered_turn",
    "tools_key",
    "turn_end",
    "turn_fields",
]

# The fields of a turn kept besides role and content: an assistant turn's calls, a tool turn's name and the
# id of the call it answers (templates that number calls read it).
TOOL_TURN_FIELDS = ("tool_calls", "name", "tool_call_id")
# What a plain answer is rendered as to find the template's end of turn after an answer's content.
_TURN_MARK = "\U000f0002"


def plain(value):
    """``value`` as plain Python: a numpy array (a list read back from Parquet) as a list, a mapping as a
    dict, recursively."""
    if isinstance(value, np.ndarray):
        return [plain(item) for item in value.tolist()]
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    return value


def _without_nulls(value):
    """Plain ``value`` (``plain``'s) less the null values of its mappings, recursively (Arrow's struct
    columns fill a mapping with the keys of the others, null)."""
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    return value


class _KeyClash(ValueError):
    """Two keys of one mapping that are one once cleaned (their values would merge, one lost)."""

    def __init__(self, first: str, second: str) -> None:
        super().__init__(f"keys {ascii(first)} and {ascii(second)} are one once cleaned")
        self.keys = (first, second)


def _normalized(value):
    """Plain ``value`` (``plain``'s) with each text in it, a mapping's keys too, cleaned as a message's
    content is before it is stripped (``normalize_text``), recursively; the order of keys kept. Two keys of
    one mapping that clean to one (``city`` and ``city`` + a zero-width space, NFD and NFC) raise
    ``_KeyClash``: merged, one of their values would be lost."""
    if isinstance(value, str):
        return normalize_text(value)
    if isinstance(value, list):
        return [_normalized(item) for item in value]
    if isinstance(value, dict):
        cleaned, given = {}, {}
        for key, item in value.items():
            clean = normalize_text(key)
            if clean in cleaned:
                raise _KeyClash(given[clean], key)
            cleaned[clean], given[clean] = _normalized(item), key
        return cleaned
    return value


def _read_json(text: str):
    """``text`` read as JSON, a key an object writes twice raising ``KeyWrittenTwice`` (a ValueError too)."""
    return json.loads(text, object_pairs_hook=unique_keys_object)


def _arguments(value):
    """A call's arguments as a mapping (a JSON text read, its nulls kept; a mapping less its nulls), None
    where they are neither a mapping nor a JSON text of one, or their JSON text writes a key twice in one
    object (one value would be lost)."""
    if isinstance(value, str):
        try:
            value = _read_json(value) if value.strip() else {}
        except ValueError:
            return None
        return value if isinstance(value, dict) else None
    return _without_nulls(value) if isinstance(value, dict) else None


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))


def has_tool_calls(message: Mapping) -> bool:
    """Whether an assistant turn (a role/content mapping) holds tool calls (a non-empty ``tool_calls``)."""
    calls = message.get("tool_calls")
    if _missing(calls):
        return False
    return len(calls) > 0 if isinstance(calls, np.ndarray | list | tuple | Mapping | str) else True


def clean_tool_calls(calls) -> list[dict] | None:
    """``calls`` (a turn's ``tool_calls``) as plain Python, their null values left out, each call's
    arguments a mapping (a JSON text read), every text in them cleaned (``_normalized``: the name, the id,
    the arguments' keys and values), None where they are not a list of calls each naming its function
    (``{function: {name, arguments}}`` or ``{name, arguments}``, the arguments a mapping or a JSON text of
    one), or where two keys of a mapping in them are one once cleaned, or their JSON text writes a key twice
    in one object (one value would be lost)."""
    calls = plain(calls)
    if not isinstance(calls, list) or not calls:
        return None
    cleaned = []
    for call in calls:
        if not isinstance(call, dict):
            return None
        call = {key: value for key, value in call.items() if value is not None}
        nested = isinstance(call.get("function"), dict)
        function = {k: v for k, v in (call["function"] if nested else call).items() if v is not None}
        if not isinstance(function.get("name"), str) or not function["name"]:
            return None
        arguments = _arguments(function.get("arguments", {}))
        if arguments is None:
            return None
        function["arguments"] = arguments
        cleaned.append({**call, "function": function} if nested else function)
    try:
        return _normalized(cleaned)
    except _KeyClash:
        return None


def call_names(calls: Sequence[Mapping]) -> list[str]:
    """The function names of cleaned ``calls`` (``clean_tool_calls``'), in order."""
    return [call.get("function", call)["name"] for call in calls]


def turn_fields(message: Mapping) -> dict:
    """The tool fields (``TOOL_TURN_FIELDS``) a cleaned turn keeps: an assistant turn's cleaned calls, a tool
    turn's name and call id where they are texts (cleaned as the calls' are)."""
    kept = {}
    if message.get("role") == RESPONSE_ROLE and has_tool_calls(message):
        kept["tool_calls"] = clean_tool_calls(message["tool_calls"])
    elif message.get("role") == "tool":
        kept.update(
            {
                key: normalize_text(message[key])
                for key in ("name", "tool_call_id")
                if isinstance(message.get(key), str)
            }
        )
    return kept


def tools_key(tools: list | None) -> str:
    """``tools`` as one comparable text (keys sorted) for a row's split key; "" without tools."""
    return json.dumps(tools, sort_keys=True, ensure_ascii=False) if tools else ""


def parse_tools(values: pd.Series, parameter: str, place=None) -> list[list[dict] | None]:
    """Each row's tools (``values``: a tools column; ``parameter`` names it, e.g. ``split.tools_column
    ('tools')``) as a list of function schemas (their texts cleaned as a content is, ``_normalized``), None
    for a missing value or an empty list; a value that is no such list (nor a JSON string of one), a JSON
    string writing a key twice in one object, or a value holding a mapping with two keys that are one once
    cleaned, is refused in one line naming its row (counted from
    1; ``place``: what names a row where not ``row N``, a shard's)."""
    parsed = []
    place = place or (lambda number: f"row {number}")
    for row, value in enumerate(values, start=1):
        if isinstance(value, str):
            if not value.strip():
                parsed.append(None)
                continue
            try:
                value = _read_json(value)
            except KeyWrittenTwice as twice:
                _refuse(parameter, place(row), f"is a JSON text that {twice}: one value would be lost")
            except ValueError as error:
                _refuse(parameter, place(row), f"is a text that is not JSON ({error.msg})")
        if _missing(value):
            parsed.append(None)
            continue
        try:
            value = _normalized(_without_nulls(plain(value)))
        except _KeyClash as clash:
            _refuse(
                parameter,
                place(row),
                f"holds a mapping whose {clash} (NFC, invisible marks removed): one value would be lost",
            )
        if not isinstance(value, list):
            _refuse(parameter, place(row), f"is a {type(value).__name__}, not a list of function schemas")
        for index, tool in enumerate(value, start=1):
            function = tool.get("function", tool) if isinstance(tool, dict) else None
            if not isinstance(function, dict):
                _refuse(
                    parameter, place(row), f"tool {index} is a {type(tool).__name__}, not a function schema"
                )
            if not isinstance(function.get("name"), str) or not function["name"]:
                _refuse(parameter, place(row), f"tool {index} has no function name")
            if not isinstance(function.get("parameters", {}), dict):
                _refuse(
                    parameter, place(row), f"the parameters of tool {index} are not a JSON schema (a mapping)"
                )
        parsed.append(value or None)
    return parsed


def _refuse(parameter: str, row: str, why: str):
    raise InputDataError(
        f"{parameter}, {row}: the tools value {why}.",
        fix="give each row a list of function schemas ({type: function, function: {name, description, "
        "parameters}}) or a JSON string of one, or leave it empty for a row without tools.",
    )


def rendered_turn(
    history: Sequence[Mapping], turn: Mapping, tokenizer, variables: Mapping | None, tools: list | None
) -> tuple[str, str] | None:
    """(prompt, text) of ``turn`` after ``history``: ``prompt`` the render of ``history`` with the generation
    prompt, ``text`` what the render of the chat with ``turn`` (no generation prompt) writes after it, the
    template's end of turn left out; None where that render does not begin with ``prompt`` (the template
    writes the turns before it otherwise once it follows)."""
    prompt = apply_template(history, tokenizer, variables, generation_prompt=True, tools=tools)
    whole = apply_template([*history, turn], tokenizer, variables, generation_prompt=False, tools=tools)
    if not whole.startswith(prompt):
        return None
    text = whole[len(prompt) :]
    end = turn_end(history, tokenizer, variables, tools)
    eos = getattr(tokenizer, "eos_token", None)
    if end and text.endswith(end):
        text = text[: -len(end)]
    elif eos and eos in text:
        text = text[: text.index(eos)]
    going_on = _turn_going_on(history, turn, prompt, end or eos, (tokenizer, variables, tools))
    return prompt, going_on if going_on and text.endswith(going_on) else text


def _turn_going_on(history, turn, prompt: str, end: str | None, render) -> str | None:
    """``turn``'s text as the template writes it with a tool's result after it (the chat going on): what the
    render of that chat writes after ``prompt`` up to ``end`` (the end of turn), None where the render does
    not begin with ``prompt`` or holds no ``end``."""
    tokenizer, variables, tools = render
    follower = {"role": "tool", "content": _TURN_MARK}
    try:
        text = apply_template(
            [*history, turn, follower], tokenizer, variables, generation_prompt=False, tools=tools
        )
    except Exception:  # noqa: BLE001 - a template may refuse a tool turn there: the last turn's form then
        return None
    if not end or not text.startswith(prompt) or end not in text[len(prompt) :]:
        return None
    return text[len(prompt) : text.index(end, len(prompt))]


def turn_end(history, tokenizer, variables, tools) -> str | None:
    """What the template writes after a plain answer's content that ends the chat (its end of turn), None
    where it does not write the content as given."""
    marked = [*history, {"role": RESPONSE_ROLE, "content": _TURN_MARK}]
    try:
        text = apply_template(marked, tokenizer, variables, generation_prompt=False, tools=tools)
    except Exception:  # noqa: BLE001 - a template may refuse the mark: the EOS then
        return None
    return text[text.rindex(_TURN_MARK) + 1 :] if text.count(_TURN_MARK) == 1 else None
