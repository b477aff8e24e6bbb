"""Prompt/response data: rendering, cleaning and tokenization for completion-only training.

Data formats (``split`` parameters, conf/base/parameters_split.yml)
-------------------------------------------------------------------
* ``prompt_column`` + ``response_column`` (e.g. ``dialogue`` / ``summary``): the prompt text is wrapped by
  ``prompt_template`` (``{prompt}`` replaced by the text, e.g. ``"{prompt}\\n\\n### Response:\\n"``).
* ``messages_column``: a chat-style list of ``{"role": ..., "content": ...}`` per row whose last message is
  the ``assistant`` response (or of ShareGPT turns, ``{"from": "human" | "gpt" | ..., "value": ...}``, read
  as those, ``fastlm.corpus.sharegpt``). The earlier messages are rendered with the tokenizer's chat template
  (``add_generation_prompt=True``, and the template variables of ``split.chat_template_kwargs``, e.g.
  ``enable_thinking: false``) when it has one and ``split.chat_template`` is true; otherwise as
  ``"role: content"`` lines wrapped by ``prompt_template``. A row that is not such a list is dropped as
  ``malformed_messages``. With ``train_turns: all`` (the default) the earlier assistant answers inside the
  prompt are trained too, each with the end of turn after it when that is the tokenizer's EOS (Qwen3's
  ``<|im_end|>``, Llama-3's ``<|eot_id|>``), as TRL's ``assistant_only_loss`` trains every answer; user turns,
  the system turn and the template's own text stay inputs only. Where each answer is in the render is
  found by ``fastlm.corpus.chat_spans``.

Cleaning (NFC, strip, drop missing/non-string/empty rows, exact duplicates) and the hash split key on the
*raw cleaned pair* (prompt text and response, or every role and content), never on the rendered prompt: a
new template or another model's chat template keeps every row in its split, so runs stay comparable. Rows
that share a prompt (a dialogue with several reference summaries, a question with several answers, the
rows of one conversation flattened one a turn) split as one group, keyed on the prompt alone
(``SPLIT_GROUP``): no test row asks a prompt a train row trained on.

Contract of the outputs
-----------------------
``corpus_splits`` (data/03_primary/corpus_splits.parquet) has the columns

* ``prompt``: the prompt string exactly as it is tokenized for training, template included;
* ``response``: the reference response text (no EOS);
* ``answer_spans`` (chats with ``train_turns: all``): the earlier answers' ``start:end`` character ranges in
  ``prompt``, space-separated (empty: none, or not found where the template wrote them);
* ``split``: train / validation / test.

The tokenized Arrow splits have ``input_ids`` = prompt tokens + response tokens + EOS, ``length`` and
``prompt_length`` (the number of leading prompt tokens) and, for chats with earlier answers trained,
``answer_spans`` (their ``[start, end)`` token pairs inside the prompt). Prompt and response are tokenized
separately and the ids concatenated, so ``prompt_length`` is exact:

* prompt tokens = ``prompt_token_ids(tokenizer, prompt)``: ``tokenizer(prompt, add_special_tokens=False)``,
  with the tokenizer's BOS put in front when the tokenizer adds a BOS by default (Llama-style) and the
  rendered prompt does not already start with it (chat templates often write it themselves);
* response tokens = ``tokenizer(response, add_special_tokens=False)``, then one EOS.

Truncation at ``split.max_length`` (EOS included) keeps the EOS and always keeps part of the response: the
prompt is cut first, *from the left* (its start, after a leading BOS, which stays), down to at most half of
the budget ``max_length - 1``; only then is the response cut from the right. The training prompt is thus the
*last* ``prompt_length`` tokens of ``prompt_token_ids`` (plus the BOS when it had one); for generation, feed
``prompt_token_ids(tokenizer, prompt)`` cut the same way (``truncate_prompt_ids``). Loss covers only the
response tokens and the closing EOS (``fastlm.engine.data.labels``).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from fastlm.corpus.chat_spans import answer_spans, kept_answer_ranges, prompt_ids_and_answer_ranges
from fastlm.corpus.chat_template import RESPONSE_ROLE, apply_template, has_chat_template, unwritten_roles
from fastlm.corpus.cleaning import (
    DROP_REASONS,
    classify_values,
    clean_pairs,
    line_spaces_key,
    line_spaces_keys,
)
from fastlm.corpus.shards import shard_row
from fastlm.corpus.sharegpt import role_content_chats
from fastlm.corpus.tokenization import (
    TokenizedTexts,
    cut_long_texts,
    encode_ragged,
    fork_map,
    resolve_num_proc,
)
from fastlm.corpus.tokenizer_source import EOS_TOKEN
from fastlm.corpus.tool_calls import (
    call_names,
    clean_tool_calls,
    has_tool_calls,
    parse_tools,
    rendered_turn,
    tools_key,
    turn_fields,
)
from fastlm.errors import ConfigError, InputDataError

__all__ = [
    "SPLIT_GROUP",
    "SYSTEM_TURN",
    "chat_turns",
    "clean_messages",
    "common_system_prompt",
    "conversation_groups",
    "leading_bos",
    "prompt_frame",
    "prompt_token_ids",
    "quoted",
    "render_messages",
    "render_prompt",
    "shared_prompt_groups",
    "system_turns",
    "tokenize_pairs",
    "tokenizer_as_trained",
    "truncate_prompt_ids",
]

log = logging.getLogger(__name__)

# Never a tokenizer's own padding or truncation, nor its warning that a text longer than its
# model_max_length "will result in indexing errors": every caller truncates the ids itself.
UNPADDED = {"padding": False, "truncation": False, "verbose": False}
KEY_SEPARATOR = "\x00"
# The column of each row's group key: rows sharing a prompt (``shared_prompt_groups``; chats: one
# conversation, ``conversation_groups``) split as one, keyed on it; None for a row that shares its prompt with
# no other, keyed on its own ``split_key`` as ever. The split reads it and does not keep it.
SPLIT_GROUP = "split_group"
# The column of a chat's leading system turn (None: it begins otherwise) the split reads and does not keep.
SYSTEM_TURN = "system_turn"
# The key of prompt_frame's frame's ``attrs`` (and of the split report) recording the chats' tool use: the
# column their tools came from (None: the data has none), how many were given tools, how many call them.
TOOL_USE = "tool_use"


def prompt_frame(raw: pd.DataFrame, config, tokenizer=None) -> tuple[pd.DataFrame, dict[str, int]]:
    """Clean and render ``raw`` (``config``: the split parameters) into ``prompt``, ``response``,
    ``split_key`` (the raw cleaned pair the hash split keys on) and ``SPLIT_GROUP`` (the prompt it keys on
    instead where other rows share it), chats with their leading system turn (``SYSTEM_TURN``), with drop
    counts per reason; chats with tools or tool calls record their use of them in the frame's
    ``attrs[TOOL_USE]``."""
    if config.data_format == "messages":
        column = config.tools_column
        tools = None
        if column is not None and column in raw.columns:
            tools = parse_tools(raw[column], f"split.tools_column ({column!r})", shard_row(raw.attrs))
        chats, drops = clean_messages(chat_turns(raw, config), tools)
        if column is not None and tools is None:
            _say_tool_chats_without_tools(chats, column, len(chats))
        if not (config.chat_template and has_chat_template(tokenizer)):
            chats, drops["tool_calls"] = _without_tool_chats(chats)
        else:
            _refuse_unwritten_roles(chats["history"], config, tokenizer)
        contents = [
            [message.get("content") for message in history] + [final.get("content")]
            for history, final in zip(chats["history"], chats["final"], strict=True)
        ]
        _say_special_token_texts(contents, tokenizer, "chats")
        prompts, spans, responses = _render_chats(chats, config, tokenizer)
        kept = [prompt is not None for prompt in prompts]  # None: a final call not told apart from its prompt
        drops["tool_call_rewritten"] = len(kept) - sum(kept)
        chats = chats[np.asarray(kept, dtype=bool)].reset_index(drop=True)
        frame = pd.DataFrame(
            {
                "prompt": [prompt for prompt, keep in zip(prompts, kept, strict=True) if keep],
                "response": [text for text, keep in zip(responses, kept, strict=True) if keep],
            }
        )
        if spans is not None:
            frame["answer_spans"] = [value for value, keep in zip(spans, kept, strict=True) if keep]
        frame["split_key"] = chats["split_key"]
        groups = conversation_groups(chats["history"], chats["prefixes"])
        frame[SPLIT_GROUP] = pd.Series(groups, index=frame.index, dtype=object)
        # the split keeps its training chats' common one; object dtype: pandas 3 would store None as NaN
        frame[SYSTEM_TURN] = pd.Series(system_turns(chats["history"]), index=frame.index, dtype=object)
        _say_doubled_think_blocks(frame, config, tokenizer)
        calling = sum(map(_calls_tools, chats["history"], chats["final"]))
        if tools is not None or calling:  # the split report's record, which the report's summary says
            frame.attrs[TOOL_USE] = {
                "tools_column": column if tools is not None else None,
                "chats_with_tools": int(
                    sum(value is not None and len(value) > 0 for value in chats["tools"])
                ),
                "chats_calling_tools": int(calling),
            }
        return frame, drops
    pairs, drops = clean_pairs(raw[config.prompt_column], raw[config.response_column])
    _say_special_token_texts([[text] for text in pairs["prompt"]], tokenizer, "prompts")
    prompt_keys = line_spaces_keys(pairs["prompt"])
    frame = pd.DataFrame(
        {
            "prompt": [render_prompt(text, config.prompt_template) for text in pairs["prompt"]],
            "response": pairs["response"],
            # the prompt's key, then the response's, with nothing between them: pandas has always added
            # KEY_SEPARATOR (a NUL, which numpy reads as an empty text) to these object columns as nothing,
            # and every pair keeps the split this key gave it
            "split_key": prompt_keys + line_spaces_keys(pairs["response"]),
            SPLIT_GROUP: shared_prompt_groups(prompt_keys),
        }
    )
    return frame, drops


def shared_prompt_groups(prompt_keys: pd.Series) -> pd.Series:
    """Each pair's group key (``SPLIT_GROUP``; ``prompt_keys``: the pairs' prompts as the split key holds
    them, white space inside lines made single): its prompt's key where another pair shares that prompt
    (several reference summaries of one dialogue, several answers to one question), None where none does.

    The pairs of one prompt are keyed on the prompt alone, so they lie in one split (and one fold), the same
    whatever the row order and whichever of its responses the data holds; a pair with a prompt of its own
    keeps its own key, and so the split it always had."""
    shared = prompt_keys.duplicated(keep=False).to_numpy()
    keys = np.where(shared, prompt_keys.to_numpy(dtype=object), None)
    return pd.Series(keys, index=prompt_keys.index, dtype=object)


def conversation_groups(
    histories: Sequence[Sequence[Mapping]], prefixes: Sequence[Sequence[bytes]]
) -> list[str | None]:
    """Each chat's group key (``SPLIT_GROUP``; ``histories``: the cleaned turns before each chat's last
    answer, no two chats alike; ``prefixes``: their ``_prefix_digests``, as ``clean_messages`` gives them):
    the key of its conversation's shortest prompt where another chat's prompt begins with its prompt or its
    prompt with another's, None where no other chat's does.

    A chat's prompt holds every earlier turn, and its answers train with ``train_turns: all``: where one
    chat's prompt begins another's (a conversation given one row an answer, or one question answered
    twice), a row in test asks what a row in train trained on. Such chats (linked on, the smallest set
    closed under that relation) all begin with the shortest prompt among them, the key of its turns
    (``_turn_key``, as the split key writes them) is the group's: one split (and one fold) for the whole
    conversation, whatever the row order. Chats that only begin with the same user turn and are answered
    otherwise are not linked; a chat linked to none keeps its own key, and so the split it always had.
    Turns are compared as the split key compares them (white space inside lines made single), without
    the chats' tools."""
    histories, chains = list(histories), list(prefixes)
    owner: dict[bytes, int] = {}  # a whole prompt's digest: the first chat asking it
    for row, chain in enumerate(chains):
        if chain:
            owner.setdefault(chain[-1], row)
    parent = list(range(len(chains)))

    def root(row: int) -> int:
        while parent[row] != row:
            parent[row] = parent[parent[row]]
            row = parent[row]
        return row

    for row, chain in enumerate(chains):
        for digest in chain:  # every prompt that begins this one (itself among them)
            other = owner.get(digest)
            if other is not None and other != row:
                a, b = root(row), root(other)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    members: dict[int, list[int]] = {}
    for row in range(len(chains)):
        members.setdefault(root(row), []).append(row)
    groups: list[str | None] = [None] * len(chains)
    for rows in members.values():
        if len(rows) > 1:
            shortest = histories[min(rows, key=lambda row: len(chains[row]))]
            key = KEY_SEPARATOR.join(_turn_key(message) for message in shortest)
            for row in rows:
                groups[row] = key
    return groups


