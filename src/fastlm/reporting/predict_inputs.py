"""A predict input file's rows as the prompt ids the model is asked (``input_rows``; ``id_input_rows`` for
a model trained on pre-tokenized ids), or the reason each refused row is refused, and the report's sample
prompts asked as predict asks an input (``sample_prompts``).

* Inputs: the text column (continued as it is), the prompt column (wrapped by the prompt template, as in
  training) or the messages column (chat-style ``[{role, content}, ...]``: the turns up to the last ``user``
  or ``tool`` turn, with the row's tools, rendered as training rendered them, ``predict_chats.ChatFormat``:
  its chat template and template variables, from the model's record; ``assistant`` turns after it are the
  reference answer and are not given to the model), cleaned as the split cleans (NFC, stripped). A row that is
  missing, not a string (not a list of role/content turns with a user turn) or empty is REFUSED: kept in the
  table with its reason and an empty prediction, counted in the summary, logged.
* Tokens: ``prompt_token_ids`` (the ids training used, BOS included). An input longer than the model leaves
  room for (``limit``, ``input_limit``) is truncated as training truncates prompts (its last tokens, a
  leading BOS kept) and counted, or refused with ``too_long``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fastlm.corpus.chat_template import unwritten_roles
from fastlm.corpus.cleaning import classify_values
from fastlm.corpus.config import DEFAULT_PROMPT_TEMPLATE
from fastlm.corpus.pretokenized import input_ids
from fastlm.corpus.prompts import UNPADDED, leading_bos, quoted, render_prompt, truncate_prompt_ids
from fastlm.corpus.readers import separator_hint
from fastlm.corpus.sharegpt import role_content_chats
from fastlm.corpus.tokenization import call_chunks
from fastlm.corpus.tool_calls import parse_tools
from fastlm.engine.evaluate.line_ends import lf_line_ends
from fastlm.errors import InputDataError
from fastlm.reporting.predict_chats import ChatFormat, chat_format, chat_histories, with_system_prompt
from fastlm.reporting.references import input_limit

__all__ = [
    "IdVocabulary",
    "SamplePrompts",
    "encode_inputs",
    "id_input_rows",
    "input_limit",
    "input_rows",
    "plain_id",
    "sample_prompts",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplePrompts:
    """The report's sample prompts as the model is given them: ``ids`` per prompt (None: tokenized by
    ``generate_samples`` as written), and whether its outputs are continuations
    (``continuation``: decoded as they are) or responses (``response_text``)."""

    ids: list[list[int]] | None
    continuation: bool


def sample_prompts(
    prompts: list[str],
    trained: dict,
    fingerprint: dict | None,
    *,
    fingerprint_source: str,
    limit: int | None = None,
) -> SamplePrompts:
    """The report's sample prompts as predict asks the model an input of its training's kind, through the
    same function (``encode_inputs``), read from the model's own record (``training_data.json``), else the
    data's ``fingerprint``:

    * prompt/response data: each prompt cleaned as predict cleans one (``classify_values``: stripped) and
      wrapped by the training's ``prompt_template``, as predict's ``prompt_column``; outputs are responses;
    * chat messages: each one ``user`` turn (cleaned so) rendered with the training's chat format
      (``chat_format``: the chat template and its variables), as predict's ``messages_column``; responses;
    * plain text: the prompt as written (not stripped: a trailing space is part of what the model continues)
      tokenized as predict's ``text_column``, an empty prompt starting from BOS; outputs are continuations;
    * pre-tokenized ids: as written, continued (``generate_samples`` tokenizes them).

    A prompt longer than ``limit`` tokens (``input_limit``, predict's) keeps its last ones, a leading BOS
    kept, as predict truncates an input, with a warning."""
    record = trained.get("training_data")
    if record is not None:
        data_format, source = record.get("data_format") or {}, "the trained model's training_data.json"
    else:
        record = fingerprint or {}
        data_format = (record.get("params") or {}).get("data_format") or {}
        source = fingerprint_source
    kind, tokenizer = data_format.get("kind"), trained["tokenizer"]
    if kind == "pretokenized":
        return SamplePrompts(ids=None, continuation=True)
    if kind is None:
        texts = [text for text in prompts if text]
        encoded = iter(encode_inputs(texts, tokenizer))
        ids = [next(encoded) if text else [] for text in prompts]
        continuation = True
    else:
        cleaned = classify_values(pd.Series(prompts, dtype=object))[0].fillna("").tolist()
        if kind == "messages":
            chat = chat_format(
                tokenizer,
                with_system_prompt(data_format, record, source),
                model="the trained model",
                parameter="report.prompts",
            )
            ids = encode_inputs([chat.turns(text) for text in cleaned], tokenizer, chat=chat)
            how = (
                "one user turn"
                + (" after the system turn of every training chat" if chat.system_prompt else "")
                + " in its training's chat format"
                + ("" if chat.chat_template else " (role: content lines)")
            )
        else:
            template = data_format.get("prompt_template") or DEFAULT_PROMPT_TEMPLATE
            ids = encode_inputs(cleaned, tokenizer, template=template)
            how = f"wrapped by its training's prompt template {template!r}"
        log.info("Sample generations: each of report.prompts is asked %s, as predict asks it", how)
        continuation = False
    bos, cut = leading_bos(tokenizer), 0
    if limit is not None:
        for index, prompt in enumerate(ids):
            if len(prompt) > limit:
                ids[index], cut = truncate_prompt_ids(prompt, limit, bos), cut + 1
    if cut:
        log.warning(
            "Sample generations: %d of report.prompts are longer than the %d tokens predict gives this model "
            "(references.prompt_budget of its training length) and keep their last tokens, as predict's do",
            cut,
            limit,
        )
    return SamplePrompts(ids=ids, continuation=continuation)


def encode_inputs(
    inputs: list,
    tokenizer,
    *,
    template: str | None = None,
    chat: ChatFormat | None = None,
    tools: list | None = None,
) -> list[list[int]]:
    """The prompt ids of cleaned inputs as predict and the report give them to the model, as training
    tokenized prompts: each rendered (a chat history by ``chat``; a text wrapped by ``template``, or as it is
    without one: a text the model continues), tokenized without the tokenizer's added special tokens, its
    leading BOS (``leading_bos``) in front; not truncated. ``tools``: each chat's tools (function schemas, or
    None), given to its render."""
    if chat is not None:
        tools = [None] * len(inputs) if tools is None else tools
        rendered = [
            chat.render(history, tokenizer, given) for history, given in zip(inputs, tools, strict=True)
        ]
    else:
        rendered = [render_prompt(text, template) if template else text for text in inputs]
    # a text continued as it is was tokenized by the split with a special token's text read as text
    return _encoded(rendered, tokenizer, special_tokens_as_text=chat is None and not template)


# Texts tokenized in one call: a call holds each text's whole encoding (tokens, offsets, masks: ~3 KB a short
# prompt) until it returns, so a whole input in one call grew the peak memory with its rows (~90 MB for
# 30,000 short prompts); slices keep it flat at no measurable cost in time. A slice of long documents is cut
# further at the split's MAX_CHARS_PER_CALL characters (1,024 texts of 100 KB held ~3.5 GB in one call).
ENCODE_SLICE_ROWS = 1024


def _encoded(rendered: list[str], tokenizer, special_tokens_as_text: bool = False) -> list[list[int]]:
    """Rendered prompts tokenized as training tokenized them (``encode_inputs``), ``ENCODE_SLICE_ROWS`` at a
    time, fewer where they hold more than ``MAX_CHARS_PER_CALL`` characters (``call_chunks``);
    ``special_tokens_as_text``: a special token's text read as its characters (plain texts, as
    ``tokenize_texts`` reads them)."""
    bos = leading_bos(tokenizer)
    encoded = []
    split = {"split_special_tokens": True} if special_tokens_as_text else {}
    for chunk in call_chunks(rendered, ENCODE_SLICE_ROWS):
        piece = tokenizer(list(chunk), add_special_tokens=False, **UNPADDED, **split)
        encoded.extend(
            [bos, *ids] if bos is not None and ids[:1] != [bos] else list(ids) for ids in piece["input_ids"]
        )
    return encoded


def input_rows(
    table: pd.DataFrame,
    tokenizer,
    *,
    column: tuple[str, str],
    template: str | None,
    id_column: str | None,
    limit: int | None,
    too_long: str,
    source: str,
    chat: ChatFormat | None = None,
) -> pd.DataFrame:
    """id, input (as given; messages as JSON), ids (prompt token ids, None when refused), refused (reason or
    None), truncated, and, for chats read with a tools column, tools (each row's). With ``chat`` the column
    holds messages (rendered by it; ``template`` is unused), or, with ``chat.user_turn``, texts, each one
    user turn rendered by it (as the report asks a chat model its prompts). A chat's tools are read from the
    column ``chat.tools_column`` names where the table has it (``parse_tools``: a malformed value refuses
    the file in one line)."""
    _check_columns(table, column, id_column, source)
    values = table[column[1]].reset_index(drop=True)
    user_turn = chat is not None and chat.user_turn
    messages = chat is not None and not user_turn
    tools = None
    if messages:  # ShareGPT turns ({from, value}) read as role/content ones, as the split reads them
        turns, _ = role_content_chats(values, f"{column[0]} ({column[1]!r}) of {source}")
        histories, reasons = chat_histories(turns, templated=chat.chat_template)
        if chat.chat_template:  # a turn the template skips: the chat would be asked without it
            _refuse_unwritten_roles(histories, reasons, tokenizer, chat.variables)
        ok = reasons.isna().to_numpy()
        inputs = [histories[row] for row in np.flatnonzero(ok)]
        if chat.tools_column is not None and chat.tools_column in table.columns:
            given = parse_tools(
                table[chat.tools_column], f"the tools column {chat.tools_column!r} of {source}"
            )
            tools = [given[row] for row in np.flatnonzero(ok)]
    else:
        texts, reasons = classify_values(values)
        ok = reasons.isna().to_numpy()
        inputs = list(texts[ok])
        if user_turn:
            inputs = [chat.turns(text) for text in inputs]
    prompts: list = [None] * len(values)
    if messages:  # each chat rendered alone: one its template refuses is a refused row
        rendered = _rendered_chats(inputs, tokenizer, chat, tools)
        rows = np.flatnonzero(ok)
        for row, text in zip(rows, rendered, strict=True):
            if isinstance(text, Exception):
                reasons.iat[row] = f"template_refused ({quoted(str(text), 100)})"
        kept = [(row, text) for row, text in zip(rows, rendered, strict=True) if isinstance(text, str)]
        encoded = _encoded([text for _, text in kept], tokenizer)
        rows = [row for row, _ in kept]
    else:
        encoded = encode_inputs(inputs, tokenizer, template=template, chat=chat, tools=tools)
        rows = np.flatnonzero(ok)
    for row, prompt in zip(rows, encoded, strict=True):
        prompts[row] = prompt
    shown = values.map(_shown_messages if messages else _shown, na_action=None)
    cut = (limit, too_long, leading_bos(tokenizer))
    found = _row_table(table, id_column, shown, prompts, reasons, cut, source=source)
    if tools is not None:  # each row's tools (None: none, or refused), as its chat was asked with them
        given: list = [None] * len(values)
        for row, row_tools in zip(np.flatnonzero(ok), tools, strict=True):
            given[row] = row_tools
        found["tools"] = pd.Series(given, dtype=object)
    return found


def _refuse_unwritten_roles(histories: list, reasons: pd.Series, tokenizer, variables: dict) -> None:
    """A chat with a turn of a role the chat template writes nowhere (``unwritten_roles``: Qwen3's skips a
    ``human`` turn) refused with its reason, in place: it would be asked without that turn's text."""
    roles = {m["role"] for history in histories if history is not None for m in history}
    unwritten = set(unwritten_roles(tokenizer, roles, variables))
    for row, history in enumerate(histories):
        role = next((m["role"] for m in history or () if m["role"] in unwritten), None)
        if role is not None and reasons.iat[row] is None:
            reasons.iat[row] = f"unwritten_role ({quoted(role)}: the chat template writes no turn of it)"


def _rendered_chats(histories: list, tokenizer, chat: ChatFormat, tools: list | None) -> list:
    """Each chat's prompt as ``chat`` renders it, or the exception its template raised (Llama-3.x's refuses
    a turn of several tool calls)."""
    rendered: list = []
    for history, given in zip(histories, tools or [None] * len(histories), strict=True):
        try:
            rendered.append(chat.render(history, tokenizer, given))
        except Exception as error:  # noqa: BLE001 - the template's own refusal (raise_exception), kept as the reason
            rendered.append(error)
    return rendered


@dataclass(frozen=True)
class IdVocabulary:
    """The ids a model trained on pre-tokenized data (``split.pretokenized``) can be asked: ``0 ..
    vocab_size - 1`` (``split.vocab_size``), never ``eos_id`` (``split.eos_id``, which ends every training
    sample)."""

    vocab_size: int
    eos_id: int

    def fix(self, parameter: str, column: str) -> str:
        """What each row of the input must hold, for a one-line refusal."""
        return (
            f"give {parameter} ({column!r}) ids 0 .. {self.vocab_size - 1} a row, separated by spaces (e.g. "
            f'"3 17 5") or as a list, without {self.eos_id} (the EOS id)'
        )


def id_input_rows(
    table: pd.DataFrame,
    *,
    column: tuple[str, str],
    vocabulary: IdVocabulary,
    id_column: str | None,
    limit: int | None,
    too_long: str,
    source: str,
) -> pd.DataFrame:
    """``input_rows`` for a model trained on pre-tokenized ids: each row of the column (ids separated by
    spaces, a list of ids, or one id) is asked as its ids, as training read them (no BOS, no tokenizer: the
    model's tokenizer reads a word that is none of its ids as its EOS id), or refused with the reason of
    ``corpus.pretokenized.input_ids`` (``malformed_ids``, ``unknown_id``, ``eos_id``, ``empty``, ...). The
    input is shown as its ids joined by spaces (a refused row as given)."""
    _check_columns(table, column, id_column, source)
    values = table[column[1]].reset_index(drop=True)
    texts, reasons = classify_values(values)  # a text is cleaned as any: NFC, invisible marks, stripped
    prompts: list = [None] * len(values)
    shown = values.map(_shown_ids, na_action=None)
    for row, (value, text, reason) in enumerate(zip(values, texts, reasons, strict=True)):
        usable = pd.isna(reason)
        if not usable and reason != "non_string":  # missing, empty, whitespace_only
            continue
        ids, reasons[row] = input_ids(
            text if usable else value,
            vocab_size=vocabulary.vocab_size,
            eos_id=vocabulary.eos_id,
        )
        if ids is not None:
            prompts[row], shown[row] = ids, " ".join(map(str, ids))
    return _row_table(table, id_column, shown, prompts, reasons, (limit, too_long, None), source=source)


def _check_columns(table: pd.DataFrame, column: tuple[str, str], id_column: str | None, source: str) -> None:
    for parameter, name in (column, ("predict.id_column", id_column)):
        if name is not None and name not in table.columns:
            hint = separator_hint(table, source)
            if hint is not None:  # one column named after the whole header: another separator
                raise InputDataError(
                    f"{source} has no column {name!r} ({parameter}); {hint[0]}.", fix=hint[1]
                )
            raise InputDataError(
                f"{source} has no column {name!r} ({parameter}); its columns are "
                f"{[str(c) for c in table.columns]}.",
                fix=f"--params {parameter}=<one of them>.",
            )


def _row_table(
    table: pd.DataFrame,
    id_column: str | None,
    shown: pd.Series,
    prompts: list,
    reasons: pd.Series,
    cut: tuple,
    *,
    source: str = "the input",
) -> pd.DataFrame:
    """The rows' table (``input_rows``'): each prompt (None: refused, ``reasons``) cut to ``limit`` tokens
    (``cut``: limit, too_long, the leading BOS kept), or refused as too long. Ids of ``id_column`` that do
    not name one row each are said in one warning (``_say_shared_ids``)."""
    limit, too_long, bos = cut
    ids: list = [None] * len(prompts)
    truncated = np.zeros(len(prompts), dtype=bool)
    for row, prompt in enumerate(prompts):
        if prompt is None:
            continue
        if limit is not None and len(prompt) > limit:
            if too_long == "refuse":
                reasons[row] = f"too_long ({len(prompt)} tokens > {limit})"
                continue
            prompt, truncated[row] = truncate_prompt_ids(prompt, limit, bos), True
        ids[row] = prompt
    row_ids = table[id_column].reset_index(drop=True) if id_column else pd.Series(range(len(prompts)))
    if id_column:
        _say_shared_ids(row_ids, id_column, source)
    return pd.DataFrame(
        {"id": row_ids, "input": shown, "ids": ids, "refused": reasons, "truncated": truncated}
    )


LISTED_IDS = 3  # ids (and rows without one) named in the warning on ids that name no single row


def _say_shared_ids(row_ids: pd.Series, id_column: str, source: str) -> None:
    """Say in one warning the rows of ``id_column`` whose id does not name them alone, which a join of the
    predictions on ``id`` mixes up: ids another row has too (compared as the predictions' CSV writes them: a
    JSON 3 and "3" are one id), and rows with none (missing or blank), the first few of each named by row
    number (0-based, as an unset ``predict.id_column`` numbers them)."""
    written = [None if _no_id(value) else str(plain_id(value)) for value in row_ids]
    rows: dict[str, list[int]] = {}
    for row, key in enumerate(written):
        if key is not None:
            rows.setdefault(key, []).append(row)
    shared = {key: found for key, found in rows.items() if len(found) > 1}
    missing = [row for row, key in enumerate(written) if key is None]
    if not shared and not missing:
        return
    said = []
    if shared:
        named = "; ".join(
            f"{key!r}: {_rows_named(found)}" for key, found in list(shared.items())[:LISTED_IDS]
        )
        count = sum(len(found) for found in shared.values())
        more = "; ..." if len(shared) > LISTED_IDS else ""
        said.append(f"{count} rows share an id with another row ({named}{more})")
    if missing:
        said.append(
            f"{len(missing)} row{' has' if len(missing) == 1 else 's have'} no id ({_rows_named(missing)})"
        )
    log.warning(
        "predict.id_column %r of %s: %s, so the predictions' id does not name one row each (a join on it "
        "mixes them up); give each row an id of its own, or leave predict.id_column unset (each "
        "prediction's id is then its row number)",
        id_column,
        source,
        " and ".join(said),
    )


def _no_id(value) -> bool:
    """A missing (None, NaN, pandas' NA) or blank id."""
    if isinstance(value, str):
        return not value.strip()
    return value is None or (pd.api.types.is_scalar(value) and bool(pd.isna(value)))


def _rows_named(rows: list[int]) -> str:
    """``row 2``, ``rows 0 and 1``, ``rows 0, 4 and 9``, ``rows 0, 4, 9, ...``: the first ``LISTED_IDS``."""
    shown = [str(row) for row in rows[:LISTED_IDS]]
    if len(rows) > LISTED_IDS:
        return f"rows {', '.join(shown)}, ..."
    if len(shown) == 1:
        return f"row {shown[0]}"
    return f"rows {', '.join(shown[:-1])} and {shown[-1]}"


def _shown(value) -> str:
    """The input as the table shows it: missing as empty, anything else as its text with LF line ends (a CR
    would split its row in the CSV; the model reads it so too, cleaned as the split cleans)."""
    return "" if value is None or (isinstance(value, float) and value != value) else lf_line_ends(str(value))


def _shown_ids(value) -> str:
    """An ids value as the table shows it: a list's items joined by spaces, anything else as ``_shown``."""
    if isinstance(value, list | tuple | np.ndarray):
        return " ".join(str(plain_id(item)) for item in value)
    return _shown(value)


def _shown_messages(value) -> str:
    """A messages value as the table shows it: a list as JSON, anything else as ``_shown``."""
    if isinstance(value, list | tuple | np.ndarray):
        return json.dumps(
            [dict(m) if isinstance(m, Mapping) else m for m in value], ensure_ascii=False, default=str
        )
    return _shown(value)


def plain_id(value):
    """A JSON-able id (numpy scalars to Python)."""
    return value.item() if hasattr(value, "item") else value
