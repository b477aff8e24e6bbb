"""split -> train -> report on prompt/response data: test-split generations scored with ROUGE, in the metrics,
the predictions CSV, MLflow, the HTML and Markdown report and the run comparison. (Plain-text data: see
test_report_e2e, where the report has no ROUGE.)"""

import json

import pandas as pd
import pytest

from fastlm.reporting.html_report import format_number
from tests.support.dialogues import RAW, REPORT, SPLIT, TOPICS, write_dialogues
from tests.support.e2e import TRAIN
from tests.support.project import run_pipeline
from tests.support.reporting import html_tables

pytestmark = pytest.mark.e2e
PARAMS = {
    "raw_path": RAW,
    "split": SPLIT,
    "train": {**TRAIN, "max_steps": 30, "eval_every": 15, "save_every": 30, "optimizer": {"lr": 1e-2}},
    "report": REPORT,
}


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
    train_run = client.search_runs(
        experiment, filter_string="tags.`mlflow.runName` LIKE 'train-%'", max_results=1
    )[0]
    assert client.get_run(train_run.info.run_id).data.metrics["test_rouge1"] == pytest.approx(
        metrics["rouge1"]
    )
    runs = pd.read_csv(out / "run_comparison.csv")
    assert runs["test_rouge1"].iloc[0] == pytest.approx(metrics["rouge1"]) and "test_rougeL" in runs

    html, markdown = (out / "report.html").read_text(), (out / "report.md").read_text()
    assert "ROUGE on the test split" in html and "Generations against references" in html
    tables = html_tables(html)  # the figures shown are the files', formatted as the report formats a cell
    scores = {row["ROUGE"]: row for row in tables["rouge-on-the-test-split"]}
    for name, key in (("ROUGE-1", "rouge1"), ("ROUGE-2", "rouge2"), ("ROUGE-L", "rougeL")):
        assert scores[name]["F1"] == format_number(metrics[key]), name
        assert scores[name]["precision"] == format_number(metrics[f"{key}_precision"]), name
    [mine] = [row for row in tables["run-comparison"] if row["this run"] == "◀"]
    assert mine["test_rouge1"] == format_number(runs["test_rouge1"].iloc[0])
    samples = tables["generations-against-references"]
    assert [row["ROUGE-1"] for row in samples] == [
        format_number(value) for value in predictions["rouge1_f1"].head(len(samples))
    ]
    assert "## ROUGE on the test split" in markdown and predictions["reference"].iloc[0] in markdown
