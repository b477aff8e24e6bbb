"""What reaches MLflow, end to end: artefacts next to the project's own store (also after a copy), typed
parameters, clean tags, a fractional epoch, every report output the README lists, no run for a parameter
typo and FAILED for a failed run."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from tests.support.e2e import SPLIT, TRAIN
from tests.support.project import PROJECT_ROOT, run_pipeline

pytestmark = pytest.mark.e2e
TINY_TRAIN = {**TRAIN, "max_steps": 4, "eval_every": 4, "save_every": 4, "resume": "never"}
REPORT = {
    "max_new_tokens": 3,
    "prompts": ["배송"],
    "worst_samples": 2,
    "error_pairs": 3,
    "eval_max_batches": 2,
}
PARAMS = {"split": SPLIT, "train": TINY_TRAIN, "report": REPORT}


def readme_report_outputs() -> set[str]:
    """The file names the README's report section says are written (and logged to MLflow)."""
    readme = (PROJECT_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("### report", 1)[1].split("#### ROUGE", 1)[0]
    names = re.findall(r"`([\w/.]+\.(?:csv|json|png|html|md))`", section)
    return {Path(name).name for name in names if "*" not in name}


def runs_of(project: Path) -> list:
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("fastlm")
    return client.search_runs([experiment.experiment_id], max_results=100) if experiment else []


def artifact_files(run, project: Path) -> set[str]:
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    found, folders = set(), [None]
    while folders:
        for item in client.list_artifacts(run.info.run_id, folders.pop()):
            (folders.append(item.path) if item.is_dir else found.add(item.path))
    return found


@pytest.fixture
def own_store(kedro_project, monkeypatch):
    """The project's default store: sqlite:///mlflow.db in the project folder (no MLFLOW_TRACKING_URI)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    return kedro_project


def test_tracking_is_relative_typed_complete_and_honest(own_store, tmp_path, monkeypatch):
    project = own_store
    run_pipeline(project, "split", PARAMS)
    run_pipeline(project, "train", PARAMS)
    run_pipeline(project, "report", PARAMS)
    # Default run names are "<pipeline>-<timestamp>": one run of each pipeline here.
    runs = {run.info.run_name.split("-", 1)[0]: run for run in runs_of(project)}
    assert sorted(runs) == ["report", "split", "train"], sorted(runs)

    train = runs["train"]
    assert train.info.status == "FINISHED"
    assert "None" not in train.data.params.values()  # unset values are not logged as the string 'None'
    assert json.loads(
        train.data.params["report.prompts"]
        if "report.prompts" in train.data.params
        else runs["report"].data.params["report.prompts"]
    ) == ["배송"]
    assert not [value for value in train.data.tags.values() if " object at 0x" in value]
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    epochs = [metric.value for metric in client.get_metric_history(train.info.run_id, "train/epoch")]
    assert (
        epochs == sorted(epochs) and 0 < epochs[-1] and epochs[0] < epochs[-1]
    )  # progress, not 0 every step
    assert {"train_summary.json"} <= artifact_files(train, project)
    assert (project / "mlruns").is_dir()

    logged = {Path(path).name for path in artifact_files(runs["report"], project)}
    assert readme_report_outputs() - logged == set()

    # A copy of the project (store and all) writes its artefacts into the copy, not the original.
    copy = tmp_path.parent / f"{tmp_path.name}-copy"
    shutil.copytree(project, copy)
    shutil.rmtree(project / "mlruns")
    monkeypatch.chdir(copy)  # MLflow caches a store per URI within a process: name the copy's by its path
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{copy / 'mlflow.db'}")
    run_pipeline(copy, "train", PARAMS)
    newest = max(runs_of(copy), key=lambda run: run.info.start_time)
    assert "train_summary.json" in artifact_files(newest, copy)
    assert any((copy / "mlruns").rglob("train_summary.json")) and not (project / "mlruns").exists()

    # A parameter typo is refused before any node runs: no run is left behind; nor by a raw file that is
    # missing or of an unknown kind (its reader refused it only when the split loaded it, after MLflow had
    # opened a run, which stayed FAILED)
    before = len(runs_of(copy))
    with pytest.raises(Exception, match="max_stesp"):
        run_pipeline(copy, "train", {**PARAMS, "train": {**TINY_TRAIN, "max_stesp": 5}})
    (copy / "data/01_raw/corpus.docx").write_bytes(b"PK\x03\x04 a word document")
    for raw, refused in (
        ("data/01_raw/nope.csv", "does not exist"),
        ("data/01_raw/corpus.docx", "extension"),
    ):
        with pytest.raises(Exception, match=refused):
            run_pipeline(copy, "split", {**PARAMS, "raw_path": raw})
    assert len(runs_of(copy)) == before


def split_runs(project: Path) -> int:
    return sum(run.info.run_name.startswith("split") for run in runs_of(project))


def test_sessions_of_two_projects_in_one_process_track_each_into_its_own_store(
    kedro_project, tmp_path_factory, sample_texts, monkeypatch
):
    """Round eight: in one process (a notebook, a script), a run of one project and then of another, each with
    the default store (``sqlite:///mlflow.db``, no MLFLOW_TRACKING_URI): the second project's runs went into
    the first project's mlflow.db (MLflow keeps a database connection per URI text, and the text was the
    same), and a store set by one session (conf/local/mlflow.yml) leaked into the next session as if the user
    had set MLFLOW_TRACKING_URI. Each session's runs go to its own configured store, and what it set for
    MLflow process-wide is put back at its end."""
    import yaml

    from tests.support.project import make_kedro_project

    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    first = kedro_project
    second = make_kedro_project(tmp_path_factory.mktemp("second") / "project", sample_texts)
    third = make_kedro_project(tmp_path_factory.mktemp("third") / "project", sample_texts)
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "mlflow.db"
    mlflow_yml = yaml.safe_load((first / "conf/base/mlflow.yml").read_text(encoding="utf-8"))
    mlflow_yml["server"]["mlflow_tracking_uri"] = f"sqlite:///{elsewhere}"
    (third / "conf/local/mlflow.yml").write_text(yaml.safe_dump(mlflow_yml), encoding="utf-8")

    run_pipeline(first, "split", PARAMS)
    monkeypatch.chdir(second)
    run_pipeline(second, "split", PARAMS)
    assert (split_runs(first), split_runs(second)) == (1, 1)

    monkeypatch.chdir(third)
    run_pipeline(third, "split", PARAMS)  # its own store, named in its conf/local/mlflow.yml
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{elsewhere}")
    assert len(client.search_runs([client.get_experiment_by_name("fastlm").experiment_id])) == 1
    assert "MLFLOW_TRACKING_URI" not in os.environ  # the user set none: the next session reads none
    monkeypatch.chdir(second)
    run_pipeline(second, "split", PARAMS)
    assert (split_runs(first), split_runs(second)) == (1, 2)


class _RefuseIPython:
    """A finder that notes every lookup of IPython and finds nothing (a process without it installed)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def find_spec(self, name, path=None, target=None):
        if name == "IPython" or name.startswith("IPython."):
            self.asked.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def test_a_tracked_run_outside_a_notebook_never_imports_ipython(own_store, monkeypatch):
    """MLflow's run start asks IPython for a notebook's ``dbutils`` (its check of a Databricks job): with
    IPython installed (Kedro's and Jupyter's dependency) every tracked `kedro run` imported IPython and jedi,
    ~0.4 s of its start, to learn it is in no notebook. A process that has not imported IPython runs in no
    IPython shell, so the run asks nothing of it; in a notebook (IPython imported) MLflow looks as before."""
    import sys

    for name in [name for name in sys.modules if name == "IPython" or name.startswith("IPython.")]:
        monkeypatch.delitem(sys.modules, name)
    finder = _RefuseIPython()
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    run_pipeline(own_store, "split", PARAMS)
    assert [run.info.status for run in runs_of(own_store)] == ["FINISHED"]
    assert finder.asked == [] and "IPython" not in sys.modules
