"""split -> train -> report on prompt/response data: test-split generations scored with ROUGE, in the metrics,
the predictions CSV, MLflow, the HTML and Markdown report and the run comparison. (Plain-text data: see
test_report_e2e, where the report has no ROUGE.)"""

import json

import numpy as np
import pandas as pd
import pytest

from tests.conftest import run_pipeline
from tests.pipelines.test_train_e2e import TRAIN

pytestmark = pytest.mark.e2e
RAW = "data/01_raw/dialogues.jsonl"
TOPICS = {"배송": "배송 문의 답변", "가격": "가격 문의 답변", "환불": "환불 문의 답변"}
SPLIT = {"prompt_column": "dialogue", "response_column": "summary", "tokenizer": {"vocab_size": 400},
         "max_length": 48, "ratios": {"train": 0.8, "validation": 0.1, "test": 0.1}}
REPORT = {"max_new_tokens": 4, "prompts": [""], "decoding": [{"name": "greedy"}], "eval_max_batches": 2,
          "references": {"max_samples": 12, "max_new_tokens": 8, "batch_size": 4}}
PARAMS = {"raw_path": RAW, "split": SPLIT, "train": {**TRAIN, "max_steps": 30, "eval_every": 15, "save_every": 30,
                                                      "optimizer": {"lr": 1e-2}},
          "report": REPORT}


def write_dialogues(path, n: int = 240):
    """Korean dialogues whose summary is fixed by their topic: a tiny model learns the mapping in seconds."""
    rng = np.random.default_rng(0)
    fillers = ["안녕하세요", "문의 드립니다", "확인 부탁드려요", "언제쯤 되나요", "감사합니다", "네 알겠습니다"]
    rows = []
    for i in range(n):
        topic = list(TOPICS)[i % 3]
        words = [*rng.choice(fillers, size=3), f"{topic} 관련", str(i)]
        rows.append({"dialogue": " ".join(words), "summary": TOPICS[topic]})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def test_report_scores_test_generations_with_rouge_everywhere(kedro_project):
    write_dialogues(kedro_project / RAW)
    run_pipeline(kedro_project, "split", PARAMS)
    run_pipeline(kedro_project, "train", PARAMS)
    run_pipeline(kedro_project, "report", PARAMS)
    out = kedro_project / "data/08_reporting"

    predictions = pd.read_csv(out / "reference_predictions.csv", keep_default_na=False)
    assert len(predictions) == 12 and set(predictions["reference"]) <= set(TOPICS.values())
    assert (predictions["new_tokens"] <= 8).all()
    metrics = json.loads((out / "test_metrics.json").read_text())
    assert metrics["rouge_tokenizer"] == "unicode" and metrics["rouge_samples"] == 12
    assert metrics["rouge1"] == pytest.approx(predictions["rouge1_f1"].mean())
    assert metrics["rouge1"] > 0.5  # the model learnt the summary format; Hangul is scored
    assert metrics["loss"] > 0 and metrics["perplexity"] > 1  # beside loss

    import mlflow

    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name("fastlm").experiment_id
    train_run = client.search_runs(experiment, filter_string="tags.`mlflow.runName` LIKE 'train-%'", max_results=1)[0]
    assert client.get_run(train_run.info.run_id).data.metrics["test_rouge1"] == pytest.approx(metrics["rouge1"])
    runs = pd.read_csv(out / "run_comparison.csv")
    assert runs["test_rouge1"].iloc[0] == pytest.approx(metrics["rouge1"]) and "test_rougeL" in runs

    html, markdown = (out / "report.html").read_text(), (out / "report.md").read_text()
    assert "ROUGE on the test split" in html and "Generations against references" in html
    assert "## ROUGE on the test split" in markdown and predictions["reference"].iloc[0] in markdown

