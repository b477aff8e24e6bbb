"""`kedro run` output a user can read: no warnings they did not cause, each message once, log lines unwrapped
when not on a terminal, a failed run FAILED in MLflow; and one per-step line with one ETA in a terminal."""

from __future__ import annotations

import io
import logging
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import background
from tests.support.project import PROJECT_ROOT, copy_project, demo_texts, write_jsonl

NOISE = (
    "[33m",
    "Registering new custom resolver",
    "gradient_checkpointing_enable is deprecated",
    "No typed parameter requirements",
    "UserWarning",
    # it/s]: a tqdm bar redrawn into a log
    "it/s]",
)


def kedro(project, *args, python=()) -> subprocess.CompletedProcess:
    env = background.environ(COLUMNS="80", MLFLOW_TRACKING_URI=None)
    return background.run([sys.executable, *python, "-m", "kedro", "run", *args], cwd=project, env=env)


def split_then_failed_split(
    folder: Path,
) -> tuple[Path, subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """In a new project (its own MLflow store): a split under ``-X importtime``, then a split that fails (a
    job of tests/support/background.py)."""
    project = copy_project(folder / "project")
    write_jsonl(project / "data/01_raw/demo_corpus.jsonl", list(demo_texts()[:200]))
    done = kedro(
        project, "--pipeline=split", "--params", "split.tokenizer.vocab_size=300", python=("-X", "importtime")
    )
    failed = kedro(project, "--pipeline=split", "--params", "split.text_column=body")
    return project, done, failed


def imported(importtime_log: str) -> set[str]:
    return {
        line.rsplit("|", 1)[1].strip()
        for line in importtime_log.splitlines()
        if line.startswith("import time:")
    }


@pytest.mark.e2e
@pytest.mark.background(job=split_then_failed_split)
def test_cli_output_is_quiet_unwrapped_and_a_failed_run_is_failed():
    project, done, failed = background.result(split_then_failed_split)
    assert done.returncode == 0, done.stdout + done.stderr
    # start-up cost the project causes: a split imports no other pipeline (training engine, tune, report),
    # nor transformers' pipelines (kedro-datasets' huggingface package), nor plotting or ROUGE
    unneeded = {
        "fastlm.engine.train.loop",
        "fastlm.engine.train.tune",
        "fastlm.pipelines.train.nodes",
        "rouge_score",
        "fastlm.pipelines.report.nodes",
        "transformers.pipelines",
        "matplotlib.pyplot",
    }
    assert unneeded & imported(done.stderr) == set()
    output = done.stdout + "\n".join(
        line for line in done.stderr.splitlines() if not line.startswith("import time:")
    )
    assert [noise for noise in NOISE if noise in output] == []
    cleaned = [line for line in output.splitlines() if "Cleaned 200 raw rows" in line]
    # one line, not wrapped at 80
    assert len(cleaned) == 1 and "kept" in cleaned[0] and "dropped" in cleaned[0]

    output = failed.stdout + failed.stderr
    assert failed.returncode == 2 and output.count("was closed because of an error") <= 1, output
    statuses = (
        sqlite3.connect(project / "mlflow.db")
        .execute("select status from runs order by start_time")
        .fetchall()
    )
    assert [status for (status,) in statuses] == ["FINISHED", "FAILED"]
    runners = (
        sqlite3.connect(project / "mlflow.db")
        .execute("select value from tags where key = 'runner'")
        .fetchall()
    )
    assert runners and {value for (value,) in runners} == {"SequentialRunner"}  # a value, not an object repr


def test_every_log_step_leaves_one_summary_line_and_the_bar_shows_one_eta(monkeypatch, caplog):
    from fastlm.engine.observe.progress import Progress

    terminal = io.StringIO()
    terminal.isatty = lambda: True
    monkeypatch.setattr(sys, "stderr", terminal)
    progress = Progress(20)
    assert progress.bar is not None
    caplog.set_level(logging.INFO, logger="fastlm")
    for step in (5, 10):
        for _ in range(5):
            progress.advance()
        progress.show(
            {
                "step": step,
                "loss": 2.5,
                "real_tokens_per_s": 1000.0,
                "eta_s": 12.0,
                "lr": 1e-3,
                "grad_norm": 0.5,
                "data_wait_share": 0.01,
                "padding_efficiency": 0.99,
            }
        )
    lines = [
        record.getMessage() for record in caplog.records if record.name == "fastlm.engine.observe.progress"
    ]
    assert [line.split(":")[0] for line in lines] == ["step 5", "step 10"] and all(
        "loss 2.5" in x for x in lines
    )
    progress.bar.refresh()
    shown = str(progress.bar)
    progress.close()
    assert shown.count("eta") == 1 and "<" not in shown  # fastlm's ETA only, not tqdm's remaining time


def _node_failure_line(error: Exception) -> str:
    """What Kedro's node logger says of a node failing with ``error``, through fastlm's log set-up."""
    from fastlm.log_handler import quiet_third_party_logs

    quiet_third_party_logs()
    node_logger = logging.getLogger("kedro.pipeline.node")
    seen = io.StringIO()
    handler = logging.StreamHandler(seen)
    node_logger.addHandler(handler)
    try:
        raise error
    except Exception as exc:  # noqa: BLE001 - the record is made while the error is handled, as Kedro does
        node_logger.error("Node %s failed with error: \n%s", "split_corpus", str(exc))
    finally:
        node_logger.removeHandler(handler)
    return seen.getvalue()


def test_a_user_error_is_said_once_and_a_bug_keeps_kedros_full_line():
    from fastlm.errors import InputDataError

    missing = InputDataError("raw.csv has no column 'text'", fix="set split.text_column")
    user_error = _node_failure_line(missing)
    assert "split_corpus" in user_error and "no column" not in user_error
    assert "fastlm: error line at the end" in user_error
    wrapped = RuntimeError("loading failed")
    wrapped.__cause__ = InputDataError("raw.csv is empty", fix="add rows")
    assert "raw.csv is empty" not in _node_failure_line(wrapped)  # Kedro wraps: the chain is searched
    bug = _node_failure_line(KeyError("tokenizer"))
    assert "split_corpus failed with error" in bug and "tokenizer" in bug


def test_the_processes_the_suite_starts_take_ctrl_c():
    """A suite started as a background job of a non-interactive shell (a CI runner's) inherits SIGINT
    ignored, as every process it starts would: the tests of the Ctrl-C path (a split stopped by Ctrl-C, a
    training's graceful stop) then saw no signal (the split ran to its end, status 0). tests/conftest.py puts
    Python's Ctrl-C handler back in that case."""
    probe = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    child = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "True", child.stdout
    assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN


def _split_stopped(folder: Path, signum: int) -> tuple[Path, int, str]:
    """In a new project: a split stopped by ``signum`` sent to the foreground ``kedro run`` once its first
    node runs, outside any training loop (for Ctrl-C a KeyboardInterrupt, which Kedro's on_pipeline_error
    never sees)."""
    project = copy_project(folder / "project")
    write_jsonl(project / "data/01_raw/demo_corpus.jsonl", list(demo_texts()[:200]))
    process = background.popen(
        [sys.executable, "-m", "kedro", "run", "--pipeline=split"],
        cwd=project,
        env=background.environ(COLUMNS="80", MLFLOW_TRACKING_URI=None),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = []
    try:
        for line in process.stdout:
            output.append(line)
            if "Running node" in line:
                process.send_signal(signum)
                break
        output.append(process.stdout.read())
        return project, process.wait(timeout=120), "".join(output)
    finally:
        background.forget(process)


def split_stopped_by_ctrl_c(folder: Path) -> tuple[Path, int, str]:
    """A split stopped by Ctrl-C (SIGINT) once its first node runs."""
    return _split_stopped(folder, signal.SIGINT)


def split_stopped_by_sigterm(folder: Path) -> tuple[Path, int, str]:
    """A split stopped by SIGTERM (``timeout``, Slurm, Kubernetes) once its first node runs."""
    return _split_stopped(folder, signal.SIGTERM)


def _assert_stopped_and_killed(project: Path, returncode: int, output: str, said: str) -> None:
    # the shell's status for a Ctrl-C (128 + SIGINT) and one line, not click's "Aborted!" and status 1
    assert returncode == 130 and "Aborted!" not in output and "Traceback" not in output, output
    assert output.strip().splitlines()[-1].startswith(said), output
    statuses = sqlite3.connect(project / "mlflow.db").execute("select status from runs").fetchall()
    assert [status for (status,) in statuses] == ["KILLED"], output
    # the outputs' locks released (Kedro calls neither after_pipeline_run nor on_pipeline_error): a lock file
    # left behind is refused for good where the next run's host name differs (a new container, same volume)
    assert sorted(str(lock.relative_to(project)) for lock in project.rglob(".*.lock")) == [], output


@pytest.mark.e2e
@pytest.mark.background(job=split_stopped_by_ctrl_c)
def test_a_run_stopped_by_ctrl_c_outside_training_is_killed_not_finished():
    """MLflow ends a run still open at the process's exit as FINISHED: a split, report or predict stopped by
    Ctrl-C showed in the MLflow UI as a finished run with nothing in it. The run ends with status 130, as a
    Ctrl-C'd training run does."""
    _assert_stopped_and_killed(*background.result(split_stopped_by_ctrl_c), "fastlm: stopped by Ctrl-C")


@pytest.mark.e2e
@pytest.mark.background(job=split_stopped_by_sigterm)
def test_a_run_stopped_by_sigterm_outside_training_is_killed_with_one_line():
    """SIGTERM (``timeout``, Slurm's cancel, a Kubernetes pod's stop) outside the training loop, which stops
    at a step with its own line: one line and status 130, the MLflow run KILLED and the locks released, as
    for Ctrl-C. Was: the process died by the signal (status 143) with nothing printed, its MLflow run left
    RUNNING until the next run started."""
    _assert_stopped_and_killed(*background.result(split_stopped_by_sigterm), "fastlm: stopped by SIGTERM")


def test_a_failure_raised_while_ctrl_c_was_unwinding_is_the_ctrl_c_line(monkeypatch):
    """A second Ctrl-C inside a checkpoint's ``torch.save``: its zip writer raised its own error while the
    KeyboardInterrupt unwound it (``RuntimeError: [enforce fail at inline_container.cc:672] . unexpected
    pos``), which replaced it: a 360-line traceback and status 1. The Ctrl-C in its chain is what stopped the
    run: one line, status 130."""
    from click.testing import CliRunner

    from fastlm import cli

    def stopped_in_a_write(**kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError(
                "[enforce fail at inline_container.cc:672] . unexpected pos 79707968"
            ) from None

    monkeypatch.setattr(cli.kedro_run, "callback", stopped_in_a_write)
    # the line ends the process's logging first (a CLI run's last act): not this test process's
    monkeypatch.setattr(cli.logging, "shutdown", lambda: None)
    result = CliRunner().invoke(cli.cli, ["run", "--pipeline=train"])
    assert result.exit_code == 130, (result.exception, result.output)
    assert result.output.strip().startswith("fastlm: stopped by Ctrl-C"), result.output
    assert "enforce fail" not in result.output


def test_the_stop_signals_are_put_back_only_where_the_clis_own_handler_is_still_installed():
    """A torchrun rank whose peer was lost ignores SIGTERM from then on (the agent sends it one on seeing
    the dead rank) until its line is printed. The CLI put its previous handler (the default) back over
    that at the end of the run, before the line: the agent's SIGTERM then killed the rank silently. A
    handler set during the run by someone else is left; the CLI's own is put back as before."""
    from fastlm import cli

    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        for signum in before:
            signal.signal(signum, signal.SIG_DFL)
        with cli.stop_signals_interrupt():
            assert signal.getsignal(signal.SIGHUP) is not signal.SIG_DFL  # the CLI's
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # another's, set during the run
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


# A log line in a process whose locale encoding (here ASCII; EUC-KR alike) lacks some of its characters:
# Kedro's Rich handler on a terminal, or the plain handler when redirected, as fastlm.settings sets them up.
LOG_IN_LOCALE = """
import logging
from kedro.logging import RichHandler
from fastlm.log_handler import plain_logs_when_redirected, printable_in_any_locale

root = logging.getLogger()
root.addHandler(RichHandler())
root.setLevel(logging.INFO)
printable_in_any_locale()
plain_logs_when_redirected()
korean = "\\ubc30\\uc1a1 \\ub9ac\\ubdf0 %"
logging.getLogger("fastlm.probe").info("Diagnosis: %s \\u2014 %s", "compute-bound", korean)
"""


def test_a_log_line_with_characters_the_locale_lacks_is_written_escaped_not_lost():
    env = {**background.environ(), "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0"}
    env.pop("PYTHONIOENCODING", None)
    done = subprocess.run(
        [sys.executable, "-c", LOG_IN_LOCALE], capture_output=True, env=env, timeout=120, cwd=PROJECT_ROOT
    )
    assert done.returncode == 0, done.stderr.decode("utf-8", "replace")
    assert b"Logging error" not in done.stderr, done.stderr.decode("utf-8", "replace")
    message = "Diagnosis: compute-bound \u2014 배송 리뷰 %"
    assert message.encode("ascii", "backslashreplace") in done.stdout, done.stdout


def test_the_import_noise_quieted_without_kedro_is_what_the_logging_config_quiets_for_kedro_runs():
    """merge-adapter (no Kedro) sets log_handler.IMPORT_NOISE_LEVELS itself; conf/logging.yml sets them for
    every kedro run: one list, the same levels."""
    import yaml

    from fastlm.log_handler import IMPORT_NOISE_LEVELS

    configured = yaml.safe_load((PROJECT_ROOT / "conf" / "logging.yml").read_text())["loggers"]
    assert {name: configured.get(name, {}).get("level") for name in IMPORT_NOISE_LEVELS} == {
        name: logging.getLevelName(level) for name, level in IMPORT_NOISE_LEVELS.items()
    }


def test_torchrun_ranks_other_than_0_log_only_warnings_prefixed_with_their_rank(monkeypatch):
    """Under torchrun every rank runs the whole `kedro run`: every INFO line of the run was printed once per
    rank (conf/logging.yml gives `fastlm` and `kedro` their own INFO level, so the root logger's WARNING set
    by the outputs hook quieted neither; and the run name, the project lines came before that hook ran). From
    the settings' import on, a rank other than 0 shows warnings and errors only, each naming its rank; rank 0
    and runs outside torchrun keep their INFO lines."""
    import importlib

    import fastlm.settings

    class Lines(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.lines = []

        def emit(self, record):
            self.lines.append(f"{record.levelname} {record.getMessage()}")

    factory, disabled = logging.getLogRecordFactory(), logging.root.manager.disable
    log = logging.getLogger("fastlm.training")
    saved_level = log.level

    def logged(rank: int | None) -> list[str]:
        if rank is not None:
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("LOCAL_RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", "2")
        handler = Lines()
        try:
            importlib.reload(fastlm.settings)
            log.setLevel(logging.INFO)  # as conf/logging.yml sets `fastlm`
            log.addHandler(handler)
            log.info("Training %d steps", 4)
            log.warning("step %d: loss is not finite", 3)
        finally:  # each case in a process of its own: the logging state as it was
            log.removeHandler(handler)
            log.setLevel(saved_level)
            monkeypatch.undo()
            logging.setLogRecordFactory(factory)
            logging.disable(disabled)
            importlib.reload(fastlm.settings)
        return handler.lines

    other, first, alone = logged(1), logged(0), logged(None)
    assert other == ["WARNING [rank 1] step 3: loss is not finite"]
    assert first == alone == ["INFO Training 4 steps", "WARNING step 3: loss is not finite"]
