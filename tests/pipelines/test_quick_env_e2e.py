"""Quick mode: `kedro run --env quick` merges conf/quick over conf/base key by key and runs split -> train
with evaluation and checkpoints on a capped sample in a few steps."""

import json

import pandas as pd
import pytest
from kedro.framework.session import KedroSession

from tests.support.project import bootstrap, run_quick

pytestmark = pytest.mark.e2e


def test_quick_env_overrides_apply_and_keep_the_rest_of_base(kedro_project):
    bootstrap(kedro_project)
    with KedroSession.create(project_path=kedro_project, env="quick") as session:
        params = session.load_context().params
    assert params["split"]["max_samples"] == 2000 and params["split"]["max_length"] == 320  # quick + base
    train = params["train"]
    assert (train["max_steps"], train["eval_every"], train["save_every"], train["resume"]) == (
        30,
        10,
        10,
        "never",
    )
    assert train["optimizer"]["lr"] == 0.002 and train["batching"]["mode"] == "packed"  # untouched base keys


def test_quick_run_trains_with_eval_and_checkpoints_in_few_steps(kedro_project):
    small = {
        "split": {"max_samples": 300, "max_length": 64},
        "train": {"model": {"hidden_size": 32, "intermediate_size": 64}, "quiet": True},
    }
    run_quick(kedro_project, "split", small)
    report = json.loads((kedro_project / "data/08_reporting/split_report.json").read_text())
    assert report["kept_rows"] == 300 and report["capped_by_max_samples"] > 0
    run_quick(kedro_project, "train", small)
    summary = json.loads((kedro_project / "data/08_reporting/train_summary.json").read_text())
    assert summary["steps"] == 30
    evals = pd.read_csv(kedro_project / "data/07_model_output/eval_history.csv")
    assert list(evals["step"]) == [10, 20, 30]
    checkpoints = sorted(
        p.name for p in (kedro_project / "data/06_models/checkpoints_quick" / summary["run_name"]).iterdir()
    )
    assert checkpoints == ["checkpoint-00000030"]  # keep_last: 1, in the run's own folder
    assert not (kedro_project / "data/06_models/checkpoints").exists()
