"""The tool calls in a generated answer, read as the chat template writes them.

A model trained on function-calling chats answers a chat with tools by text in its template's call format
(Qwen-style ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, Llama-3.x's bare ``{"name": ...,
"parameters": ...}``). ``CallReader.of`` learns that format from the template itself: it renders one probe
call (``rendered_turn``, as training rendered calls) and finds the call's JSON in it, the text the template
writes before and after that JSON (the call's opener and closer) and the key of the arguments.

* Text (``CallReader.text``): a generated answer decoded with the special tokens the template writes in a
  call kept (a tokenizer marking ``<tool_call>`` special, as Hermes-style models do, would otherwise lose
  the markup) and every other special token (EOS, end of turn, padding, Llama-3.1's ``<|python_tag|>``) left
  out, as the prediction of a chat without tools skips them.
* Calls (``CallReader.calls``): the answer's calls as ``[{name, arguments}]`` (``[]``: the answer calls
  nothing), None where its call markup holds no call that reads as JSON (an unclosed call cut by
  ``max_new_tokens``, broken JSON). They are read after the answer's leading ``<think>`` block (Qwen3's
  reasoning, where a call drafted is no call). A tokenizer that declares its own response parsing
  (transformers' ``response_template``, e.g. set by TRL's ``add_response_schema``) is read by it
  (``parse_response``), the model's own word on its format.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from fastlm.corpus.chat_template import RESPONSE_ROLE
from fastlm.corpus.tool_calls import rendered_turn, turn_end

__all__ = ["CallReader"]

_PROBE_NAME = "fastlm_probe_function"
_PROBE_ARGUMENTS = {"fastlm_probe_argument": "fastlm_probe_value"}
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": _PROBE_NAME,
        "description": "probe",
        "parameters": {"type": "object", "properties": {"fastlm_probe_argument": {"type": "string"}}},
    },
}
# A leading reasoning block (Qwen3's: empty in non-thinking mode, the model's reasoning in thinking mode):
# what comes before the answer, where a call drafted is no call.
_REASONING = re.compile(r"^<think>.*?</think>\s*", re.DOTALL)
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class CallReader:
    """A template's call format: ``opener`` / ``closer`` (the markup around a call's JSON, "" where the
    template writes none), ``arguments_key`` (the JSON key of the arguments), ``markup_ids`` (the special
    tokens the template writes in a call turn, kept in the text) and, where the tokenizer declares one,
    its own response parsing (``parses``)."""

    opener: str
    closer: str
    arguments_key: str
    markup_ids: frozenset
    special_ids: frozenset
    parses: bool = False
    turn_end: str = ""  # what the template writes after an answer: a declared response parsing reads it

    @classmethod
    def of(cls, tokenizer, variables: dict | None = None) -> CallReader | None:
        """The call format of ``tokenizer``'s chat template (rendered with ``variables``, the training's
        template variables), None where its template writes no call as JSON (it does not render
        ``tool_calls``, or refuses them)."""
        history = [{"role": "user", "content": "probe"}]
        turn = {
            "role": RESPONSE_ROLE,
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": _PROBE_NAME, "arguments": _PROBE_ARGUMENTS}}
            ],
        }
        try:
            rendered = rendered_turn(history, turn, tokenizer, variables, [_PROBE_TOOL])
        except Exception:  # noqa: BLE001 - a template that refuses the probe call: no call format
            return None
        found = _probe_call(rendered[1]) if rendered is not None else None
        if found is None:
            return None
        start, end, arguments_key = found
        text = rendered[1]
        special = _special_ids(tokenizer)
        markup = frozenset(i for i in tokenizer(text, add_special_tokens=False)["input_ids"] if i in special)
        return cls(
            opener=_REASONING.sub("", text[:start]).strip(),
            closer=text[end:].strip(),
            arguments_key=arguments_key,
            markup_ids=markup,
            special_ids=special,
            parses=getattr(tokenizer, "response_template", None) is not None,
            turn_end=turn_end(history, tokenizer, variables, [_PROBE_TOOL]) or "",
        )

    def text(self, ids: Sequence[int], tokenizer) -> str:
        """Generated ``ids`` as text: the call markup's special tokens kept, any other left out."""
        kept = [int(i) for i in ids if int(i) not in self.special_ids or int(i) in self.markup_ids]
        return tokenizer.decode(kept, skip_special_tokens=False)

    def calls(
        self, ids: Sequence[int], tokenizer, *, prompt: Sequence[int] = (), ended: bool = True, tools=None
    ) -> list | None:
        """The calls in generated ``ids`` as ``[{name, arguments}]``; ``[]`` where they call nothing, None
        where their call markup does not read as calls. With a tokenizer that declares its response parsing,
        read by ``tokenizer.parse_response``: ``prompt`` the ids generated after, ``ended`` whether the answer
        ended (an end id, not ``max_new_tokens``: the template's end of turn is read after it), ``tools`` the
        row's."""
        if self.parses:
            text = tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)
            asked = tokenizer.decode([int(i) for i in prompt], skip_special_tokens=False)
            return _parsed_by_tokenizer(tokenizer, text + (self.turn_end if ended else ""), asked, tools)
        return self.calls_in(self.text(ids, tokenizer))

    def calls_in(self, text: str) -> list | None:
        """The calls in an answer's ``text`` (as ``text`` decodes it), as ``calls`` gives them."""
        body = _REASONING.sub("", text.strip(), count=1)
        if self.opener:
            return self._marked_calls(body)
        return self._bare_calls(body)

    def _marked_calls(self, body: str) -> list | None:
        """Each opener's call, read from after it to its JSON's end (an argument may hold the markup)."""
        calls, at = [], body.find(self.opener)
        while at >= 0:
            start = at + len(self.opener)
            start += len(body[start:]) - len(body[start:].lstrip())
            try:
                value, end = _DECODER.raw_decode(body, start)
            except ValueError:
                return None
            call, rest = self._call(value), body[end:].lstrip()
            if call is None or not rest.startswith(self.closer):
                return None
            calls.append(call)
            at = body.find(self.opener, len(body) - len(rest) + len(self.closer))
        return calls

    def _bare_calls(self, body: str) -> list | None:
        """Calls written as JSON objects alone (Llama-3.x), one after another (whitespace or ``;`` between):
        an answer that does not begin with one calls nothing."""
        if not body.startswith("{"):
            return []
        calls, position = [], 0
        while position < len(body):
            try:
                value, position = _DECODER.raw_decode(body, position)
            except ValueError:
                return None if calls or _looks_like_a_call(body) else []
            call = self._call(value)
            if call is None:
                return None if calls else []
            calls.append(call)
            while position < len(body) and (body[position].isspace() or body[position] == ";"):
                position += 1
        return calls

    def _call(self, value) -> dict | None:
        """A decoded call as ``{name, arguments}``, None where it is none (no name; arguments neither a
        mapping nor a JSON text of one)."""
        if not isinstance(value, dict):
            return None
        if isinstance(value.get("function"), dict):
            value = value["function"]
        name = value.get("name")
        arguments = value.get(self.arguments_key, value.get("arguments", value.get("parameters", {})))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(name, str) or not name or not isinstance(arguments, dict):
            return None
        return {"name": name, "arguments": arguments}


