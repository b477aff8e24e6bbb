"""Generation on the test split of prompt/response data, scored with ROUGE against the reference responses.

* Which samples: the test rows of ``corpus_splits``, capped at ``max_samples`` by a keyed hash of the pair
  (``fastlm.corpus.splitting``: the same subset whatever the row order, the same for every run on the data),
  kept in corpus order.
* What the model sees: ``prompt_token_ids`` (the ids the prompt was trained with, template and BOS
  included), cut as training cuts prompts (``truncate_prompt_ids``: the last tokens, a leading BOS kept) to
  ``max(budget - max_new_tokens, budget // 2)`` tokens, ``budget = max_length - 1``: prompt and generation
  fit in the trained length, and no prompt is cut shorter than training ever cut it; within what the model's
  positions leave beside ``max_new_tokens`` (``input_limit``, which predict cuts its inputs by too).
* What is scored: the generated text after the prompt, stopped at EOS, special tokens skipped, line ends LF
  as the split makes them, without a leading empty think block (``generation.response_text``), against the
  ``response`` column (``fastlm.reporting.rouge``).
"""

from __future__ import annotations

import logging

import pandas as pd

from fastlm.corpus.prompts import leading_bos, prompt_token_ids, truncate_prompt_ids
from fastlm.corpus.splitting import cap_rows, text_keys
from fastlm.engine.data.collators import pad_id_of
from fastlm.engine.evaluate.generation import (
    clean_response,
    decoding_kwargs,
    encoder_inputs,
    forced_end,
    generate_continuations,
    is_encoder_decoder,
    kept_model_rules,
    response_text,
)
from fastlm.engine.runtime.environment import Runtime
from fastlm.errors import ConfigError
from fastlm.reporting.params import ReferenceParams
from fastlm.reporting.rouge import rouge_scores, score_columns

__all__ = [
    "PREDICTION_COLUMNS",
    "describe_decoding",
    "generation_prompts",
    "has_references",
    "input_limit",
    "prompt_budget",
    "score_test_generations",
    "reference_pairs",
    "tool_call_scores",
]

log = logging.getLogger(__name__)
PAIR_COLUMNS = ("prompt", "response")
PREDICTION_COLUMNS = [
    "sample",
    "prompt",
    "reference",
    "prediction",
    "prompt_tokens",
    "new_tokens",
    *score_columns(),
]
_PAIR_SEPARATOR = "\x00"
TEST_PAIRS = "test_pairs"  # the attrs key of reference_pairs' frame: the test split's pairs, capped or not


def has_references(splits: pd.DataFrame) -> bool:
    """Prompt/response data (``prompt`` and ``response`` columns), as opposed to plain text."""
    return all(column in splits.columns for column in PAIR_COLUMNS)


def reference_pairs(splits: pd.DataFrame, max_samples: int | None) -> pd.DataFrame:
    """The test rows (``sample`` = position among the test rows, ``prompt``, ``response``), hash-capped; the
    test split's pair count in ``attrs[TEST_PAIRS]`` (what a capped scoring is a part of)."""
    test = splits.loc[splits["split"].astype(str) == "test", list(PAIR_COLUMNS)].reset_index(drop=True)
    keys = text_keys((test["prompt"] + _PAIR_SEPARATOR + test["response"]).tolist())
    keep = cap_rows(keys[:, 1], max_samples) if len(test) else []
    pairs = test.iloc[keep].rename_axis("sample").reset_index()
    pairs.attrs[TEST_PAIRS] = len(test)
    return pairs


def describe_decoding(settings: dict, max_new_tokens: int) -> str:
    """``{"num_beams": 1, "do_sample": False, ...}`` -> ``"greedy, max_new_tokens=64"`` (only what is on)."""
    kwargs = decoding_kwargs(**settings)
    mode = (
        "sampling" if kwargs.pop("do_sample") else ("greedy" if kwargs["num_beams"] == 1 else "beam search")
    )
    if kwargs["num_beams"] == 1:
        kwargs.pop("num_beams")
    return ", ".join(
        [mode, *(f"{key}={value}" for key, value in kwargs.items()), f"max_new_tokens={max_new_tokens}"]
    )