def special_token_texts(tokenizer) -> list[str]:
    """The texts of ``tokenizer``'s special tokens (its named ones and every added token marked special),
    longest first; the BPE the split trains (``tokenizer`` None): its EOS."""
    if tokenizer is None:
        return [EOS_TOKEN]
    texts = set(getattr(tokenizer, "all_special_tokens", None) or [])
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            texts.add(str(token.content))
    return sorted((text for text in texts if text), key=len, reverse=True)


def _say_special_token_texts(rows: list[list], tokenizer, what: str) -> None:
    """One warning where ``rows`` (each row's texts: a chat's message contents, a pair's prompt) write a
    special token's text: a template writes it into the prompt, where the tokenizer reads it as that token
    (as Hugging Face's apply_chat_template does), so that text is not what trains. A plain text and a
    pair's response are read as text (``tokenize_texts``, ``tokenize_pairs``) and are not said."""
    texts = special_token_texts(tokenizer)
    if not texts or not rows:
        return
    pattern = re.compile("|".join(map(re.escape, texts)))
    found = [
        next((hit.group(0) for text in row if isinstance(text, str) and (hit := pattern.search(text))), None)
        for row in rows
    ]
    hits = [token for token in found if token is not None]
    if hits:
        log.warning(
            "%d of %d %s write a special token's text (%s): the template writes it into the prompt, where "
            "the tokenizer reads it as that token, not as the characters the data holds. Remove or reword it "
            "in the data to train it as text.",
            len(hits),
            len(rows),
            what,
            ", ".join(repr(token) for token in dict.fromkeys(hits)),
        )


