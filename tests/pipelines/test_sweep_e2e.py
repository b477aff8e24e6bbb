"""Issue 18: a 2x2 sweep of tiny runs through a KedroSession (MLflow child runs, comparison, plot, verdict,
all logged to the parent run), the report's sweep section, then the same sweep after an interruption continues
with its first unfinished run."""

import json
import re
import shutil

import mlflow
import pandas as pd
import pytest
import yaml
from demo_data.logkeys import VOCAB_SIZE, write_demo_logkeys

from tests.support.e2e import TRAIN as BASE_TRAIN
from tests.support.e2e import own_experiment
from tests.support.project import run_pipeline

pytestmark = pytest.mark.e2e
TRAIN = {**BASE_TRAIN, "eval_every": 1, "save_every": None}
REPORT = {
    "eval_max_batches": 1,
    "prompts": ["9 10"],
    "max_new_tokens": 2,
    "worst_samples": 2,
    "error_pairs": 2,
    "decoding": [{"name": "greedy", "do_sample": False}],
}
SWEEP = {
    "name": "tiny",
    "max_steps": 2,
    "metric": "final_val_loss",
    "grid": {"train.optimizer.lr": [0.001, 0.01], "train.batching.micro_batch_size": [4, 8]},
}


def test_sweep_2x2_child_runs_comparison_and_resume(kedro_project, mlflow_uri):
    own_experiment(kedro_project, "sweep-e2e")
    raw = write_demo_logkeys(kedro_project / "data/01_raw/logkeys.jsonl", n=200, seed=0)
    (kedro_project / "sweep.yml").write_text(yaml.safe_dump(SWEEP, sort_keys=False))
    params = {
        "raw_path": str(raw.relative_to(kedro_project)),
        "sweep": "sweep.yml",
        "train": TRAIN,
        "split": {"pretokenized": True, "vocab_size": VOCAB_SIZE, "max_length": 48},
    }
    run_pipeline(kedro_project, "split", params)
    run_pipeline(kedro_project, "sweep", params)

    names = ["tiny-01", "tiny-02", "tiny-03", "tiny-04"]
    table = pd.read_csv(kedro_project / "data/08_reporting/sweep_comparison.csv")
    assert sorted(table["run"]) == names and table["final_val_loss"].is_monotonic_increasing
    assert set(zip(table["train.optimizer.lr"], table["train.batching.micro_batch_size"], strict=True)) == {
        (0.001, 4),
        (0.001, 8),
        (0.01, 4),
        (0.01, 8),
    }
    assert (table["steps"] == 2).all() and (table["wall_time_s"] > 0).all()
    assert table["test_loss"].gt(0).all() and table["test_top5_accuracy"].between(0, 1).all()
    assert table["peak_memory_mb"].notna().all() and table["real_tokens_per_s"].gt(0).all()
    assert (
        "test_rouge1" not in table and table["stopped"].isna().all()
    )  # log keys: no references; no budget hit
    verdict = (kedro_project / "data/08_reporting/sweep.md").read_text()
    assert f"{table['run'][0]} (optimizer.lr" in verdict and "is best by final_val_loss" in verdict
    assert (kedro_project / "data/08_reporting/plots/sweep_loss.png").stat().st_size > 0
    # the best setting as a run configuration: `kedro run --config <file>` trains it (no fold, the budget)
    command = re.compile(r"kedro run --config \S*data/08_reporting/sweep_best_run\.yml")
    best_file = (kedro_project / "data/08_reporting/sweep_best_run.yml").read_text()
    best = yaml.safe_load(best_file)["run"]
    assert command.search(best_file) and command.search(verdict) and best["pipeline"] == "train"
    best_train = best["params"]["train"]  # the sweep's train parameters, its best setting and budget
    assert (
        best_train["optimizer"]["lr"] == float(table["train.optimizer.lr"][0])
        and best_train["max_steps"] == 2
    )
    assert best_train["batching"]["micro_batch_size"] == int(table["train.batching.micro_batch_size"][0])
    assert (
        params["split"].items() <= best["params"]["split"].items()
        and best["params"]["run_name"] == "tiny-best"
    )

    mlflow.set_tracking_uri(mlflow_uri)
    experiment = mlflow.get_experiment_by_name("sweep-e2e")
    runs = mlflow.search_runs([experiment.experiment_id])
    parent = runs[runs["tags.mlflow.runName"].str.startswith("sweep-")]
    assert len(parent) == 1
    children = runs[runs["tags.mlflow.parentRunId"] == parent["run_id"].iloc[0]]
    assert sorted(children["tags.mlflow.runName"]) == names
    assert set(children["params.train.optimizer.lr"]) == {"0.001", "0.01"}
    assert children["metrics.test_loss"].gt(0).all()
    per_run = pd.read_csv(kedro_project / "data/08_reporting/sweep_folds.csv")  # no folds: no aggregate
    assert set(per_run["row"]) == {"run"} and "fold" not in per_run
    assert dict(zip(per_run["run"], per_run["run_id"], strict=True)) == dict(
        zip(children["tags.mlflow.runName"], children["run_id"], strict=True)
    )
    assert not [column for column in runs if column.startswith("metrics.cv/")]
    logged = {item.path for item in mlflow.MlflowClient().list_artifacts(parent["run_id"].iloc[0], "sweep")}
    assert logged == {
        "sweep/sweep_comparison.csv",
        "sweep/sweep.md",
        "sweep/sweep_loss.png",
        "sweep/sweep_folds.csv",  # no folds: one row per run, with its MLflow run id
        "sweep/sweep_best_run.yml",
    }  # the parent run

    # A report after the sweep has the sweep's section: its verdict, table and the all-runs loss plot.
    run_pipeline(kedro_project, "train", {**params, **best["params"]})  # as `kedro run --config` does
    summary = json.loads((kedro_project / "data/08_reporting/train_summary.json").read_text())
    assert summary["micro_batch_size"] == best_train["batching"]["micro_batch_size"] and summary["steps"] == 2
    run_pipeline(kedro_project, "report", {**params, "report": REPORT})
    report = (kedro_project / "data/08_reporting/report.html").read_text()
    assert '<section id="sweep-tiny">' in report and verdict.split("\n\n")[1].split(" To train")[0] in report
    assert '<img id="fig-sweep-loss"' in report and all(
        f'<td class="text">{name}</td>' in report for name in names
    )

    # Interrupted after two runs: the rerun keeps runs 1-2 untouched and trains 3-4 again.
    state = kedro_project / "data/08_reporting/sweeps/tiny"
    kept = {name: (state / name / "summary.json").read_bytes() for name in names[:2]}
    for name in names[2:]:
        shutil.rmtree(state / name)
    run_pipeline(kedro_project, "sweep", params)
    assert {name: (state / name / "summary.json").read_bytes() for name in names[:2]} == kept
    for name in names[2:]:
        assert json.loads((state / name / "summary.json").read_text())["run_name"] == name
    assert len(pd.read_csv(kedro_project / "data/08_reporting/sweep_comparison.csv")) == 4
    runs = mlflow.search_runs([experiment.experiment_id])
    second = (
        runs[runs["tags.mlflow.runName"].str.startswith("sweep-")]
        .sort_values("start_time")["run_id"]
        .iloc[-1]
    )
    assert sorted(runs[runs["tags.mlflow.parentRunId"] == second]["tags.mlflow.runName"]) == names[2:]
