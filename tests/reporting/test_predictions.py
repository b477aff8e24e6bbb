"""Inputs and outputs of ``fastlm.reporting.predictions`` without a model: chat messages become the very
prompt training built from them (chat template or ``role: content`` lines), the template is checked against
the fingerprint, and a predictions CSV is told from one its summary was not written for."""

import hashlib
import json

import pandas as pd
import pytest
import torch
import yaml

from fastlm.corpus.config import parse_split_params
from fastlm.corpus.fingerprint import data_format_params
from fastlm.corpus.prompts import prompt_frame, prompt_token_ids
from fastlm.datasets.atomic_file import AtomicCSVDataset
from fastlm.datasets.predict_sources import PredictSources
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from fastlm.errors import InputDataError, StaleDataError
from fastlm.reporting.predict_chats import ChatFormat, chat_format
from fastlm.reporting.predictions import (
    PredictionJob,
    PredictionParts,
    check_prediction_pair,
    predict_rows,
    prediction_digest,
)
from tests.support.project import PROJECT_ROOT, catalog_dataset
from tests.support.renames import killed_at_first_rename
from tests.support.reporting import chat_rows, text_rows
from tests.support.tiny_llama import CHAT_TEMPLATE, line_end_llama, llama_style_tokenizer, scripted_llama

CHATS = [
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Can I book a table?"},
        {"role": "assistant", "content": "For how many?"},
        {"role": "user", "content": "배송 문의 드립니다"},
        {"role": "assistant", "content": "Two"},
    ],
    [{"role": "user", "content": " The battery died again. "}, {"role": "assistant", "content": "Sorry."}],
]


@pytest.fixture(scope="module")
def tokenizer():
    texts = [m["content"] for chat in CHATS for m in chat] * 20
    return llama_style_tokenizer(texts, vocab_size=300, chat_template=True)


def _cpu(precision: str):
    return setup_runtime(RuntimeConfig(device="cpu", precision=precision, num_threads=1))


@pytest.mark.parametrize("with_template", [True, False], ids=["chat_template", "role_content_lines"])
def test_chat_inputs_get_the_prompt_ids_training_gave_the_same_chats(tokenizer, tmp_path, with_template):
    split = parse_split_params({"messages_column": "messages", "chat_template": with_template})
    trained = {**data_format_params(split, tokenizer), "source": "fingerprint.json"}
    training, _ = prompt_frame(pd.DataFrame({"messages": CHATS}), split, tokenizer)
    pd.DataFrame({"messages": CHATS}).to_parquet(tmp_path / "chats.parquet")  # lists come back as arrays
    table = PredictSources("model", "runs", tmp_path / "parts").read_input(str(tmp_path / "chats.parquet"))
    rows = chat_rows(table, tokenizer, chat_format(tokenizer, trained, model="model"))
    assert rows["ids"].tolist() == [prompt_token_ids(tokenizer, prompt) for prompt in training["prompt"]]
    assert rows["refused"].isna().all() and json.loads(rows["input"].iloc[1]) == CHATS[1]
    assert ("<|assistant|>" in training["prompt"][0]) == with_template and "Two" not in training["prompt"][0]


def test_a_template_unlike_the_trained_one_or_none_at_all_is_refused_in_one_line(tokenizer):
    split = parse_split_params({"messages_column": "messages"})
    trained = {**data_format_params(split, tokenizer), "source": "fingerprint.json"}
    edited = llama_style_tokenizer(["a b c"], vocab_size=300)
    edited.chat_template = CHAT_TEMPLATE.replace("<|assistant|>", "<|bot|>")
    with pytest.raises(StaleDataError, match="is not the one its training data was rendered with") as caught:
        chat_format(edited, trained, model="model")
    none = llama_style_tokenizer(["a b c"], vocab_size=300)
    with pytest.raises(StaleDataError, match=r"\(none\)"):
        chat_format(none, trained, model="model")
    with pytest.raises(InputDataError, match="has no chat template") as no_record:
        chat_format(none, None, model="model")  # a model from elsewhere: its own template, and it has none
    assert "\n" not in str(caught.value) + str(no_record.value)
    assert chat_format(tokenizer, None, model="model") == ChatFormat()


def test_rows_that_are_not_chats_are_kept_with_their_reason(tokenizer):
    values = [
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": ""},
        ],  # the reference may be empty
        "user: hi",
        [{"role": "user", "content": "hi"}, "hi"],
        [{"role": "system", "content": "Be brief."}],
        [{"role": "user", "content": "hi"}, {"role": "system", "content": "later"}],
        [{"role": "user", "content": 7}],
        [{"role": "user"}],
        None,
    ]
    rows = chat_rows(pd.DataFrame({"messages": values}), tokenizer, ChatFormat())
    assert rows["refused"].fillna("").tolist() == [
        "",
        "malformed_messages (not a list of {role, content} turns)",
        "malformed_messages (not a list of {role, content} turns)",
        "malformed_messages (no user turn)",
        "malformed_messages (a turn other than assistant after the last user or tool turn)",
        "non_string",
        "missing",
        "missing",
    ]
    assert rows["ids"].notna().tolist() == [True] + [False] * 7 and rows["input"].iloc[1] == "user: hi"


def test_chats_that_call_tools_are_rendered_with_their_tools_as_the_split_renders_them(sample_texts):
    """A chat with an assistant turn of ``tool_calls`` and the tool's result was refused (``tool_calls``,
    function calling not trained). It is asked as the split renders it: its turns up to the last user or
    tool turn, with its row's tools, by the same chat template; a template-less chat format refuses it."""
    from tests.support.chat_templates import WEATHER_TOOL, tool_calling_tokenizer, tool_chat

    tool_tokenizer = tool_calling_tokenizer(sample_texts)
    chat = tool_chat("서울")  # user, call, tool result, then a second call: the reference answer
    table = pd.DataFrame(
        {
            "messages": [chat, chat[:3], [chat[0], {**chat[1], "tool_calls": [{"function": {}}]}, chat[2]]],
            "tools": [[WEATHER_TOOL], json.dumps([WEATHER_TOOL]), None],
        }
    )
    rows = chat_rows(table, tool_tokenizer, ChatFormat())
    frame, _ = prompt_frame(
        pd.DataFrame({"messages": [chat], "tools": [[WEATHER_TOOL]]}),
        parse_split_params({"messages_column": "messages"}),
        tool_tokenizer,
    )
    expected = prompt_token_ids(tool_tokenizer, frame.loc[0, "prompt"])
    assert rows["ids"].iloc[0] == expected and rows["ids"].iloc[1] == expected
    assert rows["refused"].iloc[2].startswith("malformed_messages")
    lines = chat_rows(table.head(2), tool_tokenizer, ChatFormat(chat_template=False))
    assert lines["refused"].tolist() == ["tool_calls (no chat template renders tool calls)"] * 2