def _refuse_unwritten_roles(histories: pd.Series, config, tokenizer) -> None:
    """Chats with turns of a role the chat template writes nowhere (``unwritten_roles``) refused in one line:
    their text would be left out of every prompt without a word."""
    roles = {message["role"] for history in histories for message in history}
    unwritten = unwritten_roles(tokenizer, roles, config.chat_template_kwargs)
    if not unwritten:
        return
    role = unwritten[0]
    count = sum(any(message["role"] == role for message in history) for history in histories)
    raise InputDataError(
        f"split.messages_column ({config.messages_column!r}): {count} chats have turns of role "
        f"{quoted(role)}, which the chat template of {config.tokenizer.source} writes nowhere: their text "
        "would be left out of the prompts without a word"
        + (f" (also roles {', '.join(map(quoted, unwritten[1:]))})." if len(unwritten) > 1 else "."),
        fix="give those turns a role the template writes (system, user, assistant, tool), or the chats as "
        "ShareGPT {from, value} turns (human and gpt read as user and assistant), or use a tokenizer whose "
        "chat template writes that role (split.tokenizer.source).",
    )


def chat_turns(raw: pd.DataFrame, config) -> pd.Series:
    """The chats of ``split.messages_column``, each one given as ShareGPT turns read as role/content turns
    (``fastlm.corpus.sharegpt``: a speaker it does not read refuses the data in one line)."""
    column = config.messages_column
    chats, count = role_content_chats(
        raw[column], f"split.messages_column ({column!r})", shard_row(raw.attrs)
    )
    if count:
        log.info(
            "%d of %d chats of split.messages_column (%r) read from ShareGPT turns ({from, value}: human -> "
            "user, gpt -> assistant)",
            count,
            len(chats),
            column,
        )
    return chats


