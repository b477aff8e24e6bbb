"""split -> train -> report through a KedroSession, and the report's bad-input cases."""

import json

import pandas as pd
import pytest

from fastlm.errors import InputDataError, find_user_error
from fastlm.reporting.html_report import format_number
from tests.support.browser import find_chromium, run_chromium
from tests.support.e2e import SPLIT, TRAIN, own_experiment
from tests.support.project import run_pipeline
from tests.support.reporting import html_tables

pytestmark = pytest.mark.e2e
REPORT = {"max_new_tokens": 5, "prompts": ["", "배송"], "worst_samples": 3, "error_pairs": 5}
PARAMS = {"split": SPLIT, "train": TRAIN, "report": REPORT}


def test_report_writes_summaries_evaluation_plots_comparison_and_one_html(kedro_project, tmp_path):
    own_experiment(kedro_project, "report-e2e")  # the session's MLflow store holds other tests' training runs
    run_pipeline(kedro_project, "split", PARAMS)
    run_pipeline(kedro_project, "train", PARAMS)
    run_pipeline(
        kedro_project,
        "train",
        {**PARAMS, "train": {**TRAIN, "batching": {"mode": "dynamic"}, "resume": "never"}},
    )
    run_pipeline(kedro_project, "report", PARAMS)
    out = kedro_project / "data/08_reporting"

    training = pd.read_csv(out / "training_summary.csv")
    efficiency = pd.read_csv(out / "efficiency_summary.csv")
    assert len(training) == 1 and training["steps"].iloc[0] == 6 and training["batching"].iloc[0] == "dynamic"
    assert len(efficiency) == 1 and efficiency["real_tokens_per_s"].iloc[0] > 0
    diagnosis = json.loads((out / "bottleneck_diagnosis.json").read_text())
    kinds = {f["kind"]: f["triggered"] for f in diagnosis["findings"]}
    assert kinds["padding-bound"] is True  # dynamic padding on heavy-tailed lengths wastes most tokens
    assert diagnosis["epoch_eta"]["seconds"] > 0

    metrics = json.loads((out / "test_metrics.json").read_text())
    assert 0 <= metrics["accuracy"] <= metrics["top5_accuracy"] <= 1 and metrics["perplexity"] > 1
    # the model, its test metrics and the summary are one training's (the report checks it)
    trained = json.loads((kedro_project / "data/06_models/model/training_data.json").read_text())
    summary = json.loads((out / "train_summary.json").read_text())
    assert len(summary["training_id"]) == 32 and trained["training_id"] == summary["training_id"]
    assert metrics["training_id"] == summary["training_id"]
    assert (
        "rouge1" not in metrics and pd.read_csv(out / "reference_predictions.csv").empty
    )  # plain text: no ROUGE
    assert len(pd.read_csv(out / "worst_samples.csv")) == 3
    generations = pd.read_csv(out / "sample_generations.csv", keep_default_na=False)
    assert set(generations["setting"]) == {"greedy", "sampled"} and len(generations) == 4
    for name in ("loss", "throughput", "learning_rate", "memory"):
        assert (out / "plots" / f"{name}.png").stat().st_size > 5_000

    runs = pd.read_csv(out / "run_comparison.csv")
    assert len(runs) == 2 and set(runs["train.batching.mode"]) == {"packed", "dynamic"}  # only what differs
    assert "train.seed" not in runs.columns

    import mlflow

    client = mlflow.MlflowClient()
    report_run = client.search_runs(
        client.get_experiment_by_name("report-e2e").experiment_id,
        filter_string="tags.`mlflow.runName` LIKE 'report-%'",
        max_results=1,
    )[0]
    logged = {item.path for item in client.list_artifacts(report_run.info.run_id, "report")}
    assert {"report/report.html", "report/report.md"} <= logged

    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 4 and "http://" not in html and "https://" not in html
    # the figures the report shows are the files', formatted as the report formats a cell
    tables = html_tables(html)
    shown = {row["metric"]: row["value"] for row in tables["test-split-evaluation"]}
    assert shown["loss"] == format_number(metrics["loss"]) and shown["accuracy"] == format_number(
        metrics["accuracy"]
    )
    speeds = {row["figure"]: row["value"] for row in tables["efficiency"]}
    assert speeds["real_tokens_per_s"] == format_number(efficiency["real_tokens_per_s"].iloc[0])
    mine = runs[runs["this run"] == "◀"].iloc[0]
    [shown_mine] = [row for row in tables["run-comparison"] if row["this run"] == "◀"]
    for column in ("final_train_loss", "final_val_loss", "test_loss", "real_tokens_per_s"):
        assert shown_mine[column] == format_number(mine[column]), column
    markdown = (out / "report.md").read_text()
    assert "Bottleneck diagnosis" in markdown
    curves = ("loss", "throughput", "learning_rate", "memory")
    assert all(f"](plots/{name}.png)" in markdown for name in curves), markdown
    assert "ROUGE" not in html and "test_rouge1" not in runs.columns
    before = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    with pytest.raises(Exception) as raised:  # a bad report parameter: one line before any node writes
        run_pipeline(kedro_project, "report", {**PARAMS, "report": {**REPORT, "top_k": 0}})
    assert "report.top_k" in str(find_user_error(raised.value))
    assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == before

    chromium = find_chromium()
    if chromium is not None:  # CI installs it; the DOM as the browser built it
        dom = run_chromium(
            chromium, tmp_path / "profile", "--dump-dom", (out / "report.html").as_uri()
        ).stdout
        assert dom.count("<img") == 4 and dom.count("<table") >= 8 and "Run comparison" in dom


def test_report_before_training_names_the_pipeline_to_run(kedro_project):
    run_pipeline(kedro_project, "split", PARAMS)
    with pytest.raises(Exception) as raised:
        run_pipeline(kedro_project, "report", PARAMS)
    error = find_user_error(raised.value)
    assert isinstance(error, InputDataError) and "run `kedro run --pipeline=train` first" in str(error)
    assert not (kedro_project / "data/08_reporting/report.html").exists()


def test_history_without_steps_is_refused(kedro_project):
    from fastlm.pipelines.report.nodes import summarize_training

    with pytest.raises(InputDataError, match="has no training steps"):
        summarize_training({}, pd.DataFrame(), pd.DataFrame())
