"""Prompt/response data end to end (split -> train -> report -> predict) with a prompt template of its own:
the report's sample generations ask the model ``report.prompts`` as predict asks it a prompt (wrapped by the
training's template), and a plain-text model continues them in the report as predict continues a text."""

import json

import pandas as pd
import pytest

from fastlm.corpus.prompts import prompt_token_ids, render_prompt
from fastlm.datasets.pretrained_model import PretrainedModelDataset
from tests.support.dialogues import RAW, write_dialogues
from tests.support.e2e import SPLIT, TRAIN, own_experiment
from tests.support.project import run_pipeline

# kernels: the report's batched greedy samples against predict's (as tests/pipelines/test_predict.py)
pytestmark = [pytest.mark.e2e, pytest.mark.kernels]
TEMPLATE = "### Dialogue:\n{prompt}\n### Summary:\n"
# surrounding spaces and a CRLF (a params file saved on Windows): cleaned as the split cleans a prompt
QUESTIONS = ["배송 관련 문의 드립니다", "  가격 관련\r\n감사합니다 "]
RUNTIME = {"device": "cpu", "precision": "fp32"}  # the report's and predict's too
REPORT = {
    "max_new_tokens": 5,
    "decoding": [{"name": "greedy"}],
    "eval_max_batches": 1,
    "references": {"enabled": False},
    "worst_samples": 2,
    "error_pairs": 2,
}


def spy_on_generation(monkeypatch) -> list[list[int]]:
    """The prompt ids every ``generation.generate_continuations`` call (the report's samples) is given."""
    import fastlm.reporting.predictions
    import fastlm.reporting.references  # noqa: F401 (they hold their own generate_continuations: not spied)
    from fastlm.engine.evaluate import generation

    given, sampled = [], generation.generate_continuations

    def spy(model, prompts, **kwargs):
        given.extend(list(ids) for ids in prompts)
        return sampled(model, prompts, **kwargs)

    monkeypatch.setattr(generation, "generate_continuations", spy)
    return given


def test_a_prompt_model_is_asked_the_report_prompts_with_its_template_as_predict_asks(
    kedro_project, monkeypatch
):
    """The report gave a model trained on "### Dialogue:\\n<dialogue>\\n### Summary:\\n" prompts its sample
    prompts raw ("배송 관련 문의 드립니다"), unlike training and predict: each is now rendered with the
    training's template (stripped, line ends LF, as the split cleans a prompt), its output read as a response,
    and its greedy sample is predict's prediction for that prompt."""
    project = kedro_project
    own_experiment(project, "prompt-report-e2e")
    write_dialogues(project / RAW, n=60)
    split = {
        "prompt_column": "dialogue",
        "response_column": "summary",
        "prompt_template": TEMPLATE,
        "tokenizer": {"vocab_size": 400},
        "max_length": 48,
    }
    train = {**TRAIN, "runtime": RUNTIME}
    params = {"raw_path": RAW, "split": split, "train": train, "report": {**REPORT, "prompts": QUESTIONS}}
    run_pipeline(project, "split", params)
    run_pipeline(project, "train", params)
    record = json.loads((project / "data/06_models/model/training_data.json").read_text())
    assert record["data_format"]["prompt_template"] == TEMPLATE

    given = spy_on_generation(monkeypatch)
    run_pipeline(project, "report", params)
    tokenizer = PretrainedModelDataset(str(project / "data/06_models/model")).load()["tokenizer"]
    cleaned = [question.replace("\r\n", "\n").strip() for question in QUESTIONS]
    assert given == [prompt_token_ids(tokenizer, render_prompt(text, TEMPLATE)) for text in cleaned]
    assert all("### Summary:" in tokenizer.decode(ids) for ids in given)
    samples = pd.read_csv(project / "data/08_reporting/sample_generations.csv", keep_default_na=False)
    assert samples["prompt"].tolist() == [q.replace("\r\n", "\n") for q in QUESTIONS]  # as written

    (project / "data/01_raw/questions.jsonl").write_text(
        "".join(json.dumps({"dialogue": q}, ensure_ascii=False) + "\n" for q in QUESTIONS), encoding="utf-8"
    )
    predict = {"input": "data/01_raw/questions.jsonl", "prompt_column": "dialogue", "max_new_tokens": 5}
    run_pipeline(project, "predict", {**params, "predict": predict})
    predictions = pd.read_csv(project / "data/07_model_output/predictions.csv", keep_default_na=False)
    assert predictions["input_tokens"].tolist() == [len(ids) for ids in given]
    assert predictions["prediction"].tolist() == samples["output"].tolist()


def test_a_text_model_continues_the_report_prompts_as_predict_continues_a_text(kedro_project, monkeypatch):
    """Plain-text data: the report's prompts stay the text the model continues (no template), tokenized and
    decoded as predict tokenizes and decodes a text it continues; the greedy samples are predict's."""
    project = kedro_project
    own_experiment(project, "text-report-e2e")
    texts = ["The battery", "배송"]  # no surrounding space: predict strips its inputs, the report does not
    params = {
        "split": SPLIT,
        "train": {**TRAIN, "runtime": RUNTIME},
        "report": {**REPORT, "prompts": texts},
    }
    run_pipeline(project, "split", params)
    run_pipeline(project, "train", params)
    given = spy_on_generation(monkeypatch)
    run_pipeline(project, "report", params)
    tokenizer = PretrainedModelDataset(str(project / "data/06_models/model")).load()["tokenizer"]
    assert given == [prompt_token_ids(tokenizer, text) for text in texts]
    samples = pd.read_csv(project / "data/08_reporting/sample_generations.csv", keep_default_na=False)

    (project / "data/01_raw/texts.jsonl").write_text(
        "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8"
    )
    predict = {"input": "data/01_raw/texts.jsonl", "max_new_tokens": 5}
    run_pipeline(project, "predict", {**params, "predict": predict})
    predictions = pd.read_csv(project / "data/07_model_output/predictions.csv", keep_default_na=False)
    assert predictions["input_tokens"].tolist() == [len(ids) for ids in given]
    assert predictions["prediction"].tolist() == samples["output"].tolist()
