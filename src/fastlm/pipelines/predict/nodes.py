"""The node of the predict pipeline: validate ``params:predict``, read the input and the model through
``predict_sources``, generate with ``fastlm.reporting.predictions``."""

from __future__ import annotations

import logging

import pandas as pd

from fastlm.parameters import parse_group
from fastlm.reporting.predictions import PredictionJob, input_limit, input_rows, predict_rows

log = logging.getLogger(__name__)


def predict_file(sources, predict_params: dict, train_params: dict) -> tuple[pd.DataFrame, dict]:
    """One prediction per input row, in input order (refused rows kept with their reason), and the summary.
    The device and precision are ``train.runtime``'s (auto: bf16 on GPUs that have it, fp32 on CPU)."""
    params = parse_group("predict", predict_params)
    path = params.require_input()
    table = sources.read_input(path)
    trained = sources.load_model(params.model)
    from fastlm.engine.runtime.environment import setup_runtime  # imports torch: after the checks above

    runtime = setup_runtime(parse_group("train", train_params).runtime, seed=params.seed)
    model, tokenizer = trained["model"].to(runtime.device), trained["tokenizer"]
    limit = input_limit(model, max_new_tokens=params.max_new_tokens, max_input_tokens=params.max_input_tokens)
    rows = input_rows(
        table,
        tokenizer,
        column=params.column,
        template=params.template,
        id_column=params.id_column,
        limit=limit,
        too_long=params.too_long,
        source=path,
    )
    job = PredictionJob(
        decoding=params.decoding(),
        max_new_tokens=params.max_new_tokens,
        batch_size=params.batch_size,
        seed=params.seed,
        extra={
            "input": path,
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
