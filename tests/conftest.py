"""Shared fixtures: tiny tokenizers and throw-away copies of the Kedro project."""

from __future__ import annotations

import getpass
import os
import signal
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("DO_NOT_TRACK", "true")

# One intra-op thread per process: the suite runs a background thread of subprocesses beside the tests
# (tests/support/background.py) on a 2-core machine, where two processes of two threads each spin against
# each other (tiny tensors gain nothing from a second thread). setup_runtime keeps OMP_NUM_THREADS as set.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Ctrl-C reaches the tests as it reaches a user at a terminal. A suite started as a background job of a
# non-interactive shell (a CI runner's) inherits SIGINT ignored, and every process it starts would too: the
# tests of the Ctrl-C path (a split stopped by Ctrl-C, a training's graceful stop) would then see no signal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# Likewise a hang-up: a suite started under `nohup` inherits SIGHUP ignored, and the processes it starts would
# too (the launcher's own handlers, which the multi-process tests check, would then read as ignored).
if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)

# A kernel set forced with ATEN_CPU_CAPABILITY alone (avx2 or default, the quick check of whether a test
# depends on the machine) is completed as scripts/check_cpu_kernels.sh completes it, before torch loads:
# MKL and oneDNN capped alike (left alone, torch's CPU flash attention packs bf16 operands for an AMX
# machine's oneDNN through kernels the forced set leaves out, "pack_vnni2 is only supported when avx512 is
# supported"), and an inductor cache of the set's own (the on-disk cache is not keyed on the kernel set:
# kernels built under another set gave a compiled layer NaN).
_KERNEL_SETS = {"avx2": ("AVX2", "AVX2"), "default": ("SSE4_2", "SSE41")}
_forced = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
if _forced in _KERNEL_SETS:
    os.environ.setdefault("MKL_ENABLE_INSTRUCTIONS", _KERNEL_SETS[_forced][0])
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", _KERNEL_SETS[_forced][1])
    os.environ.setdefault(
        "TORCHINDUCTOR_CACHE_DIR",
        str(Path(tempfile.gettempdir()) / f"fastlm-inductor-{_forced}-{getpass.getuser()}"),
    )

import torch  # noqa: E402

if _forced in _KERNEL_SETS:
    # torch's CPU float8 matmul (_scaled_mm) takes oneDNN's kernel where the CPU itself has AMX (cpuinfo),
    # whatever set is forced, and oneDNN capped below AMX then fails to build it once a bf16 matmul has run
    # ("could not create a primitive descriptor for the matmul primitive"). A CPU of the forced set has no
    # AMX: torch takes its emulated float8 matmul there, and here too.
    _scaled_mm = torch._scaled_mm

    def _scaled_mm_of_the_forced_set(*args, **kwargs):
        enabled = torch.backends.mkldnn.enabled
        torch.backends.mkldnn.enabled = False  # torch's emulated float8 matmul
        try:
            return _scaled_mm(*args, **kwargs)
        finally:
            torch.backends.mkldnn.enabled = enabled

    torch._scaled_mm = _scaled_mm_of_the_forced_set

import fastlm  # noqa: E402,F401  (sets offline/telemetry defaults before any HF import)
from fastlm.corpus.tokenizer_source import train_bpe_tokenizer  # noqa: E402
from tests.support import background  # noqa: E402
from tests.support.project import demo_texts, make_kedro_project  # noqa: E402

COLLECTED_NODE_IDS = pytest.StashKey[dict]()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "background(job): the test asserts on this job of subprocesses, started in a background thread once "
        "the tests are collected (tests/support/background.py)",
    )


def pytest_collection_finish(session):
    """Start the background jobs of the tests about to run, in their order."""
    if session.config.option.collectonly:
        return
    background.start(
        [mark.kwargs["job"] for item in session.items for mark in item.iter_markers("background")]
    )


def pytest_sessionfinish(session):
    background.close()