def test_a_pair_checks_only_when_the_summary_was_written_for_that_csv(tmp_path):
    catalog = yaml.safe_load((PROJECT_ROOT / "conf/base/catalog.yml").read_text(encoding="utf-8"))
    table = pd.DataFrame(
        {
            "id": [0, 1],
            "input": ['a "quoted", line\nand more', "배송"],
            "prediction": ["x", ""],
            "refused": "",
        }
    )
    csv, summary = tmp_path / "predictions.csv", tmp_path / "predict_summary.json"
    AtomicCSVDataset(str(csv), save_args=catalog["predictions"]["save_args"]).save(table)  # as the catalog
    summary.write_text(json.dumps({"rows": 2, **prediction_digest(table)}), encoding="utf-8")
    assert check_prediction_pair(csv, summary)["predictions_rows"] == 2
    csv.write_text(csv.read_text(encoding="utf-8").replace("배송", "배달"), encoding="utf-8")
    with pytest.raises(StaleDataError, match="does not describe"):
        check_prediction_pair(csv, summary)
    summary.write_text(json.dumps({"rows": 2}), encoding="utf-8")  # a summary with no digest
    with pytest.raises(StaleDataError, match="no predictions_sha256"):
        check_prediction_pair(csv, summary)
    with pytest.raises(InputDataError, match="does not exist"):
        check_prediction_pair(tmp_path / "missing.csv", summary)


def test_predictions_of_a_model_writing_carriage_returns_read_back_row_for_row(tmp_path):
    """A model that writes a bare carriage return and a CRLF: its predictions get the split's line-end rule,
    so predictions.csv (pandas quotes only the fields that hold a line feed) reads back one row per input, and
    the summary's digest is the file's."""
    model, tokenizer = line_end_llama()
    rows = text_rows(["c", "b"], tokenizer)
    runtime = _cpu("fp32")
    table, summary = predict_rows(
        model, tokenizer, rows, PredictionJob(decoding={}, max_new_tokens=4), runtime=runtime
    )
    assert table["prediction"].tolist() == ["a\nb", "c\na"]
    csv = tmp_path / "predictions.csv"
    catalog_dataset("predictions", csv).save(table)
    back = pd.read_csv(csv, keep_default_na=False)
    assert back["prediction"].tolist() == table["prediction"].tolist() and len(back) == summary["rows"] == 2
    assert summary["predictions_sha256"] == hashlib.sha256(csv.read_bytes()).hexdigest()


def test_inputs_holding_carriage_returns_are_shown_with_lf_and_read_back_row_for_row(tmp_path):
    """An input cell saved with CRLF or a bare CR (a CSV from Excel): the model reads it cleaned as the split
    cleans (LF), and predictions.csv shows it so too; shown as given, its CR split the row for every
    reader."""
    model, tokenizer = line_end_llama()
    rows = text_rows(["a\r\nc", "a\rb"], tokenizer)
    table, summary = predict_rows(
        model, tokenizer, rows, PredictionJob(decoding={}, max_new_tokens=2), runtime=_cpu("fp32")
    )
    assert table["input"].tolist() == ["a\nc", "a\nb"]
    csv = tmp_path / "predictions.csv"
    catalog_dataset("predictions", csv).save(table)
    back = pd.read_csv(csv, keep_default_na=False)
    assert back["input"].tolist() == ["a\nc", "a\nb"] and len(back) == summary["rows"] == 2


def test_a_plain_text_continuation_is_kept_as_decoded_and_a_response_stripped():
    """Plain text is continued (predict.text_column): its continuation is the text after the input exactly
    as plain ``pipeline(..., return_full_text=False)`` gives it, a leading space or line end included (the
    stripped " died" read "died": input + prediction lost the space); a prompt's response is stripped, as
    training stripped the responses."""
    model, tokenizer = line_end_llama()
    rows = text_rows(["c", "b"], tokenizer)
    for continued, expected in ((True, ["\na\nb", "c\na\n"]), (False, ["a\nb", "c\na"])):
        job = PredictionJob(decoding={}, max_new_tokens=4, continuation=continued)
        table, _ = predict_rows(model, tokenizer, rows, job, runtime=_cpu("fp32"))
        assert table["prediction"].tolist() == expected


def test_a_continuation_keeps_its_leading_space_with_a_sentencepiece_style_tokenizer():
    """A SentencePiece-style tokenizer (Llama-2, Mistral, Gemma) takes the space off the first token it
    decodes: the continuation decoded alone read "died again", input + prediction "The batterydied again".
    It is the whole text decoded less the input's, " died again"; a response is stripped as before."""
    tokens = ("<pad>", "<s>", "</s>", "<unk>", "▁The", "▁battery", "▁died", "▁again")
    chain = {"▁The": "▁battery", "▁battery": "▁died", "▁died": "▁again", "▁again": "</s>"}
    model, tokenizer = scripted_llama(tokens, chain, metaspace=True)
    rows = text_rows(["The battery", "The"], tokenizer)
    whole = []  # plain generate, one row at a time: the whole text decoded
    for ids in rows["ids"]:
        out = model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False, pad_token_id=0)
        whole.append(tokenizer.decode(out[0].tolist(), skip_special_tokens=True))
    job = PredictionJob(decoding={}, max_new_tokens=4, continuation=True)
    table, _ = predict_rows(model, tokenizer, rows, job, runtime=_cpu("fp32"))
    assert table["prediction"].tolist() == [" died again", " battery died again"]
    assert (table["input"] + table["prediction"]).tolist() == whole
    job = PredictionJob(decoding={}, max_new_tokens=4, continuation=False)
    table, _ = predict_rows(model, tokenizer, rows, job, runtime=_cpu("fp32"))
    assert table["prediction"].tolist() == ["died again", "battery died again"]


def test_predict_stops_at_the_end_ids_of_the_models_generation_config(tmp_path):
    """The tokenizer's EOS and every id of the model's ``generation_config.eos_token_id`` end a prediction
    (an instruct model's end-of-turn token is not its tokenizer's EOS)."""
    model, tokenizer = line_end_llama()
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("\r\n")]
    rows = text_rows(["b", "c", "a"], tokenizer)
    runtime = _cpu("fp32")
    table, _ = predict_rows(
        model, tokenizer, rows, PredictionJob(decoding={}, max_new_tokens=6), runtime=runtime
    )
    assert table["prediction"].tolist() == ["c", "", "bc"]
    assert table["new_tokens"].tolist() == [1, 0, 3]


