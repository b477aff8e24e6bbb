"""The report's work on the test split, Kedro-free: the evaluation (loss, perplexity, accuracy, top-k, error
analysis, sample generations) and the generations scored against the references of prompt/response data.
The report pipeline's nodes validate the parameters and apply the runtime (``fastlm.pipelines.start``), then
call these; the sweep scores each run's model with them too. The engine (torch, transformers) and ROUGE are
imported when a function runs: building the pipelines, as every `kedro run` does, imports neither
(tests/test_project.py)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pandas as pd

from fastlm.errors import InputDataError
from fastlm.reporting.params import check_id_prompts, check_top_k
from fastlm.reporting.summaries import TRAINING_ID

if TYPE_CHECKING:
    import datasets

    from fastlm.corpus.config import SplitParams
    from fastlm.engine.config import TrainParams
    from fastlm.engine.runtime.environment import Runtime
    from fastlm.reporting.params import ReferenceParams, ReportParams

log = logging.getLogger(__name__)


def training_id(trained: dict) -> str | None:
    """Which training made the model of ``trained`` (``trained_model``): its outputs carry it, and the
    report refuses to mix two trainings' outputs."""
    return (trained.get("training_data") or {}).get(TRAINING_ID)


def evaluate_on_test(model, tokenizer, tokenized: datasets.DatasetDict, *, settings: tuple, options):
    """The engine's evaluation of ``model`` on the test split (``engine.evaluate.evaluation.evaluate``) with
    its ``options``: the report's and the sweep's. ``settings``: the train parameters, the split's
    max_length and the runtime applied."""
    from fastlm.engine.data.collators import TextEnds
    from fastlm.engine.data.token_dataset import TokenSequences
    from fastlm.engine.evaluate.evaluation import evaluate
    from fastlm.engine.model.attention.choice import attention_path

    params, max_length, runtime = settings
    model.to(runtime.device)
    attn = report_attention(model, params, max_length, runtime.device)
    with attention_path(model, attn):
        return evaluate(
            model,
            TokenSequences.from_arrow(tokenized["test"], text_ends=TextEnds.of(tokenizer)),
            tokenizer=tokenizer,
            params=params,
            runtime=runtime,
            max_length=max_length,
            attn=attn,
            options=options,
        )


def report_attention(model, params: TrainParams, max_length: int, device) -> str:
    """The attention path the report evaluates ``model`` on: the one it loaded with (transformers' default,
    ``sdpa`` on a CPU), except where ``train.model.attn_implementation: auto`` trains rows this long per
    document (``attention.choice.LONG_ROW_TOKENS`` on a CPU: ``sdpa_varlen``), whose dense mask would grow
    with the rows' square. Off a CPU the loaded path, and no ``auto`` choice logged that it would not run."""
    import torch

    from fastlm.engine.model.attention.choice import choose_attention
    from fastlm.engine.model.attention.kernels import SDPA_VARLEN

    current = model.config._attn_implementation or "sdpa"
    if params.model.attn_implementation != "auto" or current not in ("sdpa", "eager"):
        return current
    if torch.device(device).type != "cpu":  # auto's per-document rule is a CPU one; its choice is not asked
        return current
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a LoRA adapter's
    chosen = choose_attention(
        "auto",
        device,
        model_class=type(base),
        config=model.config,
        row_length=params.batching.longest_row(max_length),
    )
    return chosen if chosen == SDPA_VARLEN else current


