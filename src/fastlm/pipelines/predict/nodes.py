"""The node of the predict pipeline: validate ``params:predict``, read the input and the model through
``predict_sources``, check, read the rows and generate with ``fastlm.reporting.predict_steps``,
``predict_inputs`` and ``predictions`` (imported when the node runs, with the engine: building the pipelines,
as every `kedro run` does, imports no torch)."""

from __future__ import annotations

import logging
from dataclasses import replace

import pandas as pd

from fastlm.parameters import parse_group
from fastlm.pipelines.predict.params import MESSAGES, PROMPTS

log = logging.getLogger(__name__)


def predict_file(sources, predict_params: dict, train_params: dict) -> tuple[pd.DataFrame, dict]:
    """One prediction per input row, in input order (refused rows kept with their reason), and the summary.
    The device and precision are ``train.runtime``'s (auto: bf16 on GPUs that have it, fp32 on CPU). Chat
    messages are rendered as the model's training data was (its fingerprint), for a model trained here."""
    from fastlm.datasets.predict_sources import one_input_a_line
    from fastlm.reporting import predict_steps as steps
    from fastlm.reporting.predict_inputs import id_input_rows, input_rows
    from fastlm.reporting.predictions import PredictionJob, predict_rows

    params = parse_group("predict", predict_params)
    path = params.require_input()
    table = sources.read_input(path, id_column=params.id_column)
    steps.refuse_an_input_of_no_row(table, path)  # before any column is looked for, or the model loaded
    trained = sources.load_model(params.model)
    steps.refuse_a_tokenizer_without_eos(trained["tokenizer"], trained["source"])
    training = sources.training_format(trained)
    chat_training = training if training is not None and training.get("kind") == "messages" else None
    parameter, column = params.input_column(
        training, [str(name) for name in table.columns], lines=one_input_a_line(path), source=path
    )
    if parameter != MESSAGES:  # a CSV's prompts and texts are text, numbers too ("2024", "007")
        table = sources.text_as_written(table, column)
    steps.refuse_prompts_of_an_id_model(training, column if parameter == PROMPTS else None)
    # a chat model asked prompts: each one user turn in its chat format, as the report asks its prompts (an
    # explicit predict.prompt_template wraps them instead)
    user_turn = parameter == PROMPTS and chat_training is not None and params.prompt_template is None
    template, template_source = params.template(training, parameter) if not user_turn else (None, "")
    chat = None
    if parameter == MESSAGES or user_turn:
        chat = steps.input_chat(
            trained, chat_training, params, (parameter, column), messages=parameter == MESSAGES
        )
    steps.check_template_variables(params.chat_template_kwargs, chat, chat_training, trained, parameter)
    steps.check_prompts_of_text_model(trained, parameter == PROMPTS)
    steps.check_chats_of_other_model(trained, parameter == MESSAGES)
    steps.say_unused_decoding(params)
    from fastlm.engine.runtime.environment import setup_runtime  # imports torch: after the checks above

    runtime = setup_runtime(parse_group("train", train_params).runtime, seed=params.seed)
    model, tokenizer = trained["model"].to(runtime.device), trained["tokenizer"]
    limit = steps.predict_input_limit(model, params, trained)
    read = {"id_column": params.id_column, "limit": limit, "too_long": params.too_long, "source": path}
    vocabulary = steps.id_vocabulary(training, tokenizer, parameter)  # a model trained on ids: checked ids
    if vocabulary is not None:
        rows = id_input_rows(table, column=(parameter, column), vocabulary=vocabulary, **read)
    else:
        asked = replace(chat, user_turn=True) if user_turn else chat
        rows = input_rows(table, tokenizer, column=(parameter, column), template=template, chat=asked, **read)
    steps.refuse_an_input_of_no_askable_row(
        rows, path, parameter, column, messages=parameter == MESSAGES, vocabulary=vocabulary
    )
    pad_id = steps.check_token_ids(model, tokenizer, rows, trained["source"])  # the id padding is filled with
    job = PredictionJob(
        decoding=params.decoding(),
        max_new_tokens=params.max_new_tokens,
        batch_size=params.batch_size,
        seed=params.seed,
        pad_id=pad_id,
        continuation=parameter == "predict.text_column",  # plain text, continued: kept as decoded
        ids_rows=vocabulary is not None,  # ids continued: the new ids alone, as the input shows its ids
        calls=steps.call_reader(chat, tokenizer, rows),  # chats asked with tools: their calls read
        extra={
            "input": path,
            "input_column": column,
            # what each row was read as: token ids for a model trained on pre-tokenized ids
            "input_format": "ids"
            if vocabulary is not None
            else parameter.removeprefix("predict.").removesuffix("_column"),
            **(steps.chat_record(chat, trained["tokenizer"], user_turn) if chat is not None else {}),
            **(
                steps.tools_record(table, chat, column, rows["refused"].isna())
                if parameter == MESSAGES
                else {}
            ),
            **(
                steps.system_turn_record(table, chat, column, asked=rows["refused"].isna())
                if parameter == MESSAGES
                else {}
            ),
            **({"prompt_template": template, "prompt_template_source": template_source} if template else {}),
            "model": trained["source"],
            **trained.get("training", {}),  # which training made it: the folder is replaced by each one
            "device": str(runtime.device),
            "precision": runtime.precision,  # autocast's
            "weights_dtype": steps.weights_dtype(model),  # what the weights compute in where autocast is off
            "input_limit": limit,
            "input_limit_source": steps.predict_input_limit_source(model, params, trained, limit),
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
    steps.say_predicted(summary, path, trained["source"])
    return predictions, summary