def _say_doubled_think_blocks(frame: pd.DataFrame, config, tokenizer) -> None:
    """One warning where answers hold their own ``<think>`` reasoning after the think block the template
    ends the prompt with (Qwen3 with ``enable_thinking: false``): they are trained with two think blocks in
    a row, which no render of the chat by the template writes. Chats no chat template rendered (``role:
    content`` lines, whose last turn may end with ``</think>``) are not said."""
    if frame.empty or not (config.chat_template and has_chat_template(tokenizer)):
        return
    prompts, responses = frame["prompt"].astype(str), frame["response"].astype(str)
    doubled = prompts.str.rstrip().str.endswith("</think>") & responses.str.startswith("<think>")
    if doubled.any():
        log.warning(
            "%d of %d chats answer with <think> reasoning after the think block the chat template ends the "
            "prompt with (split.chat_template_kwargs %s): they are trained with two think blocks in a row. "
            "Fix: leave enable_thinking unset to train the reasoning, or remove it from those answers",
            int(doubled.sum()),
            len(frame),
            dict(config.chat_template_kwargs),
        )


def system_turns(histories) -> list[str | None]:
    """The content of each chat's leading system turn, None for a chat that begins otherwise."""
    return [
        history[0]["content"] if len(history) and history[0]["role"] == "system" else None
        for history in histories
    ]


def common_system_prompt(turns) -> str | None:
    """The system turn (``system_turns``' contents) every chat of ``turns`` begins with, None where one has
    none or another, or there is no chat: predict and the report ask a chat model one user turn after it, as
    it was trained."""
    found = set(turns)
    return found.pop() if len(found) == 1 else None


def render_prompt(text: str, template: str) -> str:
    """``template`` with ``{prompt}`` replaced by ``text`` (no other braces are interpreted)."""
    return template.replace("{prompt}", text)


def render_messages(
    history: Sequence[Mapping],
    template: str,
    tokenizer=None,
    variables: Mapping | None = None,
    tools: Sequence[Mapping] | None = None,
) -> str:
    """The prompt of a chat: the tokenizer's chat template (with the generation prompt) when given one that
    has a template, else ``"role: content"`` lines wrapped by ``template``. A template that dates its prompt
    (Llama-3.1/3.2/3.3: "Today Date: ...") gets ``CHAT_DATE`` on every day, so the split, the report and
    predict render a chat alike whenever they run. ``variables`` (``split.chat_template_kwargs``, TRL's
    ``chat_template_kwargs``: ``{"enable_thinking": False}`` for Qwen3) go to the template too, and the row's
    ``tools`` (function schemas, ``split.tools_column``) as its ``tools``."""
    if has_chat_template(tokenizer):
        return apply_template(history, tokenizer, variables, generation_prompt=True, tools=tools)
    return render_prompt("\n".join(f"{m['role']}: {m['content']}" for m in history), template)


def _render_chats(chats: pd.DataFrame, config, tokenizer) -> tuple[list, list[str] | None, list]:
    """Each chat's prompt, with ``train_turns: all`` its ``answer_spans`` (an answer not found has none: it
    stays an input, said in one warning with the answers' and the chats' counts), and its response: the last
    answer's content, or for a last turn that calls tools the template's text for it (``rendered_turn``); a
    chat whose call is not told apart from its prompt has the prompt None (dropped, said in one warning), a
    template that does not write the call is refused. Rendered in a fork pool on large inputs
    (``split.num_proc``: a chat template renders in Python, one chat at a time)."""
    renderer = tokenizer if config.chat_template else None
    histories = list(chats["history"])
    rows = list(zip(histories, chats["tools"], chats["final"], strict=True))
    size = max(1, min(config.batch_size, 2_000))
    chunks = [rows[start : start + size] for start in range(0, len(rows), size)]
    shared = (renderer, config.prompt_template, config.chat_template_kwargs, config.train_turns == "all")
    rendered = [
        row
        for part in fork_map(_render_chunk, chunks, resolve_num_proc(config.num_proc, len(rows)), shared)
        for row in part
    ]
    _refuse_unwritten_calls(rendered, config)
    prompts = [prompt for prompt, _, _ in rendered]
    responses = [response for _, _, response in rendered]
    if prompts.count(None):
        log.warning(
            "%d of %d chats that end with a tool call are dropped (split report: "
            "dropped.tool_call_rewritten): the chat template writes the turns before the call otherwise "
            "once the call follows, so the "
            "call's text is not told apart from the prompt",
            prompts.count(None),
            sum(final.get("tool_calls") is not None for final in chats["final"]),
        )
    if config.train_turns != "all":
        return prompts, None, responses
    earlier = [sum(m["role"] == RESPONSE_ROLE for m in history) for history in histories]
    left_out = [
        count - len((spans or "").split())
        for count, (prompt, spans, _) in zip(earlier, rendered, strict=True)
        if prompt is not None
    ]
    if any(left_out):
        log.warning(
            "%d of %d earlier answers in %d of %d chats are rewritten by the chat template (written "
            "otherwise than the data gives them, e.g. their reasoning dropped, or a tool call not found "
            "whole where the template writes it) and train as inputs only; the chats' other answers train. "
            "split.train_turns: last trains every chat's last answer alone.",
            sum(left_out),
            sum(count for count, (prompt, _, _) in zip(earlier, rendered, strict=True) if prompt is not None),
            sum(count > 0 for count in left_out),
            len(left_out),
        )
    return prompts, ["" if spans is None else spans for _, spans, _ in rendered], responses


