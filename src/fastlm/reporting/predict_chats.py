"""How predict and the report render chat inputs as training rendered them: ``ChatFormat`` (with the
tokenizer's chat template and the template variables training gave it, or as ``role: content`` lines; the
system turn every training chat began with), read by ``chat_format`` from the model's record or the data's
fingerprint (a chat template changed since training is refused), and a messages column's rows read as their
turns up to the last ``user`` or ``tool`` turn (``chat_histories``: ``assistant`` turns after it are the
reference answer and are not given to the model) or the reason each is refused. A chat that calls tools (an
assistant turn of ``tool_calls``, ``tool`` turns with the results) is rendered with its row's tools (the
column the training's ``split.tools_column`` named, default ``tools``) as the split renders it; its
prediction is the text the model generates (a call as the template writes one), not parsed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fastlm.corpus.cleaning import classify_values
from fastlm.corpus.config import DEFAULT_PROMPT_TEMPLATE, SplitParams
from fastlm.corpus.fingerprint import data_format_params
from fastlm.corpus.prompts import render_messages
from fastlm.corpus.tool_calls import clean_tool_calls, has_tool_calls, turn_fields
from fastlm.errors import ConfigError, InputDataError, StaleDataError

__all__ = ["ChatFormat", "chat_format", "chat_histories", "chat_template_sha256", "with_system_prompt"]


@dataclass(frozen=True)
class ChatFormat:
    """How a row's messages become its prompt, as training rendered them (``render_messages``): with the
    tokenizer's chat template, the generation prompt and the template ``variables`` training gave it
    (``split.chat_template_kwargs``), or, when the training data was rendered without one, as
    ``role: content`` lines wrapped by ``prompt_template``."""

    chat_template: bool = True
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE
    variables: dict = field(default_factory=dict)
    user_turn: bool = False  # the inputs are texts, each one user turn (as the report asks a chat model)
    system_prompt: str | None = None  # the system turn every training chat began with
    tools_column: str | None = "tools"  # the column of each chat's tools (split.tools_column)

    def render(self, history: list[dict], tokenizer, tools: list | None = None) -> str:
        renderer = tokenizer if self.chat_template else None
        return render_messages(history, self.prompt_template, renderer, self.variables, tools)

    def turns(self, text: str) -> list[dict]:
        """A text asked as one user turn: after the training chats' system turn where they all had one."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": text}]


def with_system_prompt(data_format: dict, record: dict, source) -> dict:
    """``data_format`` with the ``source`` it was read from and, for chat data whose every chat began with one
    system turn, that turn's content (``system_prompt``, in the model's record or the data's fingerprint)."""
    found = {**data_format, "source": str(source)}
    if data_format.get("kind") == "messages" and record.get("system_prompt") is not None:
        found["system_prompt"] = record["system_prompt"]
    return found


def chat_template_sha256(tokenizer) -> str | None:
    """The digest of the tokenizer's chat template as the split's fingerprint records it
    (``chat_template_sha256``), None when it has none."""
    return data_format_params(SplitParams(messages_column="messages"), tokenizer)["chat_template_sha256"]