def test_each_row_says_why_it_stopped_and_the_summary_counts_them():
    """Each row's ``finish_reason`` as vLLM and the OpenAI API give it: ``stop`` where an end id ended it
    (fewer new tokens than ``max_new_tokens``), ``length`` where ``max_new_tokens`` cut it; a refused row
    none. The summary counts both (``finish_reasons``). Was: no finish reason; a cut row read as an answer."""
    vocab = ("<pad>", "<s>", "</s>", "<unk>", "a", "b", "c")
    model, tokenizer = scripted_llama(vocab, {"a": "b", "b": "c", "c": "</s>"})
    rows = text_rows(["b", "c", "a"], tokenizer)
    rows.loc[1, "refused"], rows.at[1, "ids"] = "too_long: refused here", None
    job = PredictionJob(decoding={}, max_new_tokens=2)
    table, summary = predict_rows(model, tokenizer, rows, job, runtime=_cpu("fp32"))
    assert table["new_tokens"].tolist() == [1, 0, 2]  # "c" then the end id; refused; "bc", cut
    assert table["finish_reason"].tolist() == ["stop", "", "length"]
    expected = [
        "" if refused else "length" if n == 2 else "stop"
        for refused, n in zip(table["refused"], table["new_tokens"], strict=True)
    ]
    assert table["finish_reason"].tolist() == expected
    assert summary["finish_reasons"] == {"stop": 1, "length": 1}


def test_finished_chunks_are_reused_only_on_the_device_type_and_precision_that_wrote_them(tmp_path):
    """The chunks of a bf16 GPU run are not mixed with those of an fp32 CPU rerun: the job's key has the
    device type, the autocast precision and the model's dtype."""
    model, tokenizer = line_end_llama()
    rows = text_rows(["a", "b", "c"], tokenizer)
    job, parts = PredictionJob(decoding={}, max_new_tokens=4, batch_size=1), PredictionParts(tmp_path)
    fp32 = _cpu("fp32")
    bf16 = _cpu("bf16")

    def resumed(model, runtime):
        _, summary = predict_rows(
            model, tokenizer, rows, job, runtime=runtime, parts=parts, model_identity="m"
        )
        return summary["resumed_rows"], [path.name for path in tmp_path.glob("*.jsonl")]

    first, (written,) = resumed(model, fp32)
    assert first == 0 and resumed(model, fp32) == (3, [written])  # the same job: every chunk reused
    in_bf16, (other,) = resumed(model, bf16)
    assert in_bf16 == 0 and other != written
    assert resumed(model, bf16) == (3, [other])
    weights_in_bf16, (third,) = resumed(model.to(torch.bfloat16), bf16)
    assert weights_in_bf16 == 0 and third not in (written, other)


def test_finished_chunks_are_reused_only_with_the_generation_code_that_wrote_them(tmp_path, monkeypatch):
    """The chunks of a finished or interrupted run are kept: a rerun after an upgrade of transformers or torch
    (whose kernels and decoding may pick other tokens), or of fastlm's own generation rules (which settings
    reach ``generate``), generates again instead of giving the older code's predictions as this run's."""
    import transformers

    from fastlm.engine.evaluate import generation

    model, tokenizer = line_end_llama()
    rows = text_rows(["a", "b", "c"], tokenizer)
    job, parts = PredictionJob(decoding={}, max_new_tokens=4, batch_size=1), PredictionParts(tmp_path)

    def resumed():
        _, summary = predict_rows(
            model, tokenizer, rows, job, runtime=_cpu("fp32"), parts=parts, model_identity="m"
        )
        return summary["resumed_rows"]

    assert resumed() == 0 and resumed() == 3  # the same job and code: every chunk reused
    monkeypatch.setattr(transformers, "__version__", transformers.__version__ + ".post1")
    assert resumed() == 0 and resumed() == 3
    monkeypatch.setattr(torch, "__version__", torch.__version__ + ".post1")
    assert resumed() == 0 and resumed() == 3
    monkeypatch.setattr(generation, "DECODING_RULES", generation.DECODING_RULES + 1, raising=False)
    assert resumed() == 0 and resumed() == 3