def _render_chunk(shared, rows) -> list[tuple]:
    """(prompt, answer spans, response) per chat of ``rows`` (history, tools, last turn); a last turn that
    calls tools: its text as the template writes it, the prompt None where it is not told apart, the spans
    ``UNWRITTEN`` with the call's name and text where the template does not write the call."""
    tokenizer, template, variables, spans = shared
    rendered = []
    for history, tools, final in rows:
        try:
            rendered.append(_render_chat(history, tools, final, (tokenizer, template, variables, spans)))
        except Exception as error:  # noqa: BLE001 - a template that refuses a chat (raise_exception): said once
            rendered.append((None, REFUSED, (history, str(error))))
    return rendered


def _render_chat(history, tools, final, shared) -> tuple:
    """(prompt, answer spans, response) of one chat (``_render_chunk``'s)."""
    tokenizer, template, variables, spans = shared
    response = final["content"]
    if final.get("tool_calls") is not None:
        found = rendered_turn(history, final, tokenizer, variables, tools)
        if found is None:
            return None, None, None
        prompt, response = found
        missing = [name for name in call_names(final["tool_calls"]) if name not in response]
        if missing:
            return prompt, UNWRITTEN, (missing[0], response)
    else:
        prompt = render_messages(history, template, tokenizer, variables, tools)
    found_spans = answer_spans(history, prompt, template, tokenizer, variables, tools) if spans else ""
    return prompt, found_spans, response


# What ``_render_chunk`` gives as the spans of a chat whose last call the template does not write, and of a
# chat the template refuses (its ``raise_exception``: Llama-3.x's takes one call per turn).
UNWRITTEN = "\x00unwritten"
REFUSED = "\x00refused"


def _refuse_unwritten_calls(rendered: list, config) -> None:
    """Refuse, in one line, a chat the chat template refuses (its ``raise_exception``), and a template that
    does not write a last turn's call (its function's name is not in the text it writes for the turn)."""
    for _, spans, found in rendered:
        if spans == REFUSED:
            history, why = found
            asked = next((m["content"] for m in history if m["role"] == "user"), "")
            raise InputDataError(
                f"split.messages_column ({config.messages_column!r}): the chat template of "
                f"{config.tokenizer.source} refuses the chat asking {quoted(asked, 60)}: {quoted(why, 120)}.",
                fix="leave such chats out of the data (e.g. a turn of several tool calls where the template "
                "takes one), or use a model whose chat template renders them (split.tokenizer.source).",
            )
        if spans == UNWRITTEN:
            name, text = found
            raise ConfigError(
                f"the chat template of {config.tokenizer.source} does not render tool calls: a chat's last "
                f"turn calls {quoted(name)}, and the template writes that turn as {quoted(text, 80)}, "
                "without it (split.messages_column).",
                fix="use a model whose tokenizer's chat template renders tool_calls (split.tokenizer.source; "
                "e.g. Qwen3's, Llama-3.1's), or leave the chats with tool_calls out of the data.",
            )


def _say_tool_chats_without_tools(chats: pd.DataFrame, column: str, total: int) -> None:
    """One warning where chats call tools but the data has no ``split.tools_column``: their calls train
    without the function schemas a model is asked with."""
    tooled = sum(
        _calls_tools(history, final) for history, final in zip(chats["history"], chats["final"], strict=True)
    )
    if tooled:
        log.warning(
            "%d of %d chats call tools, but the data has no tools column %r (split.tools_column): their "
            "calls train without the function schemas a model is asked with; name the column holding them "
            "with split.tools_column (or set it to null to train them so on purpose)",
            tooled,
            total,
            column,
        )


def _calls_tools(history, final) -> bool:
    """Whether a chat (its cleaned history and last turn) holds tool calls or tool turns."""
    return final.get("tool_calls") is not None or any(
        m.get("tool_calls") is not None or m["role"] == "tool" for m in history
    )


