"""Project-level guarantees: Kedro-free engine, telemetry off, offline by default, registered pipelines."""

import os
import subprocess
import sys

import pytest

CLEAN_ENV = {
    k: v
    for k, v in os.environ.items()
    if k not in {"DO_NOT_TRACK", "MLFLOW_DISABLE_TELEMETRY", "HF_HUB_OFFLINE"}
}


def _python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=CLEAN_ENV, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_engine_and_corpus_never_import_kedro():
    code = (
        "import sys, pkgutil, importlib, fastlm.engine, fastlm.corpus\n"
        "for package in (fastlm.engine, fastlm.corpus):\n"
        "    for info in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "print(sorted(m for m in sys.modules if m == 'kedro' or m.startswith('kedro.')))"
    )
    assert _python(code) == "[]"


def test_kedro_startup_turns_telemetry_off_before_mlflow_is_imported():
    code = (
        "from kedro.framework.cli.cli import _init_plugins\n"
        "_init_plugins()\n"
        "import mlflow\n"
        "from mlflow.telemetry.client import get_telemetry_client\n"
        "import os\n"
        "print(get_telemetry_client() is None, os.environ['DO_NOT_TRACK'], os.environ['HF_HUB_OFFLINE'])"
    )
    assert _python(code) == "True true 1"


def test_user_choices_win_over_the_defaults():
    env = {**CLEAN_ENV, "HF_HUB_OFFLINE": "0"}
    done = subprocess.run(
        [sys.executable, "-c", "import fastlm, os; print(os.environ['HF_HUB_OFFLINE'])"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.stdout.strip() == "0"


@pytest.mark.parametrize("name", ["split", "train", "report", "__default__"])
def test_pipelines_are_registered(name):
    from kedro.framework.project import configure_project

    configure_project("fastlm")
    from fastlm.pipeline_registry import register_pipelines

    pipelines = register_pipelines()
    assert name in pipelines
    if name in ("split", "__default__"):
        assert {n.name for n in pipelines[name].nodes} >= {"clean_corpus", "tokenize_corpus", "report_split"}


def test_main_job_is_split_train_report_and_tune_only_on_request():
    from kedro.framework.project import configure_project

    configure_project("fastlm")
    from fastlm.pipeline_registry import register_pipelines

    pipelines = register_pipelines()
    default = {node.name for node in pipelines["__default__"].nodes}
    assert {"tokenize_corpus", "train_model", "write_report"} <= default
    assert "tune_micro_batch" not in default and "tune_micro_batch" in {
        n.name for n in pipelines["tune"].nodes
    }
    assert "predict_file" not in default and {n.name for n in pipelines["predict"].nodes} == {"predict_file"}