def prompt_budget(max_length: int, max_new_tokens: int) -> int:
    """The most prompt tokens a generation of a model trained at ``max_length`` gets: what its rows left
    beside ``max_new_tokens`` (EOS kept), at least half of a row."""
    budget = max_length - 1
    return max(budget - max_new_tokens, budget // 2, 1)


def input_limit(
    model,
    *,
    max_new_tokens: int,
    max_input_tokens: int | None,
    trained_length: int | None = None,
    parameter: str = "predict.max_new_tokens",
) -> int | None:
    """The most prompt tokens a row may have: ``max_input_tokens`` when set (refused in one line where it
    reaches past the model's positions, as below); else, for a model trained here
    at ``trained_length`` tokens a row (its ``training_data.json``), the prompt its report's reference
    generations give it (``references.prompt_budget``: what its training rows left beside the new tokens);
    within what the model's positions leave (decoder-only: prompt and generation share them); else no limit
    (relative positions, as T5). ``parameter``: what set ``max_new_tokens``, named in the refusal."""
    positions = getattr(model.config, "max_position_embeddings", None)
    # an encoder-decoder model's input gets the tokenizer's end (``generation.encoder_inputs``) too
    room = None
    if positions is not None:
        room = positions - 1 if is_encoder_decoder(model) else positions - max_new_tokens
        if is_encoder_decoder(model):
            _check_decoder_positions(model, max_new_tokens, positions, parameter)
    if max_input_tokens is not None:
        if room is not None and max_input_tokens > room:  # past the model's last position
            _refuse_input_tokens(max_input_tokens, max_new_tokens, positions, is_encoder_decoder(model))
        return max_input_tokens
    trained = None if trained_length is None else prompt_budget(trained_length, max_new_tokens)
    if positions is None:
        return trained
    limit = room
    if limit < 1:
        raise ConfigError(
            f"{parameter} = {max_new_tokens} leaves no room for an input in the model's "
            f"{positions} positions.",
            fix=f"lower {parameter} below {positions}.",
        )
    return limit if trained is None else min(limit, trained)


def _check_decoder_positions(model, max_new_tokens: int, positions: int, parameter: str) -> None:
    """One line where an encoder-decoder's decoder row would run past the model's positions: the decoder is
    fed its start token, a forced BOS (``generation.continuation_start``) and every new token but the last
    generated one (never fed back), so ``max_new_tokens`` plus a forced BOS must fit, and plus one where the
    model forces its EOS after them (``generation.forced_end``: every new token is then fed back); one more
    stopped the run with an IndexError from the position embedding once a row did not end sooner."""
    forced = getattr(getattr(model, "generation_config", None), "forced_bos_token_id", None) is not None
    end = forced_end(model)
    need = forced + max_new_tokens + end
    if need <= positions:
        return
    what = "the decoder start token" + (" and a forced BOS" if forced else "")
    fed = (
        "(every new token is fed back before the forced EOS after them)"
        if end
        else "(all but the last new token are fed back)"
    )
    raise ConfigError(
        f"{parameter} = {max_new_tokens} and {what} need {need} decoder positions {fed}; the model has "
        f"{positions} positions.",
        fix=f"lower {parameter} to at most {positions - forced - end}.",
    )


def _refuse_input_tokens(max_input_tokens: int, max_new_tokens: int, positions: int, encoder: bool) -> None:
    """One line where ``predict.max_input_tokens`` lets a prompt run past the model's positions (a
    decoder-only model's prompt and generation share them; an encoder's input gets the tokenizer's end)."""
    if encoder:
        raise ConfigError(
            f"predict.max_input_tokens = {max_input_tokens} and the tokenizer's end need "
            f"{max_input_tokens + 1} positions; the model's encoder has {positions}.",
            fix=f"set predict.max_input_tokens to at most {positions - 1}, or leave it null (what the "
            "model's positions leave).",
        )
    need = max_input_tokens + max_new_tokens
    fix = (
        f"set predict.max_input_tokens to at most {positions - max_new_tokens} (or lower "
        "predict.max_new_tokens), or leave it null (what the model's positions leave)."
        if positions > max_new_tokens
        else f"lower predict.max_new_tokens below {positions}."
    )
    raise ConfigError(
        f"predict.max_input_tokens = {max_input_tokens} and predict.max_new_tokens = {max_new_tokens} need "
        f"{need} positions; the model has {positions}: a prompt that long would be generated past its last "
        "position.",
        fix=fix,
    )


def generation_prompts(tokenizer, prompts, *, model, max_length: int, max_new_tokens: int) -> list[list[int]]:
    """Each prompt's ids as the reference generations give them, as predict gives the same prompt: its last
    ``input_limit`` tokens after its leading BOS (``prompt_budget`` of the trained length, within what the
    model's positions leave beside ``max_new_tokens``)."""
    keep = input_limit(
        model,
        max_new_tokens=max_new_tokens,
        max_input_tokens=None,
        trained_length=max_length,
        parameter="report.references.max_new_tokens",
    )
    bos = leading_bos(tokenizer)
    ids = [prompt_token_ids(tokenizer, prompt) for prompt in prompts]
    return ids if keep is None else [truncate_prompt_ids(prompt, keep, bos) for prompt in ids]


def score_test_generations(
    model,
    tokenizer,
    pairs: pd.DataFrame,
    *,
    references: ReferenceParams,
    max_length: int,
    runtime: Runtime,
    chat_variables: dict | None = None,
) -> tuple[pd.DataFrame, dict]:
    """Per-sample predictions and scores (``PREDICTION_COLUMNS``) and the aggregate metrics.

    ``references``: the validated ``report.references`` group (decoding settings, ``max_new_tokens``,
    ``batch_size``, ``seed``, ``rouge_tokenizer``), passed whole because its settings travel together. The
    aggregate has ``rouge1``/``rouge2``/``rougeL`` (mean F1), their ``_precision``/``_recall``, and
    ``rouge_samples``, ``rouge_tokenizer``, ``rouge_decoding``, ``generation_seconds``,
    ``generated_tokens_per_s``, ``rouge_test_samples`` (the test split's pairs, where ``pairs`` are a
    ``max_samples`` part of them: ``reference_pairs``), and ``rouge_model_token_rules`` where the model's
    generation_config has forced or banned tokens generation keeps (``generation.kept_model_rules``).

    ``chat_variables``: chat data's template variables (None: not chat data). Where some reference answers
    call tools (in the template's call format, ``corpus.call_reader``), the predictions keep the call markup
    and the calls are compared (``tool_call_scores``).
    """
    settings, max_new_tokens = references.decoding(), references.max_new_tokens
    prompt_ids = generation_prompts(
        tokenizer, pairs["prompt"], model=model, max_length=max_length, max_new_tokens=max_new_tokens
    )
    start_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    fed = encoder_inputs(model, prompt_ids, tokenizer)  # as the model is fed them: prompt_tokens counts these
    generations = generate_continuations(
        model,
        fed,
        pad_id=pad_id_of(tokenizer),
        eos_id=tokenizer.eos_token_id,
        runtime=runtime,
        batch_size=references.batch_size,
        max_new_tokens=max_new_tokens,
        seed=references.seed,
        start_id=start_id,
        **decoding_kwargs(**settings),
    )
    reader = call_reader(tokenizer, chat_variables, pairs["response"])
    predictions = [
        clean_response(reader.text(ids, tokenizer)) if reader else response_text(ids, tokenizer)
        for ids in generations.continuations
    ]
    per_sample, aggregate, kind = rouge_scores(
        predictions, pairs["response"].tolist(), references.rouge_tokenizer
    )
    table = pd.concat(
        [
            pd.DataFrame(
                {
                    "sample": pairs["sample"].to_numpy(),
                    "prompt": pairs["prompt"].to_numpy(),
                    "reference": pairs["response"].to_numpy(),
                    "prediction": predictions,
                    "prompt_tokens": [len(ids) for ids in fed],
                    "new_tokens": [len(ids) for ids in generations.continuations],
                }
            ),
            per_sample,
        ],
        axis=1,
    )
    seconds = generations.seconds
    aggregate.update(
        rouge_samples=len(table),
        rouge_tokenizer=kind,
        rouge_decoding=describe_decoding(settings, max_new_tokens),
        generation_seconds=seconds,
        generated_tokens_per_s=generations.new_tokens / seconds if seconds > 0 else float("nan"),
    )
    test_pairs = pairs.attrs.get(TEST_PAIRS)
    if isinstance(test_pairs, int) and test_pairs > len(table):  # report.references.max_samples' part
        aggregate["rouge_test_samples"] = test_pairs
    rules = kept_model_rules(model)  # the model folder's forced and banned tokens, kept at generation
    if rules:
        aggregate["rouge_model_token_rules"] = rules
    if reader is None:
        return table[PREDICTION_COLUMNS], aggregate
    matches, scores = tool_call_scores(reader, pairs["response"].tolist(), predictions)
    # an answer cut by the generation budget before its call's end reads as no call: counted, said
    scores["tool_call_unread_at_limit"] = sum(
        match == "unread" and len(ids) >= max_new_tokens
        for match, ids in zip(matches, generations.continuations, strict=True)
    )
    return table[PREDICTION_COLUMNS].assign(call_match=matches), {**aggregate, **scores}


def call_reader(tokenizer, chat_variables: dict | None, references: pd.Series):
    """The template's call format (``CallReader``) where chat data's references hold calls; else None."""
    if chat_variables is None:
        return None
    from fastlm.corpus.call_reader import CallReader

    reader = CallReader.of(tokenizer, chat_variables)
    return reader if reader is not None and any(reader.calls_in(text) for text in references) else None


def tool_call_scores(reader, references: list[str], predictions: list[str]) -> tuple[list[str], dict]:
    """Each sample's ``call_match``: ``exact`` (the reference's calls, arguments compared as JSON),
    ``name`` (its functions, in order, other arguments), ``wrong`` (other functions, or none), ``unread``
    (call markup that does not read as calls), ``spurious`` (a call where the reference answers in text),
    "" (text for text); and the rates over the samples whose reference calls (``tool_call_samples``,
    ``tool_call_name_accuracy``, ``tool_call_exact_match``; ``tool_call_unread`` counts those whose
    prediction does not read as calls, misses in both rates) and over those whose reference does not
    (``tool_call_spurious``)."""
    expected_calls = [reader.calls_in(reference) for reference in references]
    matches = []
    for expected, prediction in zip(expected_calls, predictions, strict=True):
        found = reader.calls_in(prediction)
        if not expected:
            matches.append("spurious" if found is None or found else "")
        elif found is None:
            matches.append("unread")
        elif found == expected:
            matches.append("exact")
        else:
            same = [call["name"] for call in found] == [call["name"] for call in expected]
            matches.append("name" if same else "wrong")
    calling = [match for match, expected in zip(matches, expected_calls, strict=True) if expected]
    text = len(matches) - len(calling)
    return matches, {
        "tool_call_samples": len(calling),
        "tool_call_name_accuracy": sum(m in ("exact", "name") for m in calling) / len(calling),
        "tool_call_exact_match": calling.count("exact") / len(calling),
        "tool_call_spurious": matches.count("spurious") / text if text else float("nan"),
        "tool_call_unread": calling.count("unread"),
    }
