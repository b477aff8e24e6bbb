"""Chat data end to end (split -> train -> report -> predict) with Qwen3's chat template in non-thinking mode
(``split.chat_template_kwargs: {enable_thinking: false}``): every render of a chat, at the split, in the
report's sample generations and at predict, is the one the model trained on."""

import json
import logging
import logging.handlers

import datasets
import pandas as pd
import pytest

from fastlm.corpus.prompts import prompt_token_ids, render_messages
from tests.support.chat_templates import qwen3_style_tokenizer
from tests.support.e2e import TRAIN, own_experiment
from tests.support.project import run_pipeline

# kernels: the report's batched greedy samples against predict's (as tests/pipelines/test_predict.py)
pytestmark = [pytest.mark.e2e, pytest.mark.kernels]
THINK_OFF = {"enable_thinking": False}
QUESTIONS = ["배송", "The battery\r\ndied"]  # a CRLF, as a params file saved on Windows holds it
SYSTEM = {"role": "system", "content": "당신은 쇼핑몰 상담원입니다."}


@pytest.fixture
def chat_project(kedro_project, sample_texts):
    tokenizer = qwen3_style_tokenizer(sample_texts, vocab_size=400)
    tokenizer.save_pretrained(kedro_project / "data/01_raw/qwen3_tokenizer")
    earlier = zip(sample_texts[300:450], sample_texts[450:600], strict=True)
    chats = [  # every third chat has an earlier question and answer; every chat the same system turn
        {
            "messages": [
                SYSTEM,
                *(
                    [{"role": "user", "content": asked[:60]}, {"role": "assistant", "content": said[:60]}]
                    if i % 3 == 0
                    else []
                ),
                {"role": "user", "content": question[:60]},
                {"role": "assistant", "content": answer[:60]},
            ]
        }
        for i, (question, answer, (asked, said)) in enumerate(
            zip(sample_texts[:150], sample_texts[150:300], earlier, strict=True)
        )
    ]
    (kedro_project / "data/01_raw/chats.jsonl").write_text(
        "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in chats), encoding="utf-8"
    )
    return kedro_project, tokenizer


def test_a_chat_model_is_prompted_as_it_trained_in_the_report_and_at_predict(chat_project, monkeypatch):
    """The report's sample generations gave a chat model ``report.prompts`` as raw text ("배송" where it
    trained on "<|im_start|>user\\n배송<|im_end|>\\n<|im_start|>assistant\\n<think>..."), unlike predict: each
    is now one user turn rendered with the training's chat format (its template variables included), its
    line ends LF as the split makes them, and its greedy sample is predict's prediction for that chat."""
    import fastlm.reporting.predictions
    import fastlm.reporting.references  # noqa: F401 (they hold their own generate_continuations: not spied)
    from fastlm.engine.evaluate import generation

    project, tokenizer = chat_project
    own_experiment(project, "chat-e2e")
    split = {
        "messages_column": "messages",
        "chat_template_kwargs": THINK_OFF,
        "max_length": 96,
        "tokenizer": {"source": str(project / "data/01_raw/qwen3_tokenizer")},
    }
    report = {
        "max_new_tokens": 5,
        "prompts": QUESTIONS,
        "decoding": [{"name": "greedy"}],
        "references": {"max_samples": 4, "max_new_tokens": 5},
        "worst_samples": 2,
        "error_pairs": 2,
    }
    train = {**TRAIN, "runtime": {"device": "cpu", "precision": "fp32"}}  # the report's and predict's too
    params = {"raw_path": "data/01_raw/chats.jsonl", "split": split, "train": train, "report": report}
    run_pipeline(project, "split", params)
    splits = pd.read_parquet(project / "data/03_primary/corpus_splits.parquet")
    assert splits["prompt"].str.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n").all()
    run_pipeline(project, "train", params)
    record = json.loads((project / "data/06_models/model/training_data.json").read_text())
    assert record["data_format"]["chat_template_kwargs"] == THINK_OFF
    # every answer trained (split.train_turns: all): validation scores the earlier answers too
    validation = datasets.load_from_disk(str(project / "data/05_model_input/tokenized_corpus"))["validation"]
    last_answers = sum(
        len(ids) - n for ids, n in zip(validation["input_ids"], validation["prompt_length"], strict=True)
    )
    earlier = sum(
        end - start
        for spans in validation["answer_spans"]
        for start, end in zip(spans[::2], spans[1::2], strict=True)
    )
    scored = pd.read_csv(project / "data/07_model_output/eval_history.csv")["val_target_tokens"]
    assert earlier > 0 and set(scored) == {last_answers + earlier}

    given = []
    sampled = generation.generate_continuations

    def spy(model, prompts, **kwargs):
        given.extend(list(ids) for ids in prompts)
        return sampled(model, prompts, **kwargs)

    monkeypatch.setattr(generation, "generate_continuations", spy)
    from fastlm.engine.runtime import environment

    runtime_log = logging.Logger("runtime-lines", logging.INFO)  # not the manager's: Kedro's set-up keeps it
    seen = logging.handlers.BufferingHandler(capacity=10_000)
    runtime_log.addHandler(seen)
    monkeypatch.setattr(environment, "log", runtime_log)
    run_pipeline(project, "report", params)
    said = [r.getMessage() for r in seen.buffer if r.getMessage().startswith("runtime: ")]
    assert len(said) == 1, said  # the report's evaluation and generations run on one runtime: said once
    # each one user turn after the system turn every training chat had, as predict asks a line
    turns = [[SYSTEM, {"role": "user", "content": q.replace("\r\n", "\n")}] for q in QUESTIONS]
    rendered = [render_messages(t, "{prompt}", tokenizer, THINK_OFF) for t in turns]
    assert given == [prompt_token_ids(tokenizer, prompt) for prompt in rendered]
    samples = pd.read_csv(project / "data/08_reporting/sample_generations.csv", keep_default_na=False)
    assert samples["prompt"].tolist() == [q.replace("\r\n", "\n") for q in QUESTIONS]

    (project / "data/01_raw/questions.jsonl").write_text(
        "".join(json.dumps({"messages": t}, ensure_ascii=False) + "\n" for t in turns), encoding="utf-8"
    )
    run_pipeline(
        project,
        "predict",
        {**params, "predict": {"input": "data/01_raw/questions.jsonl", "max_new_tokens": 5}},
    )
    predictions = pd.read_csv(project / "data/07_model_output/predictions.csv", keep_default_na=False)
    assert predictions["input_tokens"].tolist() == [len(ids) for ids in given]
    assert predictions["prediction"].tolist() == samples["output"].tolist()
    lines = [q.replace("\r\n", "\n") for q in QUESTIONS if "\n" not in q]
    (project / "data/01_raw/questions.txt").write_text("".join(f"{q}\n" for q in lines), encoding="utf-8")
    run_pipeline(
        project, "predict", {**params, "predict": {"input": "data/01_raw/questions.txt", "max_new_tokens": 5}}
    )
    asked = pd.read_csv(project / "data/07_model_output/predictions.csv", keep_default_na=False)
    assert asked["prediction"].tolist() == samples["output"].tolist()[: len(lines)]
    summary = json.loads((project / "data/08_reporting/predict_summary.json").read_text())
    assert summary["system_prompt"] == SYSTEM["content"]
    for written in (
        "data/06_models/model/training_data.json",
        "data/05_model_input/tokenized_corpus_fingerprint.json",
    ):
        assert SYSTEM["content"] in (project / written).read_text(encoding="utf-8")  # readable, not \uXXXX


