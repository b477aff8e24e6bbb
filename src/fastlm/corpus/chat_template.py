"""A tokenizer's chat template: whether there is one, the one call that renders a chat with it (on a fixed
date, with the template variables of ``split.chat_template_kwargs``), and which variables it never reads.
``prompts`` renders chats with it, ``chat_spans`` finds the earlier answers in those renders."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

__all__ = [
    "CHAT_DATE",
    "RESPONSE_ROLE",
    "apply_template",
    "has_chat_template",
    "unread_variables",
    "unwritten_roles",
]

# The role of a chat's answers: the last message of a training chat, and the earlier ones trained too.
RESPONSE_ROLE = "assistant"
# The date a chat template that dates its prompt is given (``date_string``): Llama-3.1/3.2/3.3's own default
# where no clock is given, instead of the day the template is rendered on.
CHAT_DATE = "26 Jul 2024"
# The roles chat templates write by convention; a chat's other roles are probed (``unwritten_roles``).
CONVENTIONAL_ROLES = ("system", "user", RESPONSE_ROLE, "tool")
_ROLE_PROBE = "fastlm role probe 7c1e"


def has_chat_template(tokenizer) -> bool:
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def unread_variables(tokenizer, variables: Mapping) -> list[str]:
    """The names of ``variables`` the tokenizer's chat template never mentions: given to it, they change
    nothing (a misspelled ``enable_thinking``, a variable of another model family's template)."""
    template = str(getattr(tokenizer, "chat_template", "") or "")
    return [name for name in variables if not re.search(rf"\b{re.escape(name)}\b", template)]


def apply_template(
    history: Sequence[Mapping],
    tokenizer,
    variables: Mapping | None,
    *,
    generation_prompt: bool,
    tools: Sequence[Mapping] | None = None,
) -> str:
    """``history`` rendered as text by the tokenizer's chat template (``generation_prompt``: ending with the
    answer's header), dated ``CHAT_DATE`` and given ``variables`` and the row's ``tools`` (function schemas,
    ``split.tools_column``; None: none)."""
    if tools:
        variables = {**dict(variables or {}), "tools": list(tools)}
    return tokenizer.apply_chat_template(
        list(history),
        tokenize=False,
        add_generation_prompt=generation_prompt,
        date_string=CHAT_DATE,
        **dict(variables or {}),
    )


def unwritten_roles(tokenizer, roles, variables: Mapping | None = None) -> list[str]:
    """The roles among ``roles`` (beyond system, user, assistant and tool) whose turns the tokenizer's chat
    template writes nowhere: a turn of the role, first or between two user turns, leaves no trace of its
    content in the render (Qwen3's template skips any role it does not know, so a ``human`` turn's question
    was left out of the prompt without a word). A render the template refuses (``raise_exception``) claims
    nothing: the chats' own renders say it."""
    unwritten = []
    for role in sorted({str(role) for role in roles} - set(CONVENTIONAL_ROLES)):
        probe = {"role": role, "content": _ROLE_PROBE}
        renders = []
        for history in ([probe, {"role": "user", "content": "a"}], [{"role": "user", "content": "a"}, probe]):
            try:
                renders.append(apply_template(history, tokenizer, variables, generation_prompt=True))
            except Exception:  # noqa: BLE001 - a template that refuses the probe: no claim
                renders.append(_ROLE_PROBE)
        if not any(_ROLE_PROBE in str(render) for render in renders):
            unwritten.append(role)
    return unwritten
