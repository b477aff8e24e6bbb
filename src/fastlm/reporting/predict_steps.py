"""The predict pipeline's checks and records around ``predictions.predict_rows``: what the settings change
nothing of (template variables no template reads, prompts asked of a plain-text model), the refusals of
prompts asked of a model trained on ids and of an input of no askable row, the ids such a model is asked
in, the prompt limit, and how chats were rendered, for the summary. Parameters are ``params:predict`` (the
pipeline's ``PredictParams``), named in the messages as ``predict.<name>``."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from fastlm.corpus.chat_template import unread_variables
from fastlm.corpus.prompts import quoted
from fastlm.corpus.sharegpt import role_content_chats
from fastlm.corpus.tool_calls import has_tool_calls, parse_tools, plain
from fastlm.engine.data.collators import pad_id_of
from fastlm.errors import InputDataError
from fastlm.reporting.predict_chats import chat_format, chat_template_sha256
from fastlm.reporting.predict_inputs import IdVocabulary, input_limit
from fastlm.reporting.references import prompt_budget

__all__ = [
    "call_reader",
    "chat_record",
    "check_prompts_of_text_model",
    "check_token_ids",
    "check_template_variables",
    "id_vocabulary",
    "input_chat",
    "predict_input_limit",
    "predict_input_limit_source",
    "refuse_an_input_of_no_askable_row",
    "refuse_a_tokenizer_without_eos",
    "refuse_prompts_of_an_id_model",
    "say_predicted",
    "say_unused_decoding",
    "system_turn_record",
    "tools_record",
    "training_rows",
]

log = logging.getLogger(__name__)


def chat_record(chat, tokenizer, user_turn: bool) -> dict:
    """How the messages were rendered, for the summary: texts asked as user turns name the system turn put
    before each (every training chat's), said once in the log too."""
    system = {}
    if user_turn and chat.system_prompt:
        system = {"system_prompt": chat.system_prompt}
        log.info("predict: each input follows the system turn every training chat began with")
    if chat.chat_template:
        return {
            "chat_template_sha256": chat_template_sha256(tokenizer),
            "chat_template_kwargs": chat.variables,
            **system,
        }
    return {"chat_template_sha256": None, "messages_prompt_template": chat.prompt_template, **system}


def tools_record(table: pd.DataFrame, chat, column: str, asked=None) -> dict:
    """Where the chats' tools came from, for the summary: the column (the training's ``split.tools_column``)
    where the input has it, else None, and the rows it gives tools. Chats in ``column`` that call tools or
    hold a tool's result, asked from an input without that column, are asked without any tools: said in
    one warning (not for a model trained with ``split.tools_column: null``, which reads no tools).
    ``asked``: which rows of ``table`` are asked (None: all): a refused chat is not counted."""
    name = chat.tools_column
    if name is not None and name in table.columns:
        given = parse_tools(table[name], f"the tools column {name!r}")
        return {"tools_column": name, "rows_with_tools": sum(tools is not None for tools in given)}
    chats = role_content_chats(table[column], f"predict.messages_column ({column!r})")[0]  # ShareGPT's too
    kept = [True] * len(table) if asked is None else [bool(flag) for flag in asked]
    calling = (
        sum(_calls_tools(turns) for turns, used in zip(chats, kept, strict=True) if used)
        if name is not None
        else 0
    )
    if calling:
        log.warning(
            "predict: %d chat(s) of column %r call tools or hold a tool's result, but the input has no"
            " column %r (the training's split.tools_column): they are asked without tools. Fix: give each"
            " chat's tools in a column %r",
            calling,
            column,
            name,
            name,
        )
    return {"tools_column": None, "rows_with_tools": 0}


def system_turn_record(table: pd.DataFrame, chat, column: str, asked=None) -> dict:
    """Chats asked without the system turn every training chat began with (``chat.system_prompt``), for the
    summary (``chats_without_system_turn``): they are asked as given, said in one warning naming that turn and
    how to add it; nothing for a model whose training chats shared no system turn. ``asked``: which rows of
    ``table`` are asked (the rows' ``refused`` is missing; None: all): a refused chat is asked neither way."""
    if chat is None or not chat.system_prompt:
        return {}
    chats = role_content_chats(table[column], f"predict.messages_column ({column!r})")[0]  # ShareGPT's too
    kept = [True] * len(table) if asked is None else [bool(flag) for flag in asked]
    turns = [plain(value) for value, used in zip(chats, kept, strict=True) if used]
    given = [value for value in turns if isinstance(value, list) and value and isinstance(value[0], dict)]
    lacking = sum(value[0].get("role") != "system" for value in given)
    if lacking:
        log.warning(
            "predict: %d of %d chats of column %r begin without the system turn every training chat began"
            ' with (%s): they are asked as given. Fix: begin each with {"role": "system", "content": ...}'
            " holding that turn (the model's training_data.json, system_prompt)",
            lacking,
            len(given),
            column,
            quoted(chat.system_prompt, 80),
        )
    return {"chats_without_system_turn": lacking}


def _calls_tools(turns) -> bool:
    turns = plain(turns)
    return isinstance(turns, list) and any(
        isinstance(turn, dict) and (turn.get("role") == "tool" or has_tool_calls(turn)) for turn in turns
    )


def input_chat(trained: dict, chat_training, params, column: tuple[str, str], *, messages: bool):
    """The chat format the inputs (``column``: the parameter and the column read) are rendered in
    (``predict_chats.chat_format``), said where chats are read from the column the model was trained on."""
    parameter, name = column
    chat = chat_format(
        trained["tokenizer"],
        chat_training,
        model=trained["source"],
        variables=params.chat_template_kwargs,
        parameter=parameter,
    )
    if messages and params.messages_column is None:
        log.info(
            "predict.messages_column: %r, the column the model was trained on (split.messages_column); "
            "predict.text_column or predict.prompt_column reads another",
            name,
        )
    return chat


def check_template_variables(variables, chat, chat_training, trained: dict, parameter: str) -> None:
    """Say in one warning where ``predict.chat_template_kwargs`` change nothing, as the split says of its
    own: no chat template renders the inputs, or the template of a model from elsewhere never mentions a
    name (a model trained here was checked by its split, and predict refuses other variables than its)."""
    if not variables:
        return
    if chat is None or not chat.chat_template:
        log.warning(
            "predict.chat_template_kwargs %s change nothing: the inputs (%s) are not rendered with a chat "
            "template; leave predict.chat_template_kwargs unset",
            variables,
            parameter,
        )
        return
    unread = unread_variables(trained["tokenizer"], variables) if chat_training is None else []
    if unread:
        log.warning(
            "predict.chat_template_kwargs: the chat template of %s never mentions %s, so %s nothing "
            "(misspelled, or another model family's variable?)",
            trained["source"],
            ", ".join(unread),
            "it changes" if len(unread) == 1 else "they change",
        )


def say_unused_decoding(params) -> None:
    """Say in one warning each the decoding settings (``params``, ``PredictParams``) the decoding chosen never
    reads (``DecodingParams.unused``): a temperature, top-p or top-k without ``predict.do_sample`` (vLLM and
    the OpenAI API sample at a temperature given; here the rows are decoded greedily, or by beam search), a
    length penalty without beams. They are dropped before ``generate``, so its own warning never comes."""
    sampling, beams = params.unused()
    if sampling:
        log.warning(
            "%s %s nothing: predict.do_sample is false, so each row is decoded %s and sampling settings are "
            "not read (vLLM and the OpenAI API sample at a temperature given); set predict.do_sample=true to "
            "sample with %s, or leave %s at %s",
            _listed(sampling),
            "changes" if len(sampling) == 1 else "change",
            "greedily" if params.num_beams == 1 else f"by beam search ({params.num_beams} beams)",
            "it" if len(sampling) == 1 else "them",
            "it" if len(sampling) == 1 else "them",
            _listed({"temperature": 1.0, "top_p": 1.0, "top_k": "null"}, only=sampling),
        )
    if beams:
        log.warning(
            "predict.length_penalty = %s changes nothing: it scores beam search's hypotheses and "
            "predict.num_beams is 1 (greedy); set predict.num_beams above 1 to search with it, or leave "
            "predict.length_penalty at 1.0",
            beams["length_penalty"],
        )


def _listed(values: dict, only: dict | None = None) -> str:
    """``predict.<name> = <value>`` for each of ``values`` (those named in ``only``), joined with "and"."""
    shown = [f"predict.{name} = {value}" for name, value in values.items() if only is None or name in only]
    return " and ".join([", ".join(shown[:-1]), shown[-1]] if len(shown) > 1 else shown)


def check_prompts_of_text_model(trained: dict, asks_prompts: bool) -> None:
    """Say in one warning that a model trained here on plain text (its record's ``data_format`` is null) is
    asked prompts (``asks_prompts``: the input is predict.prompt_column's): the prompt template wraps them
    and the outputs are read as responses, neither of which the model saw."""
    record = trained.get("training_data")
    if asks_prompts and record is not None and record.get("data_format") is None:
        log.warning(
            "predict.prompt_column: the model was trained on plain text (%s), not on prompts: each prompt is "
            "wrapped by a prompt template it never saw and read as a response; predict.text_column "
            "continues the texts as it was trained",
            Path(trained["source"]) / "training_data.json",
        )


def check_chats_of_other_model(trained: dict, asks_chats: bool) -> None:
    """Say in one warning that a model trained here on prompt/response pairs or plain text (its record's
    ``data_format``) is asked chats (``asks_chats``: the input is predict.messages_column's): they are
    rendered with its tokenizer's chat template, which it never trained on."""
    record = trained.get("training_data")
    if not asks_chats or record is None:
        return
    kind = (record.get("data_format") or {}).get("kind", "text")
    if kind not in ("prompt_response", "text"):
        return
    trained_on, instead = (
        ("prompt/response pairs", "predict.prompt_column asks each prompt wrapped by its training's template")
        if kind == "prompt_response"
        else ("plain text", "predict.text_column continues texts as it was trained")
    )
    log.warning(
        "predict.messages_column: the model was trained on %s (%s), never trained on chat messages: each "
        "chat is rendered with its tokenizer's chat template, a format it never saw; %s",
        trained_on,
        Path(trained["source"]) / "training_data.json",
        instead,
    )


def refuse_prompts_of_an_id_model(training: dict | None, column: str | None) -> None:
    """One line where a model trained on pre-tokenized ids (``training``: ``PredictSources.training_format``,
    kind ``pretokenized``) is asked prompts (``column``: predict.prompt_column's, None when the input is not
    prompts): a prompt template's words are no ids of its vocabulary (each is read as its EOS id, the end of a
    sample), and the outputs would be read as responses, which it never learned. Its input is ids, continued
    (predict.text_column)."""
    if column is None or (training or {}).get("kind") != "pretokenized":
        return
    source, ids_column, eos = training["source"], training.get("ids_column"), training.get("eos_id")
    raise InputDataError(
        f"predict.prompt_column {column!r}: the model was trained on pre-tokenized ids ({source}: "
        f"split.pretokenized, split.ids_column {ids_column!r}), not on prompts: a prompt template's words "
        f"are no ids of its vocabulary (each is read as its EOS id, {eos}) and its outputs are no "
        "responses; nothing was written.",
        fix=f"--params predict.text_column={column} with each row's ids separated by spaces (e.g. "
        '"3 17 5"): they are continued as the model was trained; leave predict.prompt_column and '
        "predict.prompt_template unset.",
    )


def id_vocabulary(training: dict | None, tokenizer, parameter: str) -> IdVocabulary | None:
    """The ids a model trained on pre-tokenized ids (``training``: ``PredictSources.training_format``, kind
    ``pretokenized``) is asked its inputs in (``parameter``: predict.text_column, the only one it takes):
    its training's ``split.vocab_size`` and ``split.eos_id`` (the tokenizer's, where the record has none);
    None for any other model or input."""
    if (training or {}).get("kind") != "pretokenized" or parameter != "predict.text_column":
        return None
    vocab_size, eos_id = training.get("vocab_size"), training.get("eos_id")
    return IdVocabulary(
        vocab_size=int(vocab_size if vocab_size is not None else len(tokenizer)),
        eos_id=int(eos_id if eos_id is not None else tokenizer.eos_token_id),
    )


def training_rows(trained: dict) -> tuple[int | None, str | None]:
    """The rows' length (``split.max_length``) ``trained`` (``PredictSources.load_model``'s) trained on, and
    where it was read where not in its own record: its ``training_data.json``'s, else, for a model of this
    project whose folder predates that record, the project's split fingerprint's (``project_rows``, as the
    data format is read for it; its report generates with the same); None for a model from elsewhere."""
    recorded = (trained.get("training_data") or {}).get("max_length")
    if recorded is not None:
        return recorded, None
    project = trained.get("project_rows") or {}
    return project.get("max_length"), project.get("source")


def predict_input_limit_source(model, params, trained: dict, limit: int | None) -> str | None:
    """What set ``limit`` (``predict_input_limit``'s), for the summary and the truncation warning."""
    if limit is None:
        return None
    if params.max_input_tokens is not None:
        return "predict.max_input_tokens"
    trained_length, older = training_rows(trained)
    if trained_length is not None and limit == prompt_budget(trained_length, params.max_new_tokens):
        where = f" (from {older}: the model folder predates its training_data.json)" if older else ""
        return (
            f"the model's training rows: split.max_length {trained_length}{where} beside "
            "predict.max_new_tokens"
        )
    positions = getattr(model.config, "max_position_embeddings", None)
    return f"the model's positions: {positions} beside predict.max_new_tokens"


def predict_input_limit(model, params, trained: dict) -> int:
    """The most tokens of a prompt (``input_limit``), said where it comes from the model's training rows."""
    trained_length, _ = training_rows(trained)
    limit = input_limit(
        model,
        max_new_tokens=params.max_new_tokens,
        max_input_tokens=params.max_input_tokens,
        trained_length=trained_length,
    )
    if trained_length is not None and params.max_input_tokens is None:
        longer = "keep their last tokens" if params.too_long == "truncate" else "are refused"
        log.info(
            "predict: prompts of at most %d tokens, as the model's report generates (it trained on rows of "
            "%d tokens, split.max_length); longer ones %s (predict.too_long), predict.max_input_tokens sets "
            "another limit",
            limit,
            trained_length,
            longer,
        )
    return limit


def refuse_a_tokenizer_without_eos(tokenizer, source: str) -> None:
    """One line, before the input is read as rows or anything is written, where the model's tokenizer
    (``source``: its folder) defines no EOS token: generation ends each row at it and pads a batch with it
    where there is no pad token (the split refuses such a tokenizer too: it ends every training sample)."""
    if tokenizer.eos_token_id is not None:
        return
    raise InputDataError(
        f"predict.model {source}: its tokenizer defines no EOS token (eos_token), which ends each generated "
        "row and pads a batch where there is no pad token; nothing was written.",
        fix="set eos_token in the folder's tokenizer_config.json to the token its model ends a text with "
        '(e.g. "</s>" or "<|endoftext|>"), or give predict.model a folder whose tokenizer has one.',
    )


def refuse_an_input_of_no_row(table: pd.DataFrame, path: str) -> None:
    """Refuse in one line an input ``path`` of no row (a CSV of its header only, a JSON Lines file of blank
    lines, a JSON ``[]``): no column either where nothing names one, so no other line would say why."""
    if len(table) == 0:
        raise InputDataError(
            f"{path} holds no row to ask; nothing was written.",
            fix="give predict.input a file of at least one row.",
        )


def refuse_an_input_of_no_askable_row(
    rows: pd.DataFrame,
    path: str,
    parameter: str,
    column: str,
    *,
    messages: bool,
    vocabulary: IdVocabulary | None = None,
) -> None:
    """One line, before anything is written, where no row of the input can be asked (it has none, or every
    one is refused): the file, the column, the reasons and the first row's (its id quoted and cut), and what
    to give instead (each fix of the reasons found: ``non_string``, JSON numbers where texts are asked, to be
    written as JSON strings; ``messages``: the input is chats; ``vocabulary``: ids of a model trained on
    pre-tokenized ids)."""
    if len(rows) == 0:
        raise InputDataError(
            f"{path} holds no row to ask ({parameter} {column!r}); nothing was written.",
            fix="give predict.input a file of at least one row.",
        )
    refused = rows["refused"]
    if refused.isna().any():
        return
    reasons = refused.map(lambda reason: str(reason).split(" ")[0]).value_counts().to_dict()
    fixes = []
    numbers = "non_string" in reasons and vocabulary is None  # JSON numbers (2024) where texts are asked
    if numbers and messages:
        fixes.append('write each turn\'s content as a JSON string ("2024", not 2024)')
    elif numbers:
        fixes.append(
            f'write the {column!r} values as texts: JSON strings ("2024", not 2024) in JSON or JSON Lines, '
            "a string column in Parquet"
        )
    if any(reason not in ("too_long", "non_string" if numbers else "") for reason in reasons):
        if vocabulary is not None:
            fixes.append(vocabulary.fix(parameter, column))
        elif messages:
            fixes.append(
                f"give {parameter} ({column!r}) a list of {{role, content}} turns a row, ending with a user "
                "turn"
            )
        else:
            fixes.append(f"give {parameter} ({column!r}) a non-empty text a row")
    if "too_long" in reasons:
        fixes.append(
            "raise predict.max_input_tokens or set predict.too_long=truncate (their last tokens kept)"
        )
    first = rows["id"].iloc[0]
    shown = quoted(first) if isinstance(first, str) else first
    raise InputDataError(
        f"none of the {len(rows)} rows of {path} can be asked ({parameter} {column!r}): {reasons}; "
        f"the first, row {shown}: {refused.iloc[0]}; nothing was written.",
        fix="; ".join(fixes) + ".",
    )


def check_token_ids(model, tokenizer, rows: pd.DataFrame, source: str) -> int:
    """One line, before anything is generated or written, where the rows' token ids (or the id that fills
    their padding) reach past the model's input embedding: the folder holds another model's tokenizer, and
    the lookup would stop the run with an IndexError traceback. Returns the id generation pads with: the
    tokenizer's pad token, else its EOS; its EOS too where the pad token is past the embedding and the EOS is
    not (a pad token added to the tokenizer without growing the model, ``add_special_tokens({"pad_token":
    ...})``): the padding is masked and never generated, so an id the model has fills it, said in one line."""
    pad = pad_id_of(tokenizer)
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    size = getattr(embedding, "num_embeddings", None)
    if size is None:
        return pad
    eos = tokenizer.eos_token_id
    fill = int(eos) if pad >= size and eos is not None and eos < size else pad
    asked = [max(ids) for ids in rows["ids"] if ids is not None and len(ids)]
    highest = max([*asked, fill])
    if highest >= size:
        raise InputDataError(
            f"predict.model {source}: its tokenizer ({len(tokenizer)} tokens) gives token id {highest}, past "
            f"the model's {size} embedding rows: the tokenizer is not the model's.",
            fix="give predict.model a folder holding the model with the tokenizer it was trained with.",
        )
    if fill != pad:
        log.info(
            "predict: the pad token %r of %s's tokenizer (id %d) is past the model's %d embedding rows "
            "(added to the tokenizer without growing the model): batches are padded with its EOS %r instead "
            "(padding is masked and never generated)",
            tokenizer.pad_token,
            source,
            pad,
            size,
            tokenizer.eos_token,
        )
    return fill


def _finished(summary: dict) -> str:
    """How the predicted rows ended (``finish_reasons``): at an end token, or cut by max_new_tokens."""
    reasons = summary.get("finish_reasons")
    if not reasons:
        return ""
    return (
        f"; {reasons['stop']} stopped at an end token, {reasons['length']} cut at predict.max_new_tokens "
        f"({summary['decoding_settings']['max_new_tokens']}: finish_reason length)"
    )


def say_predicted(summary: dict, path: str, model: str) -> None:
    """The run in one line: its speed where it generated rows; none where every row came from an earlier run
    (``predict_rows`` said "Nothing to generate")."""
    generated = summary.get("generated_rows", summary["predicted"])
    log.info(
        "Predicted %d of %d rows of %s with %s (%s): %s; %d refused%s",
        summary["predicted"],
        summary["rows"],
        path,
        model,
        summary["decoding"],
        f"{summary['samples_per_s'] or 0:.1f} samples/s, {summary['generated_tokens_per_s'] or 0:.0f} "
        "generated tokens/s"
        if generated
        else "every row from an earlier run",
        summary["refused"],
        _finished(summary),
    )
    calls = summary.get("tool_calls")
    if calls:
        log.info(
            "Tool calls: %d of %d rows asked with tools called a tool (%d calls, %d of a function not among "
            "the row's tools) in the `tool_calls` column",
            calls["rows_calling"],
            calls["rows_asked_with_tools"],
            calls["calls"],
            calls["calls_of_unknown_tools"],
        )
        if calls["rows_unread"]:
            named = calls["unread_rows"]
            log.warning(
                "predict: the calls of %d of %d rows asked with tools (%s%s) do not read as the template's "
                "tool calls (cut by predict.max_new_tokens, or not JSON): their tool_calls are empty, their "
                "prediction as generated",
                calls["rows_unread"],
                calls["rows_asked_with_tools"],
                ", ".join(str(row) for row in named),
                ", ..." if calls["rows_unread"] > len(named) else "",
            )


def call_reader(chat, tokenizer, rows: pd.DataFrame):
    """The reader of the template's tool calls (``corpus.call_reader.CallReader``) for chats asked with tools
    (``rows["tools"]``), rendered as ``chat`` renders them; None where no row has tools or the template
    writes no call format."""
    if chat is None or not chat.chat_template or "tools" not in rows or not rows["tools"].notna().any():
        return None
    from fastlm.corpus.call_reader import CallReader

    return CallReader.of(tokenizer, chat.variables)


def weights_dtype(model) -> str | None:
    """The dtype of ``model``'s weights (``bfloat16``, ``float32``): a bf16 folder generates in bf16 whatever
    autocast's precision says (fp32: autocast off)."""
    dtype = getattr(model, "dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else None