def _without_tool_chats(chats: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """``chats`` less those with tool calls or tool turns (no chat template renders them: ``role: content``
    lines cannot), and their count."""
    tooled = [
        _calls_tools(history, final) for history, final in zip(chats["history"], chats["final"], strict=True)
    ]
    keep = ~np.asarray(tooled, dtype=bool)
    return chats[keep].reset_index(drop=True), int(len(tooled) - keep.sum())


def clean_messages(values: pd.Series, tools: list | None = None) -> tuple[pd.DataFrame, dict[str, int]]:
    """Rows of ``history`` (cleaned messages before the response), ``response``, ``split_key``, ``tools`` (the
    row's function schemas, ``tools``: one per value, ``parse_tools``'; None: none), ``final`` (the last
    message, cleaned) and ``prefixes`` (a digest of each prefix of ``history``, ``conversation_groups``'),
    and drops.

    Every content is NFC-normalized and stripped; a missing value is ``missing``, anything but a non-empty
    list of role/content mappings ending with an ``assistant`` message after at least one other message (or
    with malformed ``tool_calls``) is ``malformed_messages``, an empty or blank content is ``empty`` /
    ``whitespace_only`` except an assistant turn's that calls tools (its content may be empty). A turn keeps
    its tool fields (``tool_calls``, a tool turn's ``name`` and ``tool_call_id``); the split key holds them
    and the row's tools, so chats that differ only in a call's arguments are two rows.
    """
    tools = [None] * len(values) if tools is None else list(tools)
    reasons = [_chat_shape(value) for value in values]
    chats = [list(value) for value, reason in zip(values, reasons, strict=True) if reason is None]
    # every content of every well-shaped chat cleaned in one vectorized pass, then each chat regrouped
    contents, content_reasons = classify_values(
        pd.Series([m.get("content") for chat in chats for m in chat], dtype=object)
    )
    contents, content_reasons = contents.tolist(), content_reasons.tolist()
    rows, at = [], 0
    shaped = iter(range(len(reasons)))
    for chat in chats:
        index = next(i for i in shaped if reasons[i] is None)
        texts, found = contents[at : at + len(chat)], content_reasons[at : at + len(chat)]
        at += len(chat)
        for position, message in enumerate(chat):  # a call's content may be missing or blank
            if (
                isinstance(found[position], str)
                and found[position] != "non_string"
                and has_tool_calls(message)
            ):
                texts[position], found[position] = "", None
        reason = next((str(r) for r in found if isinstance(r, str)), None)
        if reason is not None:
            reasons[index] = reason
            continue
        messages = [
            {"role": m["role"], "content": text, **turn_fields(m)}
            for m, text in zip(chat, texts, strict=True)
        ]
        turn_keys = [_turn_key(m) for m in messages]
        key = KEY_SEPARATOR.join(turn_keys)
        if tools[index]:
            key += f"{KEY_SEPARATOR}tools\x1f{tools_key(tools[index])}"
        prefixes = _prefix_digests(turn_keys[:-1])
        rows.append((messages[:-1], messages[-1]["content"], key, tools[index], messages[-1], prefixes))
    frame = pd.DataFrame(rows, columns=["history", "response", "split_key", "tools", "final", "prefixes"])
    duplicate = frame["split_key"].duplicated(keep="first")
    counts = pd.Series(reasons, dtype=object).value_counts()
    drops = {reason: int(counts.get(reason, 0)) for reason in DROP_REASONS[:-1]}
    drops["malformed_messages"] = int(counts.get("malformed_messages", 0))
    drops["tool_calls"] = 0  # chats with tool calls no chat template renders (``prompt_frame``)
    drops["duplicate"] = int(duplicate.sum())
    return frame[~duplicate].reset_index(drop=True), drops


def _prefix_digests(turn_keys: Sequence[str]) -> list[bytes]:
    """A digest of each prefix of a chat's turns (``turn_keys``: their ``_turn_key``), each of the one before
    it and its last turn's key: two prompts begin alike exactly where their digests are the same."""
    digest, digests = b"", []
    for key in turn_keys:
        digest = hashlib.blake2b(digest + key.encode("utf-8"), digest_size=16).digest()
        digests.append(digest)
    return digests


def _turn_key(message: Mapping) -> str:
    """A cleaned turn as its part of the split key: role and content, and its tool fields (keys sorted)."""
    fields = {key: value for key, value in message.items() if key not in ("role", "content")}
    key = f"{message['role']}\x1f{line_spaces_key(message['content'])}"
    return f"{key}\x1f{tools_key([fields])}" if fields else key


def _chat_shape(value) -> str | None:
    """Why ``value`` is no chat (``missing``, ``malformed_messages``: tool calls that name no function too),
    None when it is a list of role/content mappings ending with an assistant message after another one (its
    contents are checked after)."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "missing"
    if not isinstance(value, list | tuple | np.ndarray) or len(value) < 2:
        return "malformed_messages"
    if not all(isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in value):
        return "malformed_messages"
    if value[-1]["role"] != RESPONSE_ROLE:
        return "malformed_messages"
    if any(has_tool_calls(m) and clean_tool_calls(m["tool_calls"]) is None for m in value):
        return "malformed_messages"  # calls that name no function, or keys that clash once cleaned
    return None


def malformed_chat(values: pd.Series, place=None) -> str | None:
    """Why the first value of ``values`` that is no chat is malformed, or holds a content that is no text
    (``row N: ...``, rows and messages counted from 1 as a file's lines are; ``place``: what names a row where
    not ``row N``, a shard's), None when none does: said when
    no row is left, so a column of JSON strings, of chats without an answer or of content parts
    (``[{type: text, text}]``) reads as such. A role is shown quoted on one line and cut."""
    place = place or (lambda number: f"row {number}")
    for row, value in enumerate(values, start=1):
        shape = _chat_shape(value)
        if shape is None:
            for index, message in enumerate(value, start=1):
                content = message.get("content")
                missing = content is None or (isinstance(content, float) and np.isnan(content))
                if not missing and not isinstance(content, str):
                    return (
                        f"{place(row)}: the content of message {index} ({quoted(message['role'])}) is a "
                        f"{_kind(content)}, not a text"
                    )
            continue
        if shape != "malformed_messages":
            continue
        if not isinstance(value, list | tuple | np.ndarray):
            return f"{place(row)} is a {_kind(value)}, not a list of {{role, content}} turns"
        if not all(isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in value):
            return f"{place(row)} is not a list of {{role, content}} turns"
        calls = [
            i
            for i, m in enumerate(value, start=1)
            if has_tool_calls(m) and clean_tool_calls(m["tool_calls"]) is None
        ]
        if calls:
            return (
                f"{place(row)}: the tool_calls of message {calls[0]} are not a list of calls each naming its "
                "function ({function: {name, arguments}}, the arguments a mapping or a JSON text of one), "
                "or hold two keys that are one once cleaned (NFC, invisible marks removed), or a JSON text "
                "writing a key twice"
            )
        if len(value) and value[-1]["role"] != RESPONSE_ROLE:
            return (
                f"{place(row)}: the last message is a {quoted(value[-1]['role'])} turn, not the assistant's "
                f"answer (role {RESPONSE_ROLE!r})"
            )
        return f"{place(row)} holds {len(value)} message(s), not a prompt and the assistant's answer"
    return None


def quoted(text: str, limit: int = 40) -> str:
    """``text`` quoted on one line (a newline escaped), cut after ``limit`` characters."""
    return repr(text if len(text) <= limit else text[:limit] + "…")


def _kind(value) -> str:
    """What ``value`` is, as the file wrote it (a JSON list reads as an array, an object as a mapping)."""
    if isinstance(value, list | tuple | np.ndarray):
        return "list"
    return "mapping" if isinstance(value, Mapping) else type(value).__name__


def leading_bos(tokenizer) -> int | None:
    """The BOS id when the tokenizer puts one in front of a text by default (Llama-style), else None."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return None
    with_special = tokenizer("x", add_special_tokens=True, **UNPADDED)["input_ids"]
    without = tokenizer("x", add_special_tokens=False, **UNPADDED)["input_ids"]
    return int(bos) if with_special[:1] == [bos] and without[:1] != [bos] else None


def prompt_token_ids(tokenizer, prompt: str) -> list[int]:
    """The ids a prompt string is trained with (see the module docstring), before any truncation."""
    ids = list(tokenizer(prompt, add_special_tokens=False, **UNPADDED)["input_ids"])
    bos = leading_bos(tokenizer)
    return [bos, *ids] if bos is not None and ids[:1] != [bos] else ids


def tokenizer_as_trained(tokenizer, data_format: Mapping | None):
    """The tokenizer a model folder is saved with: ``tokenizer`` itself, but for chats the split rendered as
    ``role: content`` lines (``split.chat_template: false``, ``chat_template_sha256`` None) with a tokenizer
    that has a chat template: a copy whose template renders a messages list as those lines wrapped by the
    prompt template, to the ids training gave them (checked on two probe chats), so transformers'
    ``pipeline`` and ``apply_chat_template`` prompt the model as it trained; where no such template gives
    those ids, a copy without a template (a messages list is then refused, not rendered in a format the
    model never saw), said in one warning."""
    if not data_format or data_format.get("kind") != "messages" or data_format.get("chat_template_sha256"):
        return tokenizer
    if not has_chat_template(tokenizer):
        return tokenizer
    import copy

    saved = copy.deepcopy(tokenizer)
    template = data_format.get("prompt_template") or ""
    saved.chat_template = _lines_template(template, bos=leading_bos(tokenizer) is not None)
    probes = (
        [{"role": "user", "content": "a b"}],
        [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "x\ny"},
            {"role": "assistant", "content": "z"},
            {"role": "user", "content": "w"},
        ],
    )
    for chat in probes:
        text = saved.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        asked = list(saved(text, add_special_tokens=False, **UNPADDED)["input_ids"])
        if asked != prompt_token_ids(tokenizer, render_messages(chat, template)):
            saved.chat_template = None
            log.warning(
                "The model folder's tokenizer is saved without its chat template: the chats trained on were "
                "rendered as 'role: content' lines (split.chat_template: false), which no chat template of "
                "this tokenizer gives the same ids; ask the model with `kedro run --pipeline=predict`, or "
                "give plain transformers the lines as text."
            )
            break
    return saved


def _lines_template(prompt_template: str, *, bos: bool) -> str:
    """A Jinja chat template writing the messages as ``role: content`` lines wrapped by ``prompt_template``
    (each ``{prompt}`` replaced by them, as ``render_prompt`` does; the rest written as it is), the
    tokenizer's BOS in front where ``bos``."""
    import json

    lines = (
        "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}"
        "{% if not loop.last %}{{ '\\n' }}{% endif %}{% endfor %}"
    )
    parts = ["{{ " + json.dumps(part) + " }}" if part else "" for part in prompt_template.split("{prompt}")]
    return ("{{ bos_token }}" if bos else "") + lines.join(parts)


def truncate_prompt_ids(ids: Sequence[int], keep: int, bos: int | None = None) -> list[int]:
    """Keep ``keep`` tokens of a prompt: its last ones, after the leading ``bos`` (kept) when it has one."""
    ids = list(ids)
    if keep >= len(ids):
        return ids
    if keep > 0 and bos is not None and ids[:1] == [bos]:
        return [bos, *ids[len(ids) - keep + 1 :]]
    return ids[len(ids) - keep :] if keep > 0 else []


def tokenize_pairs(
    prompts: Sequence[str],
    responses: Sequence[str],
    tokenizer,
    *,
    max_length: int,
    batch_size: int = 20_000,
    num_proc: int | str = "auto",
    answer_spans: Sequence[str | None] | None = None,
    responses_as_text: bool = False,
) -> TokenizedTexts:
    """Prompt ids + response ids + EOS per row, truncated as the module docstring says, with prompt
    lengths and, given ``answer_spans`` (the character ranges ``prompt_frame`` found), the earlier answers'
    token ranges (tokens overlapping a range; moved with the prompt's cut, the cut part dropped).
    ``responses_as_text``: a special token's text inside a response is encoded as its characters (a
    response of prompt/response data is the data's text alone; a chat's may be a template's render)."""
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    eos = int(tokenizer.eos_token_id)
    encode = {"batch_size": batch_size, "num_proc": num_proc}
    original = list(prompts)
    prompts, prompt_cut = cut_long_texts(original, max_length, keep="tail")  # prompts lose their start
    responses, response_cut = cut_long_texts(list(responses), max_length)
    answers = None
    if answer_spans is not None:  # a missing value (NaN once read back from parquet): no earlier answer
        answer_spans = [text if isinstance(text, str) else "" for text in answer_spans]
    if answer_spans is not None and any(answer_spans):  # a chat's prompt encoded once, with its character map
        shifts = np.fromiter((len(a) - len(b) for a, b in zip(original, prompts, strict=True)), np.int64)
        (p_values, p_lengths), answers = prompt_ids_and_answer_ranges(
            prompts, answer_spans, shifts, tokenizer, **encode
        )
    else:
        p_values, p_lengths = encode_ragged(prompts, tokenizer, add_special_tokens=False, **encode)
    r_values, r_lengths = encode_ragged(
        responses, tokenizer, add_special_tokens=False, special_tokens_as_text=responses_as_text, **encode
    )
    raw_lengths = p_lengths
    p_values, p_lengths, has_bos = _with_bos(p_values, p_lengths, leading_bos(tokenizer))
    r_values, r_lengths = _without_trailing(r_values, r_lengths, eos)
    budget = max_length - 1  # room for prompt + response; the EOS takes the last slot
    prompt_floor = np.minimum(p_lengths, budget // 2)
    keep_r = np.minimum(r_lengths, budget - prompt_floor)
    keep_p = np.minimum(p_lengths, budget - keep_r)
    head = (has_bos & (keep_p > 0)).astype(np.int64)
    cut = p_lengths - keep_p
    out_lengths = keep_p + keep_r + 1
    offsets = np.concatenate([[0], np.cumsum(out_lengths)]).astype(np.int64)
    out = np.empty(int(offsets[-1]), dtype=np.int32)
    p_pos = _positions(p_lengths)
    p_keep = (p_pos < np.repeat(head, p_lengths)) | (p_pos >= np.repeat(head + cut, p_lengths))
    out[_destinations(offsets[:-1], keep_p)] = p_values[p_keep]
    r_keep = _positions(r_lengths) < np.repeat(keep_r, r_lengths)
    out[_destinations(offsets[:-1] + keep_p, keep_r)] = r_values[r_keep]
    out[offsets[1:] - 1] = eos
    truncated = (keep_p < p_lengths) | (keep_r < r_lengths) | prompt_cut | response_cut
    if answers is not None:  # into the sample: after a BOS put in front, less the prompt's cut start
        answers = kept_answer_ranges(answers, p_lengths - raw_lengths, head, cut)
    return TokenizedTexts(
        out, offsets, truncated, prompt_lengths=keep_p.astype(np.int32), answer_spans=answers
    )


def _positions(lengths: np.ndarray) -> np.ndarray:
    """Each token's position inside its row, for ragged rows of ``lengths``."""
    starts = np.cumsum(lengths) - lengths
    return np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(starts, lengths)


def _destinations(row_starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Flat output indices of ``counts[i]`` consecutive tokens written from ``row_starts[i]`` on."""
    return np.repeat(row_starts, counts) + _positions(counts)


def _with_bos(values: np.ndarray, lengths: np.ndarray, bos: int | None):
    """Put ``bos`` in front of every row that does not start with it; also say which rows start with it."""
    starts = np.cumsum(lengths) - lengths
    if bos is None:
        return values, lengths, np.zeros(len(lengths), dtype=bool)
    first_is_bos = (lengths > 0) & (values[np.minimum(starts, max(len(values) - 1, 0))] == bos)
    missing = ~first_is_bos
    new_lengths = lengths + missing
    new_values = np.empty(int(new_lengths.sum()), dtype=np.int32)
    new_starts = np.cumsum(new_lengths) - new_lengths
    new_values[new_starts[missing]] = bos
    new_values[np.repeat(new_starts + missing, lengths) + _positions(lengths)] = values
    return new_values, new_lengths, np.ones(len(lengths), dtype=bool)


def _without_trailing(values: np.ndarray, lengths: np.ndarray, token: int):
    """Drop a trailing ``token`` a tokenizer may add to a response (fastlm appends exactly one EOS)."""
    ends = np.cumsum(lengths)
    trailing = (lengths > 0) & (values[np.maximum(ends - 1, 0)] == token) if len(values) else lengths > 0
    if not trailing.any():
        return values, lengths
    keep = np.ones(len(values), dtype=bool)
    keep[(ends - 1)[trailing]] = False
    return values[keep], lengths - trailing