def evaluate_test_split(
    trained: dict,
    tokenized: datasets.DatasetDict,
    fingerprint: dict,
    *,
    settings: tuple[TrainParams, SplitParams, Runtime],
    report: ReportParams,
    fingerprint_source: str,
) -> tuple[dict, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Test-split loss, perplexity, accuracy, top-k, error analysis and sample generations of the model of
    ``trained``: the metrics, the wrong pairs, the worst samples and the generations. ``settings``: the
    validated train and split parameters and the runtime applied; ``fingerprint_source``: the file of the
    fingerprint, named in an error."""
    from fastlm.engine.evaluate.evaluation import EvalOptions, top_k_metric
    from fastlm.engine.evaluate.generation import generate_samples
    from fastlm.reporting.predict_inputs import input_limit, sample_prompts

    params, split, runtime = settings
    model, tokenizer = trained["model"], trained["tokenizer"]
    if split.pretokenized:  # its tokenizer reads an unknown word as EOS: refused before the slow part
        check_id_prompts(report.prompts, split.vocab_size)
    if len(tokenized["test"]) == 0:
        raise InputDataError(
            "the test split is empty.", fix="raise split.ratios.test and rerun the split pipeline."
        )
    max_length = split.max_length
    check_top_k(report.top_k, model.config.get_text_config().vocab_size)
    check_reference_room(model, report.references, split)  # generate_on_references' check, before any file
    result = evaluate_on_test(
        model,
        tokenizer,
        tokenized,
        settings=(params, max_length, runtime),
        options=EvalOptions(
            analysis=True,
            max_batches=report.eval_max_batches,
            top_k=report.top_k,
            worst=report.worst_samples,
            pairs=report.error_pairs,
        ),
    )
    decodings = [setting.model_dump(exclude_none=True) for setting in report.decoding]
    samples = sample_prompts(  # as predict asks the model an input of its training's kind
        report.prompts,
        trained,
        fingerprint,
        fingerprint_source=fingerprint_source,
        limit=input_limit(
            model,
            max_new_tokens=report.max_new_tokens,
            max_input_tokens=None,
            trained_length=max_length,
            parameter="report.max_new_tokens",
        ),
    )
    generations = generate_samples(
        model,
        tokenizer,
        report.prompts,
        settings=decodings,
        max_new_tokens=report.max_new_tokens,
        runtime=runtime,
        prompt_ids=samples.ids,
        continuation=samples.continuation,
    )
    log.info(
        "Test split: loss %.4f, perplexity %.2f, accuracy %.3f, top-%d %.3f (%.0f real tokens/s)",
        result.metrics["loss"],
        result.metrics["perplexity"],
        result.metrics["accuracy"],
        report.top_k,
        result.metrics[top_k_metric(report.top_k)],
        result.metrics["real_tokens_per_s"],
    )
    metrics = {**result.metrics, TRAINING_ID: training_id(trained)}  # which training made the model
    if report.eval_max_batches is not None:  # the report says how many of the split's samples it counted
        metrics["test_split_samples"] = len(tokenized["test"])
        metrics["eval_max_batches"] = report.eval_max_batches
    return metrics, result.wrong_pairs, result.worst_samples, generations


def check_reference_room(model, references: ReferenceParams, split: SplitParams) -> None:
    """One line where ``report.references.max_new_tokens`` leaves no room in the model's positions (a
    decoder-only model's prompt beside it; an encoder-decoder's decoder rows) on data the report generates
    on references of (prompt/response, chats; not ``enabled: false``): the check ``generate_on_references``
    makes, made by the report's first node too, before it evaluates and writes its files; and where
    ``enabled: true`` asks for references of data that has none (plain text, pre-tokenized ids:
    ``pairs_to_score``'s refusal)."""
    paired = split.data_format in ("prompt_response", "messages")
    if references.enabled is True and not paired:
        what = "plain text" if split.data_format == "text" else "pre-tokenized ids"
        raise InputDataError(
            f"report.references.enabled is true but the data is {what}: its splits have no prompt/response "
            "columns to generate on and score.",
            fix="split prompt/response data (split.prompt_column and split.response_column) or set "
            "report.references.enabled: auto.",
        )
    if references.enabled is False or not paired:
        return
    from fastlm.reporting.predict_inputs import input_limit

    input_limit(
        model,
        max_new_tokens=references.max_new_tokens,
        max_input_tokens=None,
        trained_length=split.max_length,
        parameter="report.references.max_new_tokens",
    )


def no_reference_predictions() -> pd.DataFrame:
    """The reference predictions of data that has none: the table's columns, no row."""
    from fastlm.reporting.references import PREDICTION_COLUMNS

    return pd.DataFrame(columns=PREDICTION_COLUMNS)


def pairs_to_score(splits: pd.DataFrame, references: ReferenceParams, source: str) -> pd.DataFrame | None:
    """The test split's prompt/response pairs of ``splits`` (``corpus_splits``, the file ``source``) that
    ``report.references`` scores, capped at its ``max_samples``; None (said in one line) for plain-text data
    under ``enabled: auto`` or for ``enabled: false``. Refused in one line: ``enabled: true`` on data without
    prompt/response columns, and an empty test split."""
    from fastlm.reporting.references import has_references, reference_pairs

    found = has_references(splits)
    if references.enabled is True and not found:
        raise InputDataError(
            f"report.references.enabled is true but {source} has no prompt/response "
            f"columns (it has {list(map(str, splits.columns))}).",
            fix="split prompt/response data (split.prompt_column and split.response_column) or set "
            "report.references.enabled: auto.",
        )
    if references.enabled is False or not found:
        log.info(
            "No generation against references: %s",
            "report.references.enabled is false" if found else "the data has no prompt/response columns",
        )
        return None
    pairs = reference_pairs(splits, references.max_samples)
    if pairs.empty:
        raise InputDataError(
            f"the test split of {source} is empty.",
            fix="raise split.ratios.test and rerun the split pipeline.",
        )
    return pairs


def score_reference_pairs(
    trained: dict,
    pairs: pd.DataFrame,
    *,
    references: ReferenceParams,
    split: SplitParams,
    runtime: Runtime,
) -> tuple[pd.DataFrame, dict]:
    """The model of ``trained`` generates on ``pairs`` (``pairs_to_score``), on ``runtime``'s device, within
    ``split.max_length`` (chat data: with ``split.chat_template_kwargs``): the predictions and their ROUGE
    (and tool-call scores where the answers call tools), said in a line or two, the metrics marked with the
    training that made the model."""
    from fastlm.reporting.references import score_test_generations
    from fastlm.reporting.rouge import tokenless_note

    model = trained["model"].to(runtime.device)
    table, metrics = score_test_generations(
        model,
        trained["tokenizer"],
        pairs,
        references=references,
        runtime=runtime,
        max_length=split.max_length,
        chat_variables=split.chat_template_kwargs if split.data_format == "messages" else None,
    )
    log.info(
        "ROUGE on %d test samples%s (%s; %s tokenizer): ROUGE-1 %.4f, ROUGE-2 %.4f, ROUGE-L %.4f "
        "(%.1f s, %.0f generated tokens/s)",
        metrics["rouge_samples"],
        f" of {metrics['rouge_test_samples']} (report.references.max_samples)"
        if "rouge_test_samples" in metrics
        else "",
        metrics["rouge_decoding"],
        metrics["rouge_tokenizer"],
        metrics["rouge1"],
        metrics["rouge2"],
        metrics["rougeL"],
        metrics["generation_seconds"],
        metrics["generated_tokens_per_s"],
    )
    if metrics.get("rouge_tokenless_references"):
        log.warning("ROUGE: %s", tokenless_note(metrics))
    if "tool_call_samples" in metrics:
        log.info(
            "Tool calls on the %d test samples answered by a call: the same functions in %.1f%%, the same "
            "calls in %.1f%% (call_match in reference_predictions.csv)",
            metrics["tool_call_samples"],
            100 * metrics["tool_call_name_accuracy"],
            100 * metrics["tool_call_exact_match"],
        )
        if metrics.get("tool_call_unread_at_limit"):
            log.warning(
                "%d of the %d test answers that call a tool stopped at report.references.max_new_tokens = %d "
                "before their call ended: they read as no call and count as misses; raise "
                "report.references.max_new_tokens to score whole calls",
                metrics["tool_call_unread_at_limit"],
                metrics["tool_call_samples"],
                references.max_new_tokens,
            )
    return table, {**metrics, TRAINING_ID: training_id(trained)}
