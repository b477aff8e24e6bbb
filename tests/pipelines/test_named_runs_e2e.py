"""Named runs end to end: run_name names the MLflow run, the checkpoint folder, the per-run model and report
copies and the report title; data/06_models/model holds the latest. Re-splitting on other data and training
again trains a new model that matches the new tokenizer (the old checkpoint is not resumed)."""

import hashlib
import json
from pathlib import Path

import mlflow
import pytest
from safetensors.torch import load_file

from fastlm.errors import ConfigError, find_user_error
from tests.support import background
from tests.support.project import run_pipeline, run_quick, write_jsonl
from tests.support.runner_jobs import runs_under_the_parallel_and_thread_runners

pytestmark = pytest.mark.e2e
SPLIT = {"max_samples": 300, "max_length": 48, "tokenizer": {"vocab_size": 400}}
TRAIN = {
    "max_steps": 4,
    "log_every": 2,
    "eval_every": 2,
    "save_every": 2,
    "quiet": True,
    "resume": "auto",
    "batching": {"micro_batch_size": 8},
    "model": {"hidden_size": 32, "intermediate_size": 64},
}


def _digest(folder: Path) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def _tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def test_named_runs_keep_their_outputs_and_the_model_folder_holds_the_latest(kedro_project):
    run_quick(kedro_project, "split", {"split": SPLIT})
    run_quick(kedro_project, "train", {"split": SPLIT, "train": TRAIN, "run_name": "exp-a"})
    run_quick(
        kedro_project,
        "train",
        {"split": SPLIT, "train": {**TRAIN, "optimizer": {"lr": 0.01}}, "run_name": "exp-b"},
    )
    models = kedro_project / "data/06_models"
    for name in ("exp-a", "exp-b"):
        assert (models / "checkpoints_quick" / name / "checkpoint-00000004" / "COMPLETE").is_file()
        assert (models / "runs" / name / "model" / "model.safetensors").is_file()
        summary = json.loads(
            (kedro_project / "data/08_reporting/runs" / name / "train_summary.json").read_text()
        )
        assert summary["run_name"] == name and summary["steps_trained"] == 4
    assert (
        _digest(models / "model")
        == _digest(models / "runs/exp-b/model")
        != _digest(models / "runs/exp-a/model")
    )
    assert (
        json.loads((kedro_project / "data/08_reporting/train_summary.json").read_text())["run_name"]
        == "exp-b"
    )

    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name("fastlm").experiment_id
    for name in ("exp-a", "exp-b"):
        assert client.search_runs(experiment, filter_string=f"tags.`mlflow.runName` = '{name}'")

    run_quick(kedro_project, "report", {"split": SPLIT, "train": TRAIN})
    report = kedro_project / "data/08_reporting/runs/exp-b/report.html"
    assert report.is_file() and "exp-b" in report.read_text(encoding="utf-8").split("</h1>")[0]

    before = _tree(kedro_project / "data")
    with pytest.raises(Exception) as raised:
        run_quick(kedro_project, "train", {"split": SPLIT, "train": TRAIN, "run_name": "../escape"})
    error = find_user_error(raised.value)
    assert isinstance(error, ConfigError) and "run_name" in str(error) and "\n" not in str(error)
    assert _tree(kedro_project / "data") == before


def test_resplit_on_other_data_then_train_trains_a_model_for_the_new_tokenizer(kedro_project, sample_texts):
    params = {"split": SPLIT, "train": TRAIN, "run_name": "demo"}
    run_pipeline(kedro_project, "split", {"split": SPLIT})
    run_pipeline(kedro_project, "train", params)
    first = load_file(kedro_project / "data/06_models/model/model.safetensors")

    write_jsonl(kedro_project / "data/01_raw/demo_corpus.jsonl", [text[::-1] for text in sample_texts])
    run_pipeline(kedro_project, "split", {"split": SPLIT})
    run_pipeline(kedro_project, "train", params)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fastlm.corpus.fingerprint import data_identity

    folder = kedro_project / "data/06_models/model"
    summary = json.loads((kedro_project / "data/08_reporting/train_summary.json").read_text())
    assert summary["steps_trained"] == 4 and summary["resumed_from"] is None
    second = load_file(folder / "model.safetensors")
    assert any(not (first[name] == second[name]).all() for name in first)
    tokenizer = AutoTokenizer.from_pretrained(
        kedro_project / "data/06_models/tokenizer", local_files_only=True
    )
    saved = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert saved.get_vocab() == tokenizer.get_vocab()
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    assert model.config.vocab_size == len(tokenizer)
    # the model records the data it was trained on: the second split's, as its run's copy does
    fingerprint = json.loads(
        (kedro_project / "data/05_model_input/tokenized_corpus_fingerprint.json").read_text()
    )
    for kept in (folder, kedro_project / "data/06_models/runs/demo/model"):
        record = json.loads((kept / "training_data.json").read_text())
        assert record == {  # plain text; the data identity (fingerprint and texts); the rows' length; its id
            "fingerprint": data_identity(fingerprint),
            "data_format": None,
            "max_length": fingerprint["params"]["max_length"],
            "training_id": summary["training_id"],
        }
    old = list((kedro_project / "data/06_models/checkpoints/demo").glob("superseded-*/checkpoint-00000004"))
    assert len(old) == 1  # the first run's checkpoints are kept aside, not resumed and not deleted


@pytest.mark.background(job=runs_under_the_parallel_and_thread_runners)
def test_a_report_under_the_parallel_runner_keeps_its_copies_as_a_sequential_one_does():
    """`kedro run --pipeline=report --runner=ParallelRunner` with spawned workers (macOS, or
    KEDRO_MP_CONTEXT=spawn): Kedro calls after_dataset_saved in the workers, on fresh hooks that never saw the
    run start. The per-run copies (data/08_reporting/runs/<training run>/) are this report's, as under the
    sequential runner, and the metrics the workers log are the report run's. Was: no copy written (an earlier
    report's copies left as the run's), and each worker logged to an MLflow run of its own, named at
    random."""
    done = background.result(runs_under_the_parallel_and_thread_runners)
    for run in ("spawn", "train", "report"):
        assert done["runs"][run]["returncode"] == 0, done["runs"][run]["stderr"][-3000:]
    project = done["project"]
    reporting = project / "data/08_reporting"
    for name in ("report.html", "report.md", "test_metrics.json"):
        kept = reporting / "runs" / "exp-p" / name
        assert kept.is_file() and kept.read_bytes() == (reporting / name).read_bytes(), name
    # the workers' metrics are the report run's (was: logged to runs of MLflow's random names, one a worker)
    client = mlflow.MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("fastlm")
    runs = client.search_runs([experiment.experiment_id])
    names = sorted(run.info.run_name.split("-")[0] for run in runs)
    assert names == ["exp", "report", "split", "split", "split"], names  # three splits: the job's
    (report_run,) = [run for run in runs if run.info.run_name.startswith("report-")]
    metrics = json.loads((reporting / "test_metrics.json").read_text())
    assert report_run.data.metrics["test_loss"] == pytest.approx(metrics["loss"], rel=1e-9)
    logged = {item.path for item in client.list_artifacts(report_run.info.run_id, "report")}
    assert "report/report.html" in logged and "report/test_metrics.json" in logged, logged
