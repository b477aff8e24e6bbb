"""Prompt/response data: rendering, cleaning and tokenization for completion-only training.

Data formats (``split`` parameters, conf/base/parameters_split.yml)
-------------------------------------------------------------------
* ``prompt_column`` + ``response_column`` (e.g. ``dialogue`` / ``summary``): the prompt text is wrapped by
  ``prompt_template`` (``{prompt}`` replaced by the text, e.g. ``"{prompt}\\n\\n### Response:\\n"``).
* ``messages_column``: a chat-style list of ``{"role": ..., "content": ...}`` per row whose last message is
  the ``assistant`` response. The earlier messages are rendered with the tokenizer's chat template
  (``add_generation_prompt=True``, and the template variables of ``split.chat_template_kwargs``, e.g.
  ``enable_thinking: false``) when it has one and ``split.chat_template`` is true; otherwise as
  ``"role: content"`` lines wrapped by ``prompt_template``. A row that is not such a list is dropped as
  ``malformed_messages``.

Cleaning (NFC, strip, drop missing/non-string/empty rows, exact duplicates) and the hash split key on the
*raw cleaned pair* (prompt text and response, or every role and content), never on the rendered prompt: a
new template or another model's chat template keeps every row in its split, so runs stay comparable.

Contract of the outputs
-----------------------
``corpus_splits`` (data/03_primary/corpus_splits.parquet) has the columns

* ``prompt``: the prompt string exactly as it is tokenized for training, template included;
* ``response``: the reference response text (no EOS);
* ``split``: train / validation / test.

The tokenized Arrow splits have ``input_ids`` = prompt tokens + response tokens + EOS, ``length`` and
``prompt_length`` (the number of leading prompt tokens). Prompt and response are tokenized separately and the
ids concatenated, so ``prompt_length`` is exact:

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

import re
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from fastlm.corpus.cleaning import DROP_REASONS, classify_values, clean_pairs
from fastlm.corpus.tokenization import TokenizedTexts, cut_long_texts, encode_ragged

__all__ = [
    "CHAT_DATE",
    "clean_messages",
    "has_chat_template",
    "leading_bos",
    "prompt_frame",
    "prompt_token_ids",
    "render_messages",
    "render_prompt",
    "tokenize_pairs",
    "truncate_prompt_ids",
    "unread_variables",
]

RESPONSE_ROLE = "assistant"
# Never a tokenizer's own padding or truncation, nor its warning that a text longer than its
# model_max_length "will result in indexing errors": every caller truncates the ids itself.
UNPADDED = {"padding": False, "truncation": False, "verbose": False}
# The date a chat template that dates its prompt is given (``date_string``): Llama-3.1/3.2/3.3's own default
# where no clock is given, instead of the day the template is rendered on.
CHAT_DATE = "26 Jul 2024"
KEY_SEPARATOR = "\x00"


def prompt_frame(raw: pd.DataFrame, config, tokenizer=None) -> tuple[pd.DataFrame, dict[str, int]]:
    """Clean and render ``raw`` (``config``: the split parameters) into ``prompt``, ``response`` and
    ``split_key`` (the raw cleaned pair the hash split keys on), with drop counts per reason."""
    if config.data_format == "messages":
        chats, drops = clean_messages(raw[config.messages_column])
        renderer = tokenizer if config.chat_template else None
        variables = config.chat_template_kwargs
        prompts = [
            render_messages(history, config.prompt_template, renderer, variables)
            for history in chats["history"]
        ]
        return pd.DataFrame(
            {"prompt": prompts, "response": chats["response"], "split_key": chats["split_key"]}
        ), drops
    pairs, drops = clean_pairs(raw[config.prompt_column], raw[config.response_column])
    frame = pd.DataFrame(
        {
            "prompt": [render_prompt(text, config.prompt_template) for text in pairs["prompt"]],
            "response": pairs["response"],
            "split_key": pairs["prompt"] + KEY_SEPARATOR + pairs["response"],
        }
    )
    return frame, drops


def render_prompt(text: str, template: str) -> str:
    """``template`` with ``{prompt}`` replaced by ``text`` (no other braces are interpreted)."""
    return template.replace("{prompt}", text)


def has_chat_template(tokenizer) -> bool:
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def unread_variables(tokenizer, variables: Mapping) -> list[str]:
    """The names of ``variables`` the tokenizer's chat template never mentions: given to it, they change
    nothing (a misspelled ``enable_thinking``, a variable of another model family's template)."""
    template = str(getattr(tokenizer, "chat_template", "") or "")
    return [name for name in variables if not re.search(rf"\b{re.escape(name)}\b", template)]


def render_messages(
    history: Sequence[Mapping], template: str, tokenizer=None, variables: Mapping | None = None
) -> str:
    """The prompt of a chat: the tokenizer's chat template (with the generation prompt) when given one that
    has a template, else ``"role: content"`` lines wrapped by ``template``. A template that dates its prompt
    (Llama-3.1/3.2/3.3: "Today Date: ...") gets ``CHAT_DATE`` on every day, so the split, the report and
    predict render a chat alike whenever they run. ``variables`` (``split.chat_template_kwargs``, TRL's
    ``chat_template_kwargs``: ``{"enable_thinking": False}`` for Qwen3) go to the template too."""
    if has_chat_template(tokenizer):
        return tokenizer.apply_chat_template(
            list(history),
            tokenize=False,
            add_generation_prompt=True,
            date_string=CHAT_DATE,
            **dict(variables or {}),
        )
    return render_prompt("\n".join(f"{m['role']}: {m['content']}" for m in history), template)


def clean_messages(values: pd.Series) -> tuple[pd.DataFrame, dict[str, int]]:
    """Rows of ``history`` (cleaned messages before the response), ``response`` and ``split_key``, and drops.

    Every content is NFC-normalized and stripped; a missing value is ``missing``, anything but a non-empty
    list of role/content mappings ending with an ``assistant`` message after at least one other message is
    ``malformed_messages``, an empty or blank content is ``empty`` / ``whitespace_only``.
    """
    rows, reasons = [], []
    for value in values:
        reason, row = _clean_chat(value)
        reasons.append(reason)
        if reason is None:
            rows.append(row)
    frame = pd.DataFrame(rows, columns=["history", "response", "split_key"])
    duplicate = frame["split_key"].duplicated(keep="first")
    counts = pd.Series(reasons, dtype=object).value_counts()
    drops = {reason: int(counts.get(reason, 0)) for reason in DROP_REASONS[:-1]}
    drops["malformed_messages"] = int(counts.get("malformed_messages", 0))
    drops["duplicate"] = int(duplicate.sum())
    return frame[~duplicate].reset_index(drop=True), drops


def _clean_chat(value) -> tuple[str | None, tuple | None]:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "missing", None
    if not isinstance(value, list | tuple | np.ndarray) or len(value) < 2:
        return "malformed_messages", None
    if not all(isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in value):
        return "malformed_messages", None
    if value[-1]["role"] != RESPONSE_ROLE:
        return "malformed_messages", None
    contents, reasons = classify_values(pd.Series([m.get("content") for m in value], dtype=object))
    if reasons.notna().any():
        return str(reasons[reasons.notna()].iloc[0]), None
    messages = [{"role": m["role"], "content": text} for m, text in zip(value, contents, strict=True)]
    key = KEY_SEPARATOR.join(f"{m['role']}\x1f{m['content']}" for m in messages)
    return None, (messages[:-1], messages[-1]["content"], key)


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
) -> TokenizedTexts:
    """Prompt ids + response ids + EOS per row, truncated as the module docstring says, with prompt
    lengths."""
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    eos = int(tokenizer.eos_token_id)
    encode = {"batch_size": batch_size, "num_proc": num_proc}
    prompts, prompt_cut = cut_long_texts(list(prompts), max_length, keep="tail")  # prompts lose their start
    responses, response_cut = cut_long_texts(list(responses), max_length)
    p_values, p_lengths = encode_ragged(prompts, tokenizer, add_special_tokens=False, **encode)
    r_values, r_lengths = encode_ragged(responses, tokenizer, add_special_tokens=False, **encode)
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
    return TokenizedTexts(out, offsets, truncated, prompt_lengths=keep_p.astype(np.int32))


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