def pytest_terminal_summary(terminalreporter, config):
    """With ``--durations``: the background jobs' wall seconds (their tests' own durations leave them out
    where a job ran beside the tests before they asked for it)."""
    if config.option.durations is None or not background.seconds():
        return
    jobs = sorted(background.seconds().items(), key=lambda item: -item[1][0])
    terminalreporter.write_sep("=", "background jobs")
    for name, (seconds, in_background) in jobs:
        terminalreporter.write_line(
            f"{seconds:8.2f}s {'background' if in_background else 'in its test'} {name}"
        )
    busy = sum(seconds for seconds, in_background in background.seconds().values() if in_background)
    terminalreporter.write_line(f"{busy:8.2f}s in the background thread in all")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Note the node ids this session collected, per test file, before -k, -m or --deselect leave any out
    (tests/test_reliability_doc.py reads them instead of collecting the files again in a subprocess). Nothing
    is noted where the command line names single tests: a file's collection may then be partial."""
    if any("::" in arg for arg in config.args):
        return
    by_file: dict[str, set[str]] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::", 1)[0], set()).add(item.nodeid)
    config.stash[COLLECTED_NODE_IDS] = {file: frozenset(ids) for file, ids in by_file.items()}


@pytest.fixture(scope="session")
def collected_node_ids(request) -> dict[str, frozenset[str]]:
    """Test file -> the node ids this session collected from it (every one), for the files it collected."""
    return request.config.stash.get(COLLECTED_NODE_IDS, {})


_INTRA_OP_THREADS = torch.get_num_threads()


@pytest.fixture(autouse=True)
def _one_intra_op_thread():
    """Each test runs with the session's intra-op threads (one, OMP_NUM_THREADS above), and leaves them so: a
    fixture or test that sizes the pool for a runtime of two threads (``setup_runtime(num_threads=2)``) would
    otherwise leave every later test of the process spinning two threads against the background jobs'
    subprocesses on a 2-core machine (tiny tensors gain nothing from them; a module of generation tests took
    eight times the CPU seconds)."""
    torch.set_num_threads(_INTRA_OP_THREADS)
    yield
    torch.set_num_threads(_INTRA_OP_THREADS)


@pytest.fixture(autouse=True)
def _no_dangling_mlflow_run():
    """Each test starts with no active MLflow run (kedro-mlflow can leave one open in-process)."""
    yield
    import sys

    if "mlflow" in sys.modules:
        import mlflow

        while mlflow.active_run() is not None:
            mlflow.end_run()


@pytest.fixture(autouse=True)
def _no_tuned_file_in_effect():
    """Each test starts with no tuned file recorded as in effect: a hook test calls the tuned parameters
    hook's ``before_pipeline_run`` without the run's end that clears it."""
    yield
    import sys

    record = sys.modules.get("fastlm.pipelines.tune.record")
    if record is not None:
        record.set_in_effect(None)


@pytest.fixture(scope="session")
def sample_texts() -> list[str]:
    return list(demo_texts())


@pytest.fixture(scope="session")
def bpe_tokenizer(sample_texts):
    return train_bpe_tokenizer(sample_texts, vocab_size=400, min_frequency=2, model_max_length=64)


@pytest.fixture(scope="session")
def bpe_tokenizer_dir(bpe_tokenizer, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer")
    bpe_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory) -> str:
    """One tracking database for the whole session: creating MLflow's schema costs seconds each time."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture(scope="session")
def empty_mlflow_db(tmp_path_factory) -> Path:
    """An MLflow SQLite store with its schema and no run, made once: a test that wants a store of its own
    copies it (``shutil.copyfile``) instead of creating the schema again, which costs seconds each time."""
    import mlflow

    folder = tmp_path_factory.mktemp("empty_mlflow")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)  # the Default experiment's artifact location: inside this folder, not the cwd's
        mlflow.MlflowClient(f"sqlite:///{folder / 'mlflow.db'}").search_experiments()
    return folder / "mlflow.db"


@pytest.fixture
def kedro_project(tmp_path, monkeypatch, sample_texts, mlflow_uri) -> Path:
    """A copy of the project's configuration in tmp_path (cwd), with a small raw corpus; code is the installed
    package."""
    make_kedro_project(tmp_path, sample_texts)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    return tmp_path