def test_tool_calling_chats_split_train_and_predict_with_their_tools(kedro_project, sample_texts):
    """Chats that call a tool (a Qwen-style template writing the tools in the system turn and each call as
    ``<tool_call>{json}</tool_call>``) were dropped by the split and refused by predict. They train, and
    predict asks a chat ending with the tool's result with its tools, as the split rendered its prompt."""
    from tests.support.chat_templates import tool_calling_tokenizer, tool_chat_rows

    project = kedro_project
    own_experiment(project, "tool-chat-e2e")
    tokenizer = tool_calling_tokenizer(sample_texts)
    tokenizer.save_pretrained(project / "data/01_raw/tool_tokenizer")
    rows = tool_chat_rows(60)
    (project / "data/01_raw/tool_chats.jsonl").write_text(
        "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8"
    )
    split = {
        "messages_column": "messages",
        "max_length": 512,
        "tokenizer": {"source": str(project / "data/01_raw/tool_tokenizer")},
        "ratios": {"train": 0.8, "validation": 0.1, "test": 0.1},
    }
    train = {**TRAIN, "max_steps": 2, "eval_every": 2, "save_every": 2, "runtime": {"device": "cpu"}}
    params = {"raw_path": "data/01_raw/tool_chats.jsonl", "split": split, "train": train}
    run_pipeline(project, "split", params)
    report = json.loads((project / "data/08_reporting/split_report.json").read_text())
    splits = pd.read_parquet(project / "data/03_primary/corpus_splits.parquet")
    assert len(splits) == len(rows) and not any(report["dropped"].values())
    assert splits["response"].str.contains("<tool_call>").sum() == len(rows) // 2
    run_pipeline(project, "train", params)

    asked = [{"messages": row["messages"][:3], "tools": row["tools"]} for row in rows[:2]]
    (project / "data/01_raw/tool_questions.jsonl").write_text(
        "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in asked), encoding="utf-8"
    )
    predict = {"input": "data/01_raw/tool_questions.jsonl", "max_new_tokens": 4}
    run_pipeline(project, "predict", {**params, "predict": predict})
    predictions = pd.read_csv(project / "data/07_model_output/predictions.csv", keep_default_na=False)
    expected = [
        prompt_token_ids(tokenizer, render_messages(row["messages"], "{prompt}", tokenizer, {}, row["tools"]))
        for row in asked
    ]
    assert predictions["input_tokens"].tolist() == [len(ids) for ids in expected]
    assert (predictions["refused"] == "").all() and predictions["prediction"].map(type).eq(str).all()
    # each answer's calls read in the template's call format (a tiny model's: none, or markup cut short)
    calls = json.loads((project / "data/08_reporting/predict_summary.json").read_text())["tool_calls"]
    assert calls["rows_asked_with_tools"] == len(asked)
    unread = set(calls["unread_rows"])
    for row, text in zip(predictions["id"], predictions["tool_calls"], strict=True):
        assert (text == "") == (row in unread) and (text == "" or isinstance(json.loads(text), list))
