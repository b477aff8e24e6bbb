"""The node of the predict pipeline: validate ``params:predict``, read the input and the model through
``predict_sources``, generate with ``fastlm.reporting.predictions`` (imported when the node runs, with the
engine: building the pipelines, as every `kedro run` does, imports no torch)."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pandas as pd

from fastlm.errors import InputDataError
from fastlm.parameters import parse_group
from fastlm.pipelines.predict.params import MESSAGES, PROMPTS

log = logging.getLogger(__name__)


def predict_file(sources, predict_params: dict, train_params: dict) -> tuple[pd.DataFrame, dict]:
    """One prediction per input row, in input order (refused rows kept with their reason), and the summary.
    The device and precision are ``train.runtime``'s (auto: bf16 on GPUs that have it, fp32 on CPU). Chat
    messages are rendered as the model's training data was (its fingerprint), for a model trained here."""
    from fastlm.datasets.predict_sources import one_input_a_line
    from fastlm.reporting.predictions import (
        PredictionJob,
        chat_format,
        input_limit,
        input_rows,
        predict_rows,
    )

    params = parse_group("predict", predict_params)
    path = params.require_input()
    table = sources.read_input(path)
    trained = sources.load_model(params.model)
    training = sources.training_format(trained)
    chat_training = training if training is not None and training.get("kind") == "messages" else None
    parameter, column = params.input_column(
        training, [str(name) for name in table.columns], lines=one_input_a_line(path), source=path
    )
    # a chat model asked prompts: each one user turn in its chat format, as the report asks its prompts (an
    # explicit predict.prompt_template wraps them instead)
    user_turn = parameter == PROMPTS and chat_training is not None and params.prompt_template is None
    template, template_source = params.template(training, parameter) if not user_turn else (None, "")
    chat = None
    if parameter == MESSAGES or user_turn:
        chat = chat_format(
            trained["tokenizer"],
            chat_training,
            model=trained["source"],
            variables=params.chat_template_kwargs,
            parameter=parameter,
        )
        if parameter == MESSAGES and params.messages_column is None:
            log.info(
                "predict.messages_column: %r, the column the model was trained on (split.messages_column); "
                "predict.text_column or predict.prompt_column reads another",
                column,
            )
    _check_template_variables(params.chat_template_kwargs, chat, chat_training, trained, parameter)
    _check_prompts_of_text_model(trained, parameter)
    from fastlm.engine.runtime.environment import setup_runtime  # imports torch: after the checks above

    runtime = setup_runtime(parse_group("train", train_params).runtime, seed=params.seed)
    model, tokenizer = trained["model"].to(runtime.device), trained["tokenizer"]
    trained_length = (trained.get("training_data") or {}).get("max_length")
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
    rows = input_rows(
        table,
        tokenizer,
        column=(parameter, column),
        template=template,
        id_column=params.id_column,
        limit=limit,
        too_long=params.too_long,
        source=path,
        chat=replace(chat, user_turn=True) if user_turn else chat,
    )
    _refuse_an_input_of_no_askable_row(rows, path, parameter, column)
    job = PredictionJob(
        decoding=params.decoding(),
        max_new_tokens=params.max_new_tokens,
        batch_size=params.batch_size,
        seed=params.seed,
        continuation=parameter == "predict.text_column",  # plain text, continued: kept as decoded
        extra={
            "input": path,
            "input_column": column,
            "input_format": parameter.removeprefix("predict.").removesuffix("_column"),
            **(_chat_record(chat, trained["tokenizer"], user_turn) if chat is not None else {}),
            **({"prompt_template": template, "prompt_template_source": template_source} if template else {}),
            "model": trained["source"],
            "device": str(runtime.device),
            "precision": runtime.precision,
            "input_limit": limit,
        },
    )
    predictions, summary = predict_rows(
        model,
        tokenizer,
        rows,
        job,
        runtime=runtime,
        parts=sources.parts if params.resume else None,
        model_identity=trained["identity"],
    )
    log.info(
        "Predicted %d of %d rows of %s with %s (%s): %.1f samples/s, %.0f generated tokens/s; %d refused",
        summary["predicted"],
        summary["rows"],
        path,
        trained["source"],
        summary["decoding"],
        summary["samples_per_s"] or 0,
        summary["generated_tokens_per_s"] or 0,
        summary["refused"],
    )
    return predictions, summary


def _chat_record(chat, tokenizer, user_turn: bool) -> dict:
    """How the messages were rendered, for the summary: texts asked as user turns name the system turn put
    before each (every training chat's), said once in the log too."""
    from fastlm.reporting.predictions import chat_template_sha256

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


def _check_template_variables(variables, chat, chat_training, trained: dict, parameter: str) -> None:
    """Say in one warning where ``predict.chat_template_kwargs`` change nothing, as the split says of its
    own: no chat template renders the inputs, or the template of a model from elsewhere never mentions a
    name (a model trained here was checked by its split, and predict refuses other variables than its)."""
    from fastlm.corpus.chat_template import unread_variables

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


def _check_prompts_of_text_model(trained: dict, parameter: str) -> None:
    """Say in one warning that a model trained here on plain text (its record's ``data_format`` is null) is
    asked prompts: the prompt template wraps them and the outputs are read as responses, neither of which
    the model saw."""
    record = trained.get("training_data")
    if parameter == PROMPTS and record is not None and record.get("data_format") is None:
        log.warning(
            "predict.prompt_column: the model was trained on plain text (%s), not on prompts: each prompt is "
            "wrapped by a prompt template it never saw and read as a response; predict.text_column "
            "continues the texts as it was trained",
            Path(trained["source"]) / "training_data.json",
        )


def _refuse_an_input_of_no_askable_row(rows: pd.DataFrame, path: str, parameter: str, column: str) -> None:
    """One line, before anything is written, where no row of the input can be asked (it has none, or every
    one is refused): the file, the column, the reasons and the first row's (its id quoted and cut), and what
    to give instead (each fix of the reasons found)."""
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
    if any(reason != "too_long" for reason in reasons):
        if parameter == MESSAGES:
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
    from fastlm.corpus.prompts import quoted

    first = rows["id"].iloc[0]
    shown = quoted(first) if isinstance(first, str) else first
    raise InputDataError(
        f"none of the {len(rows)} rows of {path} can be asked ({parameter} {column!r}): {reasons}; "
        f"the first, row {shown}: {refused.iloc[0]}; nothing was written.",
        fix="; ".join(fixes) + ".",
    )