def test_kept_chunks_dropped_for_a_changed_job_are_said_with_what_changed(tmp_path, monkeypatch):
    """An interrupted run keeps its finished chunks; a rerun whose job changed (another batch size,
    max_new_tokens, decoding setting, model, code version) generates them again, and says so in one line
    naming what changed and how many kept rows are generated again. Was: dropped silently."""
    import logging.handlers

    from fastlm.reporting import predictions

    seen = logging.handlers.BufferingHandler(capacity=100)
    logger = logging.Logger("predict-changed", logging.INFO)
    logger.addHandler(seen)
    monkeypatch.setattr(predictions, "log", logger)
    model, tokenizer = line_end_llama()
    rows = text_rows(["a", "b", "c", "d", "e", "f"], tokenizer)
    parts = PredictionParts(tmp_path)
    real, calls = predictions.generate_continuations, []

    def stopped_at_the_second_chunk(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    def run(job, identity="m"):
        seen.buffer.clear()
        predict_rows(model, tokenizer, rows, job, runtime=_cpu("fp32"), parts=parts, model_identity=identity)
        return [record.getMessage() for record in seen.buffer if "generated again" in record.getMessage()]

    def kept_rows():
        return sum(
            len(json.loads(line)["continuations"])
            for file in tmp_path.glob("*.jsonl")
            for line in file.read_text(encoding="utf-8").splitlines()
        )

    first = PredictionJob(decoding={"num_beams": 1}, max_new_tokens=4, batch_size=1)
    monkeypatch.setattr(predictions, "generate_continuations", stopped_at_the_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        run(first)
    monkeypatch.setattr(predictions, "generate_continuations", real)
    kept = kept_rows()
    assert 0 < kept < len(rows)
    longer = PredictionJob(decoding={"num_beams": 1}, max_new_tokens=5, batch_size=1)
    said = run(longer)
    assert len(said) == 1 and said[0].startswith(f"predict.max_new_tokens {first.max_new_tokens} -> 5"), said
    assert f"the {kept} rows kept from the interrupted run" in said[0], said
    finished = kept_rows()
    assert finished == len(rows)
    beams = PredictionJob(decoding={"num_beams": 2}, max_new_tokens=5, batch_size=2)
    said = run(beams)
    assert len(said) == 1 and "predict.batch_size 1 -> 2" in said[0] and "predict.num_beams 1 -> 2" in said[0]
    assert f"the {finished} rows kept from the earlier run" in said[0], said
    said = run(beams, identity="other weights")
    assert len(said) == 1 and "predict.model" in said[0], said
    assert run(beams, identity="other weights") == []  # the same job: its chunks reused, nothing said


def test_an_interrupted_run_keeps_its_rows_while_a_run_on_another_input_predicts(tmp_path, monkeypatch):
    """A long run stopped part way, then a quick run on another file (a check of a few rows) with resume on:
    the stopped run's finished chunks stay, so its command run again resumes them. Was: dropped by the
    other run ("... are generated again", said at INFO), the stopped run's generation lost. A finished job's
    chunks, and a stopped one's where the same input runs with other settings, are dropped as before; at
    most ``KEPT_OTHER_JOBS`` stopped jobs of other inputs are kept, the newest."""
    from fastlm.reporting import predictions

    model, tokenizer = line_end_llama()
    parts, real, calls = PredictionParts(tmp_path), predictions.generate_continuations, []
    job = PredictionJob(decoding={}, max_new_tokens=4, batch_size=1)
    first_chunk = job.batch_size * predictions.CHUNK_BATCHES

    def resumed(rows, job=job):
        _, summary = predict_rows(
            model, tokenizer, rows, job, runtime=_cpu("fp32"), parts=parts, model_identity="m"
        )
        return summary["resumed_rows"]

    def stopped(rows, job=job):
        def at_the_second_chunk(*args, **kwargs):
            calls.append(1)
            if len(calls) == 2:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        calls.clear()
        monkeypatch.setattr(predictions, "generate_continuations", at_the_second_chunk)
        with pytest.raises(KeyboardInterrupt):
            resumed(rows, job)
        monkeypatch.setattr(predictions, "generate_continuations", real)

    long_rows, quick = text_rows(list("abcdef"), tokenizer), text_rows(["b", "c"], tokenizer)
    stopped(long_rows)
    assert resumed(quick) == 0
    assert resumed(long_rows) == first_chunk  # resumed where it stopped, then finished
    assert resumed(quick) == 0 and resumed(long_rows) == 0  # a finished job's chunks are dropped
    assert resumed(quick) == 0
    stopped(long_rows)
    longer = PredictionJob(decoding={}, max_new_tokens=5, batch_size=1)
    assert resumed(long_rows, longer) == 0 and resumed(long_rows) == 0  # the same input: dropped
    others = [text_rows(["b"] * rows, tokenizer) for rows in (6, 7, 8, 9)]  # four other inputs
    for rows in others:
        stopped(rows)
    assert len(list(tmp_path.glob("*.jsonl"))) == predictions.KEPT_OTHER_JOBS + 1
    assert resumed(others[-2]) == first_chunk


def test_the_summary_records_the_models_forced_and_banned_tokens_beside_the_decoding(tmp_path):
    """A model folder's token rules kept at generation (``generation.KEPT_FROM_MODEL``: a banned token, a
    suppressed one) are recorded in the summary's decoding settings, as the model's generation_config holds
    them; a model without any records none. Was: said in the log only, the summary naming plain greedy."""
    import copy

    from fastlm.engine.evaluate.generation import KEPT_FROM_MODEL

    model, tokenizer = line_end_llama()
    rows = text_rows(["a", "b", "c"], tokenizer)
    job = PredictionJob(decoding={}, max_new_tokens=4, batch_size=1)
    banned = copy.deepcopy(model)
    banned.generation_config.update(bad_words_ids=[[5]], suppress_tokens=[6, 7])
    config = banned.generation_config
    recorded = {key: getattr(config, key) for key in KEPT_FROM_MODEL if getattr(config, key) is not None}
    _, plain = predict_rows(model, tokenizer, rows, job, runtime=_cpu("fp32"))
    _, summary = predict_rows(banned, tokenizer, rows, job, runtime=_cpu("fp32"))
    assert plain["decoding_settings"]["model_token_rules"] == {}
    assert summary["decoding_settings"]["model_token_rules"] == recorded and len(recorded) == 2
    assert json.loads(json.dumps(summary))["decoding_settings"] == summary["decoding_settings"]


def test_a_run_whose_rows_all_came_from_an_earlier_run_says_no_speed(tmp_path, monkeypatch):
    """A rerun of the same job generates nothing (every chunk reused): its lines say so ("Nothing to
    generate") and give no speed, where the run that generated them gives one. Was: "0.0 samples/s, 0
    generated tokens/s", a speed of nothing generated."""
    import logging.handlers

    from fastlm.reporting import predict_steps, predictions

    seen = logging.handlers.BufferingHandler(capacity=100)
    logger = logging.Logger("predict-rerun", logging.INFO)
    logger.addHandler(seen)
    monkeypatch.setattr(predict_steps, "log", logger)
    monkeypatch.setattr(predictions, "log", logger)
    model, tokenizer = line_end_llama()
    rows = text_rows(["a", "b", "c"], tokenizer)
    job, parts = PredictionJob(decoding={}, max_new_tokens=4, batch_size=1), PredictionParts(tmp_path)
    said = []
    for _ in range(2):
        seen.buffer.clear()
        _, summary = predict_rows(
            model, tokenizer, rows, job, runtime=_cpu("fp32"), parts=parts, model_identity="m"
        )
        predict_steps.say_predicted(summary, "texts.jsonl", "model")
        said.append(([record.getMessage() for record in seen.buffer], summary))
    (first, generated), (again, reused) = said
    assert (
        generated["generated_rows"] == reused["resumed_rows"] == len(rows) and reused["generated_rows"] == 0
    )
    assert not any("Nothing to generate" in line for line in first)
    assert sum("Nothing to generate" in line for line in again) == 1, again
    assert sum("samples/s" in line for line in first) == 1, first
    assert not any("/s" in line for line in again), again
    assert sum(line.startswith(f"Predicted {len(rows)} of {len(rows)} rows") for line in again) == 1, again


@pytest.mark.parametrize(("tick_s", "expected"), [(0.0, 2), (31.0, 5)], ids=["fast", "slow"])
def test_the_progress_line_comes_at_the_first_and_last_chunk_and_every_half_minute(
    monkeypatch, tick_s, expected
):
    """A line a chunk (4 batches) was about 780 INFO lines for 50,000 rows at the default batch of 16: now
    the first chunk's (the rate seen early), then one at most every ``PROGRESS_EVERY_S`` seconds, and the
    last chunk's. 20 rows at batch 1 are 5 chunks: 2 lines when the clock stands still, 5 when each chunk
    takes longer than the interval."""
    import itertools
    import logging.handlers

    from fastlm.reporting import predictions

    seen = logging.handlers.BufferingHandler(capacity=100)
    logger = logging.Logger("predict-progress", logging.INFO)
    logger.addHandler(seen)
    monkeypatch.setattr(predictions, "log", logger)
    clock = itertools.count(0.0, tick_s) if tick_s else itertools.repeat(0.0)
    monkeypatch.setattr(predictions, "perf_counter", lambda: next(clock))
    model, tokenizer = line_end_llama()
    rows = text_rows([chr(ord("a") + i) for i in range(20)], tokenizer)
    job = PredictionJob(decoding={}, max_new_tokens=2, batch_size=1)
    predict_rows(model, tokenizer, rows, job, runtime=_cpu("fp32"))
    lines = [record.getMessage() for record in seen.buffer if "rows/s" in record.getMessage()]
    assert len(lines) == expected, lines
    assert lines[0].startswith("predict: 4/20 rows") and lines[-1].startswith("predict: 20/20 rows")


def test_inputs_longer_than_the_tokenizers_own_limit_give_no_indexing_warning(tokenizer, capfd, caplog):
    """Predict truncates to the model's positions itself (``input_limit``): the tokenizer's warning that
    the sequence "will result in indexing errors" (its own ``model_max_length``, the split's max_length)
    names an error that cannot happen."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(_saved(tokenizer, capfd), model_max_length=8)
    rows = text_rows(["the battery died again " * 20], tokenizer, limit=32)
    assert len(rows["ids"].iloc[0]) == 32 and bool(rows["truncated"].iloc[0])
    assert "indexing errors" not in capfd.readouterr().err + caplog.text


def _saved(tokenizer, capfd, folder=[]):  # noqa: B006 - one folder for the module
    import tempfile

    if not folder:
        folder.append(tempfile.mkdtemp())
        tokenizer.save_pretrained(folder[0])
    capfd.readouterr()
    return folder[0]


def test_a_model_trained_here_gets_its_prompts_cut_as_its_training_and_report_cut_them(tokenizer):
    """Predict gave a model trained at split.max_length 320 (512 positions) prompts of up to 448 tokens,
    more than any training row held, where the report's reference generations (the ROUGE it shows) cut
    the same prompts to 287 tokens at 32 new tokens: the predictions differed from what the report scored.
    A model whose training record names its max_length gets the report's cut; without one (a model from
    elsewhere) the positions rule stays; predict.max_input_tokens wins over both."""
    from types import SimpleNamespace

    from fastlm.reporting.predict_inputs import input_limit
    from fastlm.reporting.references import generation_prompts

    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=512, is_encoder_decoder=False))
    prompt = ("the battery died again " * 120).strip()  # cleaned, as the split and predict clean it
    assert input_limit(model, max_new_tokens=32, max_input_tokens=None) == 480  # a model from elsewhere
    limit = input_limit(model, max_new_tokens=32, max_input_tokens=None, trained_length=320)
    assert limit == 287
    assert input_limit(model, max_new_tokens=32, max_input_tokens=400, trained_length=320) == 400
    rows = text_rows([prompt], tokenizer, limit=limit)
    reported = generation_prompts(tokenizer, [prompt], model=model, max_length=320, max_new_tokens=32)
    assert len(prompt_token_ids(tokenizer, prompt)) > 320 and list(rows["ids"].iloc[0]) == reported[0]


@pytest.mark.parametrize("kind", ["qwen3", "qwen3_no_thinking", "llama32"])
def test_predict_asks_a_chat_ending_with_a_tool_result_with_the_templates_own_prompt(sample_texts, kind):
    """A chat ending with a tool's result is asked with its row's tools (a list, a JSON text, none) as the
    template's own generation prompt for that chat and those tools writes it; a call whose arguments are a
    JSON text is written as the mapping it holds."""
    from fastlm.corpus.chat_template import CHAT_DATE
    from tests.support.chat_templates import (
        WEATHER_TOOL,
        llama3_style_tokenizer,
        qwen3_style_tokenizer,
        tool_chat,
    )

    tokenizer = (llama3_style_tokenizer if kind == "llama32" else qwen3_style_tokenizer)(sample_texts)
    variables = {"enable_thinking": False} if kind == "qwen3_no_thinking" else {}
    chats = [tool_chat("서울")[:3], tool_chat("부산")[:3], [{"role": "user", "content": "안녕"}]]
    as_text = tool_chat("광주")[:3]
    as_text[1] = {
        **as_text[1],
        "tool_calls": [{"function": {"name": "get_weather", "arguments": '{"city": "광주"}'}}],
    }
    tools = [[WEATHER_TOOL], json.dumps([WEATHER_TOOL]), None, [WEATHER_TOOL]]
    table = pd.DataFrame({"messages": [*chats, as_text], "tools": pd.Series(tools, dtype=object)})
    rows = chat_rows(table, tokenizer, ChatFormat(variables=variables))
    expected_chats = [*chats, tool_chat("광주")[:3]]
    assert rows["refused"].isna().all()
    for ids, chat, given in zip(
        rows["ids"], expected_chats, [[WEATHER_TOOL]] * 2 + [None, [WEATHER_TOOL]], strict=True
    ):
        prompt = tokenizer.apply_chat_template(
            chat, tools=given, add_generation_prompt=True, tokenize=False, date_string=CHAT_DATE, **variables
        )
        assert tokenizer.decode(ids) == prompt


def test_a_chat_the_template_refuses_is_a_refused_row_and_the_others_are_asked(sample_texts):
    """Llama-3.x's template takes one tool call a turn (its ``raise_exception``): a chat with two in one turn
    is kept in predictions.csv with the template's reason, and the other chats are asked (it ended predict
    with jinja's TemplateError traceback)."""
    from tests.support.chat_templates import WEATHER_TOOL, llama3_style_tokenizer, tool_call, tool_chat

    tokenizer = llama3_style_tokenizer(sample_texts)
    two_calls = tool_chat("서울")[:3]
    two_calls[1] = {**two_calls[1], "tool_calls": [tool_call("서울"), tool_call("부산")]}
    chats = [tool_chat("대구")[:3], two_calls, [{"role": "user", "content": "안녕"}]]
    table = pd.DataFrame({"messages": chats, "tools": pd.Series([[WEATHER_TOOL]] * 3, dtype=object)})
    rows = chat_rows(table, tokenizer, ChatFormat())
    assert rows["refused"].iat[0] is None and rows["refused"].iat[2] is None, list(rows["refused"])
    reason = rows["refused"].iat[1]
    assert reason.startswith("template_refused") and "\n" not in reason, reason
    assert rows["ids"].iat[1] is None and rows["ids"].iat[0] is not None and rows["ids"].iat[2] is not None


def test_the_summary_says_where_the_tools_came_from_and_warns_of_tool_chats_asked_without_them(
    sample_texts, monkeypatch
):
    """Tool-calling chats in an input without the training's tools column were asked without any tools,
    silently, and the summary did not say which column the tools were read from."""
    import logging.handlers

    from fastlm.reporting import predict_steps
    from tests.support.chat_templates import WEATHER_TOOL, tool_chat

    seen = logging.handlers.BufferingHandler(capacity=100)
    logger = logging.Logger("predict-steps-lines", logging.INFO)
    logger.addHandler(seen)
    monkeypatch.setattr(predict_steps, "log", logger)
    chats = [tool_chat("서울")[:3], [{"role": "user", "content": "안녕"}]]
    given = [[WEATHER_TOOL], None]
    with_tools = predict_steps.tools_record(
        pd.DataFrame({"messages": chats, "tools": given}), ChatFormat(), "messages"
    )
    assert with_tools == {"tools_column": "tools", "rows_with_tools": sum(v is not None for v in given)}
    assert not seen.buffer
    without = predict_steps.tools_record(pd.DataFrame({"messages": chats}), ChatFormat(), "messages")
    assert without == {"tools_column": None, "rows_with_tools": 0}
    said = [record.getMessage() for record in seen.buffer if record.levelno == logging.WARNING]
    assert len(said) == 1 and "'tools'" in said[0] and "without tools" in said[0]
    assert said[0].startswith("predict: 1 chat(s) of column"), said
    # a refused chat (too long, empty) is asked neither way: not counted among those asked without tools
    seen.buffer.clear()
    refused = predict_steps.tools_record(
        pd.DataFrame({"messages": [*chats, tool_chat("부산")[:3]]}),
        ChatFormat(),
        "messages",
        asked=[True, True, False],
    )
    assert refused == {"tools_column": None, "rows_with_tools": 0}
    said = [record.getMessage() for record in seen.buffer if record.levelno == logging.WARNING]
    assert len(said) == 1 and said[0].startswith("predict: 1 chat(s) of column"), said


def test_a_call_keeps_its_markup_and_is_read_into_tool_calls():
    """A chat asked with tools is answered by a call in the template's format. A tokenizer marking the call
    markup special lost it in the prediction (special tokens skipped: the bare JSON, which no parser of
    the format reads); now kept, and the call read into ``tool_calls`` (``[]``: an answer calling nothing;
    empty: a row asked without tools, or a call cut by ``max_new_tokens``, counted in the summary)."""
    from fastlm.corpus.call_reader import CallReader
    from tests.support.chat_templates import WEATHER_TOOL
    from tests.support.tiny_llama import calling_llama

    model, tokenizer = calling_llama()
    token = tokenizer.convert_tokens_to_ids
    rows = pd.DataFrame(
        {
            "id": [0, 1, 2],
            "input": ["a", "b", "c"],
            "ids": [[token("ask")], [token("hi")], [token("ask")]],
            "refused": [None] * 3,
            "truncated": [False] * 3,
            "tools": [[WEATHER_TOOL], [WEATHER_TOOL], None],
        }
    )
    reader = CallReader.of(tokenizer)
    call = '{"name":"get_weather","arguments":{"city":"서울"}}'
    job = PredictionJob(decoding={}, max_new_tokens=12, calls=reader)
    table, summary = predict_rows(model, tokenizer, rows, job, runtime=_cpu("fp32"))
    assert table["prediction"].tolist() == [f"<tool_call>{call}</tool_call>", "sunny", call]
    assert table["tool_calls"].tolist()[1:] == ["[]", ""]
    assert json.loads(table["tool_calls"][0]) == [{"name": "get_weather", "arguments": {"city": "서울"}}]
    assert summary["tool_calls"] == {
        "rows_asked_with_tools": 2,
        "rows_calling": 1,
        "calls": 1,
        "calls_of_unknown_tools": 0,
        "rows_unread": 0,
        "unread_rows": [],
    }
    cut, cut_summary = predict_rows(
        model,
        tokenizer,
        rows,
        PredictionJob(decoding={}, max_new_tokens=4, calls=reader),
        runtime=_cpu("fp32"),
    )
    assert cut["tool_calls"].tolist() == ["", "[]", ""]
    assert cut_summary["tool_calls"]["unread_rows"] == [0]


def test_every_unread_call_is_counted_beyond_the_rows_named(monkeypatch):
    """More unread calls than the summary names one by one: the summary counts them all (``rows_unread``)
    and the warning says how many (it named the first rows alone, as if they were all)."""
    import logging.handlers

    from fastlm.corpus.call_reader import CallReader
    from fastlm.reporting import predict_steps
    from fastlm.reporting.predictions import LISTED_REFUSALS
    from tests.support.chat_templates import WEATHER_TOOL
    from tests.support.tiny_llama import calling_llama

    model, tokenizer = calling_llama()
    count = LISTED_REFUSALS + 3
    rows = pd.DataFrame(
        {
            "id": list(range(count)),
            "input": ["a"] * count,
            "ids": [[tokenizer.convert_tokens_to_ids("ask")]] * count,
            "refused": [None] * count,
            "truncated": [False] * count,
            "tools": [[WEATHER_TOOL]] * count,
        }
    )
    job = PredictionJob(decoding={}, max_new_tokens=4, batch_size=count, calls=CallReader.of(tokenizer))
    table, summary = predict_rows(model, tokenizer, rows, job, runtime=_cpu("fp32"))
    calls = summary["tool_calls"]
    unread = int((table["tool_calls"] == "").sum())
    assert calls["rows_unread"] == unread == calls["rows_asked_with_tools"]
    assert len(calls["unread_rows"]) == LISTED_REFUSALS < unread
    seen = logging.handlers.BufferingHandler(capacity=100)
    logger = logging.Logger("predict-steps-calls", logging.INFO)
    logger.addHandler(seen)
    monkeypatch.setattr(predict_steps, "log", logger)
    predict_steps.say_predicted(summary, "chats.jsonl", "model")
    said = [record.getMessage() for record in seen.buffer if record.levelno == logging.WARNING]
    assert len(said) == 1 and f"{unread} of {count} rows" in said[0] and ", ...)" in said[0]


def test_sharegpt_chats_are_asked_as_the_same_role_content_chats(tokenizer, tmp_path, monkeypatch):
    """Chats given as ShareGPT turns (``{from, value}``) were refused row by row as not role/content turns,
    whatever form the model was trained on. They are asked with the prompt ids of the same chats as
    role/content turns; a tool's turn among them counts as one for the summary's warning; a speaker no role
    is read from refuses the input in one line."""
    import logging.handlers

    from fastlm.reporting import predict_steps
    from tests.support.chat_templates import sharegpt_chat, tool_chat

    pd.DataFrame({"messages": [sharegpt_chat(chat) for chat in CHATS]}).to_parquet(tmp_path / "chats.parquet")
    table = PredictSources("model", "runs", tmp_path / "parts").read_input(str(tmp_path / "chats.parquet"))
    given = chat_rows(table, tokenizer, ChatFormat())
    expected = chat_rows(pd.DataFrame({"messages": CHATS}), tokenizer, ChatFormat())
    assert given["refused"].isna().all() and given["ids"].tolist() == expected["ids"].tolist()
    seen = logging.handlers.BufferingHandler(capacity=100)
    logger = logging.Logger("predict-steps-sharegpt", logging.INFO)
    logger.addHandler(seen)
    monkeypatch.setattr(predict_steps, "log", logger)
    tooled = pd.DataFrame({"messages": [sharegpt_chat(tool_chat("서울")[:3])]})
    assert predict_steps.tools_record(tooled, ChatFormat(), "messages")["tools_column"] is None
    assert (
        len([r for r in seen.buffer if r.levelno == logging.WARNING and "without tools" in r.getMessage()])
        == 1
    )
    unread = pd.DataFrame({"messages": [[{"from": "human", "value": "hi"}, {"from": "bing", "value": "yo"}]]})
    with pytest.raises(
        InputDataError, match=r"^predict\.messages_column \('messages'\) of chats\.parquet: row 1"
    ):
        chat_rows(unread, tokenizer, ChatFormat())


def test_a_chat_with_a_role_the_template_writes_nowhere_is_a_refused_row(sample_texts):
    """Qwen3's template skips a role it does not know: a chat whose question was given as a ``human`` turn
    was asked as ``<|im_start|>assistant\\n`` alone and answered without its question. Kept in
    predictions.csv with the reason naming the role; the other chats are asked."""
    from tests.support.chat_templates import qwen3_style_tokenizer

    tokenizer = qwen3_style_tokenizer(sample_texts)
    chats = [
        [{"role": "user", "content": "안녕"}],
        [{"role": "human", "content": "배송은 언제 오나요?"}, {"role": "user", "content": "답해 주세요"}],
    ]
    rows = chat_rows(pd.DataFrame({"messages": chats}), tokenizer, ChatFormat())
    assert rows["refused"].iat[0] is None and rows["ids"].iat[0] is not None, list(rows["refused"])
    reason = rows["refused"].iat[1]
    assert reason.startswith("unwritten_role") and "'human'" in reason and "\n" not in reason, reason
    assert rows["ids"].iat[1] is None


def test_the_truncation_warning_names_the_limit_and_what_set_it(monkeypatch):
    """Inputs cut at predict's limit: the warning names the limit and its source (predict.max_input_tokens,
    or the model's training rows or positions), as ``predict_input_limit_source`` finds it for the run."""
    import logging.handlers
    from types import SimpleNamespace

    from fastlm.reporting import predict_steps, predictions

    seen = logging.handlers.BufferingHandler(capacity=100)
    logger = logging.Logger("predict-truncated", logging.INFO)
    logger.addHandler(seen)
    monkeypatch.setattr(predictions, "log", logger)
    model, tokenizer = line_end_llama()
    given = SimpleNamespace(max_input_tokens=3, max_new_tokens=4)
    unset = SimpleNamespace(max_input_tokens=None, max_new_tokens=4)
    trained = {"training_data": {"max_length": 16}}
    source = predict_steps.predict_input_limit_source(model, given, trained, 3)
    assert source == "predict.max_input_tokens"
    assert "split.max_length 16" in predict_steps.predict_input_limit_source(
        model, unset, trained, 16 - 1 - 4
    )
    positions = model.config.max_position_embeddings
    assert f"positions: {positions}" in predict_steps.predict_input_limit_source(
        model, unset, {}, positions - 4
    )
    rows = text_rows(["a b c a b", "a"], tokenizer, limit=3)
    job = PredictionJob(
        decoding={}, max_new_tokens=2, batch_size=2, extra={"input_limit": 3, "input_limit_source": source}
    )
    _, summary = predict_rows(model, tokenizer, rows, job, runtime=_cpu("fp32"))
    lines = [record.getMessage() for record in seen.buffer if "truncated" in record.getMessage()]
    assert summary["truncated"] == 1 and len(lines) == 1
    assert "longer than 3 tokens (set by predict.max_input_tokens)" in lines[0]


def test_chats_given_without_the_training_system_turn_are_asked_as_given_with_one_warning(monkeypatch):
    """Every training chat began with one system turn; texts asked of the model get it put before them, but
    chats given without it were asked without it, silently."""
    import logging.handlers

    from fastlm.reporting import predict_steps

    seen = logging.handlers.BufferingHandler(capacity=100)
    logger = logging.Logger("predict-steps-system", logging.INFO)
    logger.addHandler(seen)
    monkeypatch.setattr(predict_steps, "log", logger)
    trained = ChatFormat(system_prompt="Be brief.")
    table = pd.DataFrame({"messages": [CHATS[0], CHATS[1], CHATS[1][:1]]})
    record = predict_steps.system_turn_record(table, trained, "messages")
    assert record == {"chats_without_system_turn": 2}
    said = [record.getMessage() for record in seen.buffer if record.levelno == logging.WARNING]
    assert len(said) == 1 and "2 of 3 chats" in said[0] and "'Be brief.'" in said[0]
    assert '{"role": "system"' in said[0]
    seen.buffer.clear()
    assert predict_steps.system_turn_record(table.head(1), trained, "messages") == {
        "chats_without_system_turn": 0
    }
    assert predict_steps.system_turn_record(table, ChatFormat(), "messages") == {}  # no shared system turn
    assert not seen.buffer


def test_what_a_killed_run_left_in_the_parts_folder_is_removed_by_the_next(tmp_path):
    """Round twenty: a predict killed while writing a job's settings or rewriting its chunks left
    ``.<key>.job.json.tmp`` / ``.<key>.jsonl.tmp`` in the parts folder; a later run of another job dropped
    that job's files but never these. The next run removes what a writer no longer alive left there."""
    parts = PredictionParts(tmp_path)
    parts.open("a", {"settings": {"batch_size": 1}, "rows": 2})
    parts.append("a", 0, [[5]])
    killed_at_first_rename(lambda: parts.open("a", {"settings": {"batch_size": 1}, "rows": 2}))
    assert len(list(tmp_path.iterdir())) == 3  # a's two files and the killed write's temporary file
    assert parts.open("c", {"settings": {"batch_size": 2}, "rows": 2}) == {}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["c.job.json"]


def test_a_large_input_is_tokenized_a_slice_at_a_time_with_the_ids_of_each_row_alone(tokenizer, monkeypatch):
    """Predict's rows are tokenized in slices of at most 1,024 texts: tokenizing a whole input in one call
    held every row's encoding (its tokens, offsets and masks, ~3 KB a short prompt) at once, so the peak
    memory of a 30,000-row input grew by ~90 MB with its rows. Each row's ids are those of its text alone."""
    texts = [f"row {i}: the battery died again" + " again" * (i % 5) for i in range(2_500)]
    sizes = []
    call = type(tokenizer).__call__

    def counted(self, text, *args, **kwargs):
        if isinstance(text, list):  # a batch of texts (a single one tells the tokenizer's BOS)
            sizes.append(len(text))
        return call(self, text, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "__call__", counted)
    rows = text_rows(texts, tokenizer)
    assert 1 < len(sizes) and max(sizes) <= 1_024 and sum(sizes) == len(texts)
    monkeypatch.undo()
    for text, ids in zip(texts[::97], rows["ids"].iloc[::97], strict=True):
        assert ids == [tokenizer.bos_token_id, *tokenizer(text, add_special_tokens=False)["input_ids"]]


class _CountedTokenizer:
    """A tokenizer whose batched calls (lists of texts) are recorded as (texts, characters)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __call__(self, texts, **kwargs):
        if isinstance(texts, list):
            self.calls.append((len(texts), sum(map(len, texts))))
        return self.inner(texts, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_predict_tokenizes_long_inputs_in_calls_bounded_by_characters(
    bpe_tokenizer, sample_texts, monkeypatch
):
    """predict's slices of ``ENCODE_SLICE_ROWS`` texts are also bounded by the corpus's
    ``MAX_CHARS_PER_CALL`` characters (a slice of 1,024 long documents held gigabytes), with the same ids."""
    from fastlm.corpus import tokenization
    from fastlm.reporting.predict_inputs import encode_inputs

    texts = [text * (1 + i % 5) for i, text in enumerate(sample_texts[:60])]
    whole = encode_inputs(texts, bpe_tokenizer)
    monkeypatch.setattr(tokenization, "MAX_CHARS_PER_CALL", 500, raising=False)
    counted = _CountedTokenizer(bpe_tokenizer)
    assert encode_inputs(texts, counted) == whole
    assert len(counted.calls) > 1 and sum(texts for texts, _ in counted.calls) == len(texts)
    assert all(chars <= 500 for texts, chars in counted.calls if texts > 1), counted.calls


def test_a_plain_texts_special_token_text_is_asked_as_training_read_it(bpe_tokenizer, sample_texts):
    """A text holding ``<|endoftext|>`` as characters is given to a plain-text model as the split tokenized
    it for training (the characters, not the EOS token); a prompt template's text keeps its tokens."""
    from fastlm.corpus.tokenization import tokenize_texts
    from fastlm.reporting.predict_inputs import encode_inputs

    marker = bpe_tokenizer.eos_token
    texts = [f"{text} {marker} and more" for text in sample_texts[:5]]
    trained = tokenize_texts(texts, bpe_tokenizer, max_length=512, num_proc=1)
    asked = encode_inputs(texts, bpe_tokenizer)
    for row, ids in enumerate(asked):
        assert ids == trained.values[trained.offsets[row] : trained.offsets[row + 1] - 1].tolist()
        assert bpe_tokenizer.eos_token_id not in ids
    templated = encode_inputs(["hello"], bpe_tokenizer, template=f"{{prompt}}{marker}")
    assert templated[0][-1] == bpe_tokenizer.eos_token_id


def test_a_model_named_after_an_interrupted_training_says_so_and_how_to_finish_it(tmp_path):
    """``predict.model=lora1`` while the training lora1 was interrupted (its checkpoints kept, no model
    folder): the refusal said only that it was neither a model folder nor a finished run. It names the
    interrupted training, its last checkpoint, and the command that finishes it."""
    from fastlm.datasets.predict_sources import PredictSources
    from fastlm.errors import InputDataError

    for step in (6, 12):
        (tmp_path / f"checkpoints/lora1/checkpoint-{step:08d}").mkdir(parents=True)
    sources = PredictSources(
        tmp_path / "model", tmp_path / "runs", tmp_path / "parts", checkpoints=tmp_path / "checkpoints"
    )
    with pytest.raises(InputDataError) as refused:
        sources.load_model("lora1")
    said = str(refused.value)
    assert "\n" not in said and "interrupted" in said and "checkpoint-00000012" in said, said
    assert "kedro run --pipeline=train --params run_name=lora1" in said, said
    with pytest.raises(InputDataError, match="neither a model folder"):
        sources.load_model("other")


def test_a_checkpoint_folder_given_as_the_model_names_its_run_and_what_to_predict_with(tmp_path):
    """``predict.model=data/06_models/checkpoints/<run>/checkpoint-00000006`` (the folder a user finds
    beside the run, holding model.safetensors): the refusal said it was neither a model folder nor a run,
    as of any folder. It says it is a checkpoint of that run, kept for resuming, and gives the run's model
    where the run finished, the command that finishes it where it did not."""
    from fastlm.datasets.predict_sources import PredictSources
    from fastlm.errors import InputDataError

    for run in ("done1", "stopped1"):
        folder = tmp_path / f"checkpoints/{run}/checkpoint-00000006"
        folder.mkdir(parents=True)
        for name in ("COMPLETE", "model.safetensors", "optimizer.pt"):
            (folder / name).write_text("x")
    (tmp_path / "runs/done1/model").mkdir(parents=True)
    (tmp_path / "runs/done1/model/config.json").write_text("{}")
    sources = PredictSources(
        tmp_path / "model", tmp_path / "runs", tmp_path / "parts", checkpoints=tmp_path / "checkpoints"
    )
    said = {}
    for run in ("done1", "stopped1"):
        with pytest.raises(InputDataError) as refused:
            sources.load_model(str(tmp_path / f"checkpoints/{run}/checkpoint-00000006"))
        said[run] = str(refused.value)
        assert "\n" not in said[run] and f"a checkpoint of the training {run}" in said[run], said[run]
    assert "predict.model=done1" in said["done1"], said["done1"]
    assert "kedro run --pipeline=train --params run_name=stopped1" in said["stopped1"], said["stopped1"]


def test_an_input_column_named_with_white_space_around_it_or_decomposed_is_the_column_asked_for(
    tmp_path, caplog
):
    """A CSV header written ``id, text`` names the column ' text' (which ``--params`` cannot say), and a
    Korean header saved on macOS is decomposed (NFD) where the parameter typed is composed: the split reads
    such a column as the one its parameter names, but predict refused the same file (``has no column
    'text'``). Its input table names them as asked, said in one warning each; a number-only cell is still
    read as the file writes it."""
    import logging
    import unicodedata

    from fastlm.datasets.predict_sources import PredictSources

    korean = unicodedata.normalize("NFD", "본문")
    path = tmp_path / "in.csv"
    path.write_text(f"id, text,{korean}\n007, 2024,가\n8, hello,나\n", encoding="utf-8")
    sources = PredictSources(tmp_path / "model", tmp_path / "runs", tmp_path / "parts")
    with caplog.at_level(logging.WARNING):
        table = sources.read_input(str(path), id_column="id")
    assert list(table.columns) == ["id", "text", "본문"], list(table.columns)
    assert table["id"].tolist() == ["007", "8"]
    assert sources.text_as_written(table, "text")["text"].tolist() == [" 2024", " hello"]
    said = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(said) == 2 and "' text'" in said[0] and "decomposed" in said[1], said
