"""Project-level guarantees: Kedro-free engine, telemetry off, offline by default, registered pipelines."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import background

CLEAN_ENV = {
    k: v
    for k, v in os.environ.items()
    if k not in {"DO_NOT_TRACK", "MLFLOW_DISABLE_TELEMETRY", "HF_HUB_OFFLINE"}
}


def _python(code: str, folder: Path) -> str:
    done = background.run([sys.executable, "-c", code], cwd=folder, env=CLEAN_ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def kedro_modules_of_engine_and_corpus(folder: Path) -> str:
    """The kedro modules a process has imported after every module of fastlm.engine and fastlm.corpus (a job
    of tests/support/background.py)."""
    code = (
        "import sys, pkgutil, importlib, fastlm.engine, fastlm.corpus\n"
        "for package in (fastlm.engine, fastlm.corpus):\n"
        "    for info in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "print(sorted(m for m in sys.modules if m == 'kedro' or m.startswith('kedro.')))"
    )
    return _python(code, folder)


HEAVY = ("rouge_score", "nltk", "torch", "transformers", "fastlm.engine.train.loop")


def heavy_modules_after_the_pipelines_are_built(folder: Path) -> str:
    """Which of ``HEAVY`` a process holds after building every pipeline and validating the parameters of the
    main job's, as each `kedro run` starts (a job of tests/support/background.py)."""
    code = (
        "import sys\n"
        "from kedro.framework.project import configure_project, pipelines\n"
        "configure_project('fastlm')\n"
        "assert all(name in pipelines for name in ('split', 'train', 'report', 'tune', 'sweep', 'predict'))\n"
        "from fastlm.parameters import GROUPS\n"
        "for name in ('split', 'train', 'report'):\n"
        "    GROUPS[name].parse({})\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    return _python(code, folder)


def adapter_packages_of_a_training_worker(folder: Path) -> str:
    """peft and bitsandbytes in a process that has imported what a training worker runs and built every
    pipeline, as each `kedro run` and each worker starts (a job of tests/support/background.py)."""
    code = (
        "import sys\n"
        "import fastlm.engine.launch.job\n"
        "from kedro.framework.project import configure_project, pipelines\n"
        "configure_project('fastlm')\n"
        "assert 'train' in pipelines\n"
        "print(sorted(m for m in ('peft', 'bitsandbytes') if m in sys.modules))"
    )
    return _python(code, folder)


def telemetry_after_kedro_startup(folder: Path) -> str:
    """MLflow's telemetry client, DO_NOT_TRACK and HF_HUB_OFFLINE once Kedro's CLI plugins are loaded (a job
    of tests/support/background.py)."""
    code = (
        "from kedro.framework.cli.cli import _init_plugins\n"
        "_init_plugins()\n"
        "import mlflow\n"
        "from mlflow.telemetry.client import get_telemetry_client\n"
        "import os\n"
        "print(get_telemetry_client() is None, os.environ['DO_NOT_TRACK'], os.environ['HF_HUB_OFFLINE'])"
    )
    return _python(code, folder)


def offline_choice_of_a_user(folder: Path) -> subprocess.CompletedProcess:
    """HF_HUB_OFFLINE after ``import fastlm`` where the user set it to 0 (a job of
    tests/support/background.py)."""
    env = {**CLEAN_ENV, "HF_HUB_OFFLINE": "0"}
    code = "import fastlm, os; print(os.environ['HF_HUB_OFFLINE'])"
    return background.run([sys.executable, "-c", code], cwd=folder, env=env, timeout=120)


@pytest.mark.background(job=kedro_modules_of_engine_and_corpus)
def test_engine_and_corpus_never_import_kedro():
    assert background.result(kedro_modules_of_engine_and_corpus) == "[]"


@pytest.mark.background(job=heavy_modules_after_the_pipelines_are_built)
def test_kedro_start_up_leaves_rouge_to_the_report_that_scores():
    held = background.result(heavy_modules_after_the_pipelines_are_built)
    assert "rouge_score" not in held and "nltk" not in held


@pytest.mark.background(job=heavy_modules_after_the_pipelines_are_built)
def test_kedro_start_up_leaves_torch_and_transformers_to_the_nodes_that_train():
    # every `kedro run` (a misspelled parameter reported, the split pipeline, `kedro viz`) imported torch,
    # transformers and the engine while Kedro built the pipelines: seconds before anything ran
    assert background.result(heavy_modules_after_the_pipelines_are_built) == "[]"


@pytest.mark.background(job=adapter_packages_of_a_training_worker)
def test_a_full_fine_tunes_processes_leave_peft_and_bitsandbytes_to_adapter_runs():
    # about a second of each worker's and each `kedro run`'s start-up: NEFTune's module imported
    # transformers' Trainer utilities, and they peft and bitsandbytes
    assert background.result(adapter_packages_of_a_training_worker) == "[]"


@pytest.mark.background(job=telemetry_after_kedro_startup)
def test_kedro_startup_turns_telemetry_off_before_mlflow_is_imported():
    assert background.result(telemetry_after_kedro_startup) == "True true 1"


@pytest.mark.background(job=offline_choice_of_a_user)
def test_user_choices_win_over_the_defaults():
    done = background.result(offline_choice_of_a_user)
    assert done.stdout.strip() == "0"


def test_a_process_that_imported_fastlm_leaves_its_exit_collection_nothing_to_scan():
    """At exit CPython collects every generation once more: with torch and transformers loaded that scans
    hundreds of thousands of objects, seconds in each `kedro run` and each training worker. fastlm's exit
    handler freezes them first (handlers run last-registered first: this one, registered before fastlm's,
    runs after it)."""
    code = (
        "import atexit, gc; atexit.register(lambda: print('frozen', gc.get_freeze_count())); import fastlm; "
        "import torch"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split()[0] == "frozen" and int(done.stdout.split()[1]) > 10_000, done.stdout


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