def chat_format(
    tokenizer,
    trained: dict | None,
    *,
    model: str,
    variables: dict | None = None,
    parameter: str = "predict.messages_column",
) -> ChatFormat:
    """The rendering of chat inputs for ``model``: as its training data was rendered when ``trained`` (the
    ``data_format`` of that data's fingerprint, with ``source``, the fingerprint's path) says so, its template
    variables (``chat_template_kwargs``) included, else with the model's own chat template and ``variables``
    (``predict.chat_template_kwargs``; None: none). Refused in one line when the tokenizer's template is not
    the one the data was rendered with, when there is none to render with, or when ``variables`` are given
    and are not the training's (a model learns the prompts its template rendered with them); ``parameter``
    names what asked for the chats in those lines."""
    current = chat_template_sha256(tokenizer)
    if trained is not None:
        expected = trained.get("chat_template_sha256")
        trained_variables = trained.get("chat_template_kwargs") or {}
        if variables is not None and _canonical(variables) != _canonical(trained_variables):
            used = (
                f"with {_canonical(trained_variables)}"
                if trained_variables
                else "without any"
                if expected is not None
                else "as role: content lines, without a chat template"
            )
            raise ConfigError(
                f"predict.chat_template_kwargs {_canonical(variables)} is not what the training data of "
                f"{model} was rendered with ({used}, in {trained['source']}): its prompts would not be the "
                "ones it learned.",
                fix="leave predict.chat_template_kwargs unset (null): predict renders chats with the "
                "training's variables.",
            )
        system = trained.get("system_prompt")
        tools_column = trained.get("tools_column", "tools")
        if expected is None:  # trained on "role: content" lines (no template, or split.chat_template false)
            return ChatFormat(
                chat_template=False,
                prompt_template=trained["prompt_template"],
                system_prompt=system,
                tools_column=tools_column,
            )
        if current != expected:
            now = f"sha256 {current[:12]}" if current else "none"
            raise StaleDataError(
                f"{parameter}: the chat template of {model} ({now}) is not the one its training "
                f"data was rendered with (sha256 {expected[:12]} in {trained['source']}).",
                fix="put the training's chat_template back into the model folder's tokenizer files, or "
                "re-run split and train with the new one.",
            )
        return ChatFormat(variables=dict(trained_variables), system_prompt=system, tools_column=tools_column)
    if current is None:
        raise InputDataError(
            f"{parameter}: the tokenizer of {model} has no chat template to render the messages with.",
            fix="use a model whose tokenizer has a chat_template (or one trained here on "
            "split.messages_column), or give the inputs as text (predict.text_column or "
            "predict.prompt_column).",
        )
    return ChatFormat(variables=dict(variables or {}))


def _canonical(variables: dict) -> str:
    """Template variables as one comparable text (``1`` and ``true`` differ, as they do to a template)."""
    return json.dumps(variables, sort_keys=True, ensure_ascii=False)


def chat_histories(values: pd.Series, templated: bool = True) -> tuple[list, pd.Series]:
    """Each row's turns up to its last ``user`` or ``tool`` turn (contents NFC + stripped, as training cleans
    them; tool fields kept) and its refusal reason (None when usable); ``templated`` False: chats are
    rendered as ``role: content`` lines, which cannot show tool calls, so a chat with some is refused."""
    histories, reasons = [], []
    for value in values:
        reason, history = _chat_history(value, templated)
        histories.append(history)
        reasons.append(reason)
    return histories, pd.Series(reasons, dtype=object)


def _chat_history(value, templated: bool) -> tuple[str | None, list | None]:
    if value is None or (isinstance(value, float) and value != value):
        return "missing", None
    if not isinstance(value, list | tuple | np.ndarray) or not all(
        isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in value
    ):
        return "malformed_messages (not a list of {role, content} turns)", None
    roles = [m["role"] for m in value]
    if "user" not in roles:
        return "malformed_messages (no user turn)", None
    last = max(index for index, role in enumerate(roles) if role in ("user", "tool"))
    if any(role != "assistant" for role in roles[last + 1 :]):  # only the reference answer may follow
        return "malformed_messages (a turn other than assistant after the last user or tool turn)", None
    turns = list(value[: last + 1])
    calls = [m for m in turns if has_tool_calls(m)]
    if any(clean_tool_calls(m["tool_calls"]) is None for m in calls):
        return (
            "malformed_messages (tool_calls that name no function, or two keys that are one once cleaned or "
            "written twice)",
            None,
        )
    if not templated and (calls or "tool" in roles[: last + 1]):
        return "tool_calls (no chat template renders tool calls)", None
    contents, reasons = classify_values(pd.Series([m.get("content") for m in turns], dtype=object))
    for index, message in enumerate(turns):  # a call's content may be missing or blank, as at the split
        if isinstance(reasons[index], str) and reasons[index] != "non_string" and has_tool_calls(message):
            contents[index], reasons[index] = "", None
    if reasons.notna().any():
        return str(reasons[reasons.notna()].iloc[0]), None
    return None, [
        {"role": m["role"], "content": text, **turn_fields(m)}
        for m, text in zip(turns, contents, strict=True)
    ]
