"""k-fold runs end to end: a train run asking for a fold of data split without folds is refused in one line;
`split.folds=2` keeps the test rows where they were; a sweep with ``folds: auto`` trains one model per fold
(MLflow child runs) and its report gives the mean and spread of each metric over the folds."""

import json

import datasets
import mlflow
import pandas as pd
import pytest
import yaml
from demo_data.logkeys import VOCAB_SIZE, write_demo_logkeys

from fastlm import sweep_training
from fastlm.corpus.fingerprint import identity_of_test_split
from tests.support.e2e import TRAIN as BASE_TRAIN
from tests.support.e2e import own_experiment
from tests.support.logs import module_log_lines
from tests.support.project import run_pipeline

pytestmark = pytest.mark.e2e
TRAIN = {**BASE_TRAIN, "eval_every": 1, "save_every": None}
SWEEP = {"name": "cv", "max_steps": 2, "metric": "final_val_loss", "folds": "auto"}


def test_two_fold_sweep_reports_mean_and_spread(kedro_project, mlflow_uri, monkeypatch):
    own_experiment(kedro_project, "kfold-e2e")
    raw = write_demo_logkeys(kedro_project / "data/01_raw/logkeys.jsonl", n=200, seed=0)
    (kedro_project / "folds.yml").write_text(yaml.safe_dump(SWEEP, sort_keys=False))
    split = {"pretokenized": True, "vocab_size": VOCAB_SIZE, "max_length": 48}
    params = {
        "raw_path": str(raw.relative_to(kedro_project)),
        "sweep": "folds.yml",
        "train": TRAIN,
        "split": split,
    }
    splits_path = kedro_project / "data/03_primary/corpus_splits.parquet"

    run_pipeline(kedro_project, "split", params)
    plain = pd.read_parquet(splits_path)
    data = kedro_project / "data/05_model_input"
    plain_test = identity_of_test_split(  # the fold runs' test split is this one: their test figures compare
        json.loads((data / "tokenized_corpus_fingerprint.json").read_text()),
        datasets.load_from_disk(str(data / "tokenized_corpus"))["test"],
    )
    with pytest.raises(Exception, match=r"train.fold = 0 .*split.folds") as raised:
        run_pipeline(kedro_project, "train", {**params, "train": {**TRAIN, "fold": 0}})
    assert "\n" not in str(raised.value)

    folded_params = {**params, "split": {**split, "folds": 2}}
    run_pipeline(kedro_project, "split", folded_params)
    folded = pd.read_parquet(splits_path)
    test = plain["split"] == "test"
    pd.testing.assert_frame_equal(folded.loc[test, ["text", "split"]], plain.loc[test, ["text", "split"]])
    assert list(folded["split"]) == list(plain["split"]) and set(folded.loc[~test, "fold"]) == {0, 1}

    # the folds come from the data: no split.folds needed, and another count in the conf is said, once
    said = module_log_lines(monkeypatch, sweep_training)
    run_pipeline(kedro_project, "sweep", {**params, "split": {**split, "folds": 5}})
    mismatch = [line for line in said if "split.folds = 5" in line]
    assert len(mismatch) == 1 and "split into 2 folds" in mismatch[0], said
    table = pd.read_csv(kedro_project / "data/08_reporting/sweep_comparison.csv")
    assert sorted(table["run"]) == ["cv-01", "cv-02"] and sorted(table["train.fold"]) == [0, 1]
    state = kedro_project / "data/08_reporting/sweeps/cv"
    summaries = [json.loads((state / name / "summary.json").read_text()) for name in ("cv-01", "cv-02")]
    assert [summary["fold"] for summary in summaries] == [0, 1]
    assert [summary["test_data"] for summary in summaries] == [plain_test] * 2 and plain_test
    in_folds = (~test).sum()  # each fold trains on the train/validation rows outside it
    fold_sizes = folded.loc[~test, "fold"].value_counts()
    trained = [summary["train_samples"] for summary in summaries]
    assert trained == [in_folds - fold_sizes[fold] for fold in (0, 1)]
    # what the report says of a fold run: which fold of how many, on what rows
    assert [(s["folds"], s["validation_samples"]) for s in summaries] == [(2, fold_sizes[f]) for f in (0, 1)]
    document = (kedro_project / "data/08_reporting/sweep.md").read_text()
    assert "Over 2 folds: final_val_loss mean" in document and "## Mean and spread over folds" in document
    spread = [line for line in document.splitlines() if line.startswith("| final_val_loss ")]
    assert len(spread) == 1
    mean, std, low, high = (float(cell) for cell in spread[0].strip(" |").split("|")[2:6])
    losses = table["final_val_loss"]  # the document shows 4 significant digits
    assert (low, high) == pytest.approx((losses.min(), losses.max()), rel=1e-3)
    assert mean == pytest.approx(losses.mean(), rel=1e-3) and std == pytest.approx(losses.std(), rel=1e-3)

    # The same figures for code: sweep_folds.csv (one row per fold, then count/mean/std/min/max) and the
    # sweep's MLflow run (cv/ metrics, the CSV as an artifact); each fold row names its child run.
    folds = pd.read_csv(kedro_project / "data/08_reporting/sweep_folds.csv")
    assert list(folds["row"]) == ["fold", "fold", "count", "mean", "std", "min", "max"]
    assert list(folds["fold"][:2]) == [0, 1] and set(folds["status"][:2]) == {"completed"}
    statistics = folds.set_index("row")["final_val_loss"]  # from the summaries, as the table's column
    assert statistics["mean"] == pytest.approx(losses.mean(), rel=1e-12) and statistics["count"] == 2
    mlflow.set_tracking_uri(mlflow_uri)
    runs = mlflow.search_runs([mlflow.get_experiment_by_name("kfold-e2e").experiment_id])
    sweep_run = runs[runs["tags.mlflow.runName"].str.startswith("sweep-")]
    assert len(sweep_run) == 1
    metrics = sweep_run.iloc[0]
    assert (metrics["metrics.cv/folds"], metrics["metrics.cv/folds_completed"]) == (2, 2)
    assert metrics["metrics.cv/final_val_loss_mean"] == pytest.approx(statistics["mean"], rel=1e-12)
    assert metrics["metrics.cv/final_val_loss_std"] == pytest.approx(statistics["std"], rel=1e-12)
    children = runs[runs["tags.mlflow.parentRunId"] == metrics["run_id"]]
    assert dict(zip(children["tags.mlflow.runName"], children["run_id"], strict=True)) == dict(
        zip(folds["run"][:2], folds["run_id"][:2], strict=True)
    )
    logged = mlflow.MlflowClient().list_artifacts(metrics["run_id"], "sweep")
    assert "sweep/sweep_folds.csv" in {item.path for item in logged}