def _probe_call(text: str) -> tuple[int, int, str] | None:
    """(start, end, arguments key) of the probe call's JSON object in ``text``: the outermost object that
    holds the probe's name and arguments."""
    at = text.find(_PROBE_NAME)
    if at < 0:
        return None
    for start in (i for i in range(at) if text[i] == "{"):
        try:
            value, end = _DECODER.raw_decode(text, start)
        except ValueError:
            continue
        if end <= at or not isinstance(value, dict):
            continue
        function = value.get("function") if isinstance(value.get("function"), dict) else value
        for key, item in function.items():
            if key != "name" and _probe_arguments(item) and function.get("name") == _PROBE_NAME:
                return start, end, key
    return None


def _special_ids(tokenizer) -> frozenset:
    """The ids the tokenizer treats as special: its named special tokens and every added token marked special
    (Llama-3.1's ``<|python_tag|>``, which it names nowhere else), as ``skip_special_tokens`` skips them."""
    named = {int(i) for i in getattr(tokenizer, "all_special_ids", None) or []}
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return frozenset(named | {int(i) for i, token in added.items() if getattr(token, "special", False)})


def _probe_arguments(value) -> bool:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return False
    return value == _PROBE_ARGUMENTS


def _looks_like_a_call(body: str) -> bool:
    """Whether a bare answer that does not read as JSON began a call (a ``"name"`` key in its first line)."""
    return '"name"' in body.split("\n", 1)[0]


def _parsed_by_tokenizer(tokenizer, text: str, prompt: str, tools: list | None) -> list | None:
    """The calls ``tokenizer.parse_response`` reads in ``text`` (every special token kept, as its response
    template expects) after ``prompt``, as ``CallReader.calls`` gives them."""
    try:
        message = tokenizer.parse_response(text, prefix=prompt, tools=tools)
    except Exception:  # noqa: BLE001 - a response the tokenizer's own parsing cannot read
        return None
    calls = []
    for call in (message or {}).get("tool_calls") or []:
        function = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return None
        arguments = function.get("arguments") or {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        calls.append({"name": function["name"], "arguments": arguments})
    return calls
