"""MLflow logging that never stops training: a failing tracking store warns once, then is left alone.

Kedro-free (the engine's loop calls ``MlflowMetrics`` as a callback); used inside the run that
kedro-mlflow opened for the current ``kedro run``, or any active run.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import json
import logging
import math
import os
import re
import shlex
import sqlite3
import time
from dataclasses import dataclass
from numbers import Number
from pathlib import Path

from fastlm.errors import exception_chain
from fastlm.redaction import redact

log = logging.getLogger(__name__)

# An unreachable tracking server must cost seconds, not MLflow's default 7 retries with exponential back-off
# and a 120 s timeout per request (over four minutes before the first failure). A value the user set wins.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
}

# train_summary.json's lever decisions (engine/train/loop.py), logged as parameters under the same names: what
# ran, next to what was asked (train.optimizer.name, train.model.gradient_checkpointing, train.model.liger,
# train.loss.fused_linear[_kernel], train.runtime.param_dtype, train.runtime.compile_mode's CUDA graphs);
# float8's decision is the runtime's (runtime.float8_choice).
SUMMARY_PARAMS = (
    "optimizer",
    "gradient_checkpointing",
    "checkpointed_layers",
    "liger",
    "fused_linear",
    "fused_linear_kernel",
    "fused_linear_choice",
    "param_dtype",
    "cuda_graphs",
    "recompile_limit_hit",  # functions dynamo ran eagerly past torch._dynamo.config.recompile_limit
    "warmup_steps",  # the schedule's: train.optimizer.warmup_ratio's of the planned steps where it is set
)


def bound_tracking_requests() -> None:
    """Bounded retries and timeout for MLflow's REST calls (read by MLflow at each request), unless set."""
    for name, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)


# What MLflow holds process-wide and a session's store setup changes: mlflow.set_tracking_uri and
# set_experiment also write these variables (for subprocesses), where the next session in the same process
# reads MLFLOW_TRACKING_URI as the user's choice.
PROCESS_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID")
saved_process_tracking: list = []  # at most one entry: what a session found, until its end puts it back


def local_store_uri(uri):
    """A local SQLite store named relative to the working folder (``sqlite:///mlflow.db``) as the absolute
    path it names now; anything else unchanged. MLflow keeps a database connection per URI text within a
    process, so a relative one opened in one project would be used again for another project's runs."""
    if not isinstance(uri, str) or not uri.startswith("sqlite:///") or uri.startswith("sqlite:////"):
        return uri
    path, separator, query = uri.removeprefix("sqlite:///").partition("?")
    if path in ("", ":memory:"):
        return uri
    return f"sqlite:///{os.path.abspath(path)}{separator}{query}"


def begin_session_tracking() -> None:
    """Note the variables MLflow writes process-wide before a session sets its own store and experiment; put
    back by ``end_session_tracking`` (first here, where a session stopped without reaching its end, e.g.
    Ctrl-C). MLflow's in-process tracking URI stays the last session's (a notebook's own MLflow calls read
    that session's store); the next session sets its own."""
    end_session_tracking()
    found = {name: os.environ.get(name) for name in PROCESS_VARIABLES}
    saved_process_tracking.append([found, dict(found)])


def share_run_with_workers() -> None:
    """The active run, for the processes Kedro's ParallelRunner starts (spawned: a fresh MLflow, which would
    open a run of its own, named at random, for the first metric a node logs): MLflow's ``MLFLOW_RUN_ID``,
    which they inherit and resume; put back at the session's end."""
    run_id = active_run_id()
    if run_id is not None:
        os.environ["MLFLOW_RUN_ID"] = run_id
        session_tracking_set()


def shared_run(name: str) -> str | None:
    """In a worker of Kedro's ParallelRunner without an active run (spawned: a fresh MLflow): the run the
    main process shares in ``MLFLOW_RUN_ID`` (``share_run_with_workers``), made the active run here (by its
    id: the variable stays for the next try where the store was locked), so that the child run ``name`` is
    nested in it; None where no run is shared or it cannot be opened (the sweep then goes on untracked)."""
    return resume_shared_run(f"child run {name}", "the sweep continues without it")


def resume_shared_run(what: str, without: str) -> str | None:
    """The run the main process shares in ``MLFLOW_RUN_ID`` made the active run of this worker, for
    ``what`` (tried again while the SQLite store is locked); the active run's id, None where none is shared.
    A run that cannot be opened warns once, saying ``without``: tracking fails open."""
    shared = os.environ.get("MLFLOW_RUN_ID")
    if not shared:
        return None
    import mlflow

    def resume() -> None:
        if active_run_id() is None:  # a try before this one that opened it: not opened again
            mlflow.start_run(run_id=shared)

    try:
        retried_while_locked(f"{what}: the shared run {shared}", resume)
    except Exception as exc:  # noqa: BLE001 - tracking fails open, training goes on
        log.warning("MLflow %s: the shared run %s not opened (%s); %s.", what, shared, exc, without)
    return active_run_id()


@contextlib.contextmanager
def without_shared_run_id():
    """``MLFLOW_RUN_ID`` set aside while a child run starts: MLflow's ``start_run`` opens the run it names,
    nested or not, so the child run would be the shared run itself (renamed, its parameters and metrics the
    child's, ended by the child's end); put back after."""
    shared = os.environ.pop("MLFLOW_RUN_ID", None)
    try:
        yield
    finally:
        if shared is not None:
            os.environ["MLFLOW_RUN_ID"] = shared


def session_tracking_set() -> None:
    """Note the variables as the session's store setup left them: only those still so at its end are put
    back (one the user changed since, e.g. in a notebook, is the user's)."""
    if saved_process_tracking:
        saved_process_tracking[-1][1] = {name: os.environ.get(name) for name in PROCESS_VARIABLES}


def end_session_tracking() -> None:
    """Put back the variables ``begin_session_tracking`` noted (nothing if nothing is noted), so a later
    session reads what the user set (``MLFLOW_TRACKING_URI`` in mlflow.yml), not the last session's store."""
    if not saved_process_tracking:
        return
    variables, left = saved_process_tracking.pop()
    now = {name: os.environ.get(name) for name in PROCESS_VARIABLES}
    for name, value in variables.items():
        if now[name] != left[name]:  # changed by the user since the session's setup: theirs
            value = now[name]
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def active_run_id() -> str | None:
    """The id of the active MLflow run, if any (never raises)."""
    try:
        import mlflow

        run = mlflow.active_run()
        return run.info.run_id if run is not None else None
    except Exception:  # noqa: BLE001
        return None


# The MLflow runs the sessions of this process opened: one still open at the process's exit, or when the next
# session starts (a notebook), was stopped by Ctrl-C outside the training loop (a KeyboardInterrupt, which
# Kedro's on_pipeline_error never sees) and is ended KILLED; MLflow's own exit handler would end it FINISHED.
session_runs: set[str] = set()


def stopped_by_user(error: BaseException | None) -> bool:
    """``error`` (or one it was raised from) is a Ctrl-C or a stop signal: a KeyboardInterrupt, or the
    training loop's graceful stop (exit status 130)."""
    return any(
        isinstance(link, KeyboardInterrupt) or getattr(link, "exit_code", None) == 130
        for link in exception_chain(error)
    )


def note_session_run() -> None:
    """Note the active run as a session's (``end_interrupted_runs`` ends it KILLED if it is left open).
    The exit handler is registered after MLflow's (at its import), so it runs first."""
    run_id = active_run_id()
    if run_id is None:
        return
    if not session_runs:
        atexit.register(end_interrupted_runs)
    session_runs.add(run_id)


def end_interrupted_runs(run_id: str | None = None) -> None:
    """End KILLED the open runs a session opened (``note_session_run``) and their open child runs, innermost
    first; ``run_id``, a session's run open in another thread, too. Never raises."""
    try:
        import mlflow

        while (run := mlflow.active_run()) is not None:
            # each read and write tried again where another command holds the SQLite store locked
            look_up = mlflow.MlflowClient().get_run  # the store is opened only where a run is open
            tags = retried_while_locked("run look-up", look_up, run.info.run_id).data.tags
            if run.info.run_id not in session_runs and tags.get("mlflow.parentRunId") not in session_runs:
                break
            session_runs.discard(run.info.run_id)
            end_active_run("KILLED")
        if run_id in session_runs:
            session_runs.discard(run_id)
            retried_while_locked("run end", set_run_status, run_id, "KILLED")
    except Exception as exc:  # noqa: BLE001 - at exit or a session's start: tracking must not stop anything
        log.warning("MLflow: an interrupted run was not marked KILLED (%s: %s)", type(exc).__name__, exc)


def set_run_status(run_id: str, status: str) -> None:
    """End the run ``run_id`` with ``status`` (``FINISHED``, ``FAILED``, ``KILLED``), active or not."""
    import mlflow

    mlflow.MlflowClient().set_terminated(run_id, status)


def end_active_run(status: str) -> None:
    """End the active run with ``status``, tried again where the SQLite store is locked
    (``retried_while_locked``). MLflow's ``end_run`` lets go of the run before it writes its status: a try
    after that writes that run's status itself (``set_run_status``), and the run it was nested in stays the
    active one (a second ``end_run`` would have ended that one instead, and left this one RUNNING)."""
    import mlflow

    run_id = active_run_id()

    def end() -> None:
        if run_id is not None and active_run_id() != run_id:  # let go of by a try before this one
            set_run_status(run_id, status)
        else:
            mlflow.end_run(status)

    retried_while_locked("run end", end)


# Each run's process (``process_tag``): a run left RUNNING by a process that is gone (SIGKILL, a power cut),
# which no handler of its own could end, is ended KILLED by the next run start here.
PROCESS_TAG = "fastlm.process"


def process_tag(pid: int | None = None) -> str:
    """``host|PID namespace|PID`` of this process (or ``pid`` in it): whether a run's process still runs can
    be told only on its host and in its PID namespace (a container has its own)."""
    import socket

    try:
        namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        namespace = "-"
    return f"{socket.gethostname()}|{namespace}|{os.getpid() if pid is None else pid}"


def end_runs_of_gone_processes(mlflow, experiment_id: str) -> list[str]:
    """End KILLED the runs of ``experiment_id`` still RUNNING whose process (``PROCESS_TAG``, on this host and
    in this PID namespace) no longer runs, said in one line naming them (``run_name (id)``); their ids. A run
    of another host or namespace, or without the tag (another tool's), is left as it is."""
    host, namespace, _ = process_tag().split("|")
    ended, named = [], []  # the ids; the runs by name (the id beside) for the line
    try:  # a store that cannot search or end runs: this run's tracking goes on
        client = mlflow.MlflowClient()
        running = client.search_runs(
            [experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=1000
        )
        for run in running:
            parts = str(run.data.tags.get(PROCESS_TAG, "")).split("|")
            if len(parts) != 3 or parts[:2] != [host, namespace] or not parts[2].isdigit():
                continue
            if _process_runs(int(parts[2])):
                continue
            client.set_terminated(run.info.run_id, "KILLED")
            ended.append(run.info.run_id)
            named.append(f"{run.info.run_name} ({run.info.run_id})" if run.info.run_name else run.info.run_id)
    except Exception as exc:  # noqa: BLE001 - tracking fails open
        log.warning("MLflow: runs left RUNNING were not looked for (%s: %s)", type(exc).__name__, exc)
    if ended:
        log.info(
            "MLflow: %d %s left RUNNING by a process that is gone (killed, or its machine stopped) "
            "ended KILLED: %s",
            len(ended),
            "run" if len(ended) == 1 else "runs",
            ", ".join(named),
        )
    return ended


def _process_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: it runs
        return True
    return True


# A local SQLite store written by two commands at once (a training and a report, two trainings of other run
# names): a write that finds the database locked past SQLite's own wait is tried again after these pauses
# (seconds), then given up with the one warning.
LOCKED_RETRY_WAITS = (0.5, 1.0, 2.0, 4.0)


def retried_while_locked(what: str, function, *args):
    """``function(*args)``'s result, tried again after each of ``LOCKED_RETRY_WAITS`` while it finds the
    SQLite store locked by another process (``store_locked``); any other failure, or the last, is raised. A
    write refused as locked wrote nothing (SQLite rolls its transaction back): trying it again repeats
    nothing, unless ``function`` does more than one write (it then looks at what went through first)."""
    for wait in (*LOCKED_RETRY_WAITS, None):
        try:
            return function(*args)
        except Exception as exc:  # noqa: BLE001
            if wait is None or not store_locked(exc):
                raise
            log.debug("MLflow %s: the store is locked by another process; again in %.1f s", what, wait)
            time.sleep(wait)
    return None  # not reached: the last try returns or raises


def store_locked(error: BaseException) -> bool:
    """``error`` (or one it was raised from) is SQLite's ``database is locked``: another process was writing
    the store; the write may be tried again."""
    return any(
        "database is locked" in str(link) or "database table is locked" in str(link)
        for link in exception_chain(error)
    )


@contextlib.contextmanager
def setting_up_store():
    """Held while a command sets up its MLflow store (creates the tables of a new SQLite store and migrates
    them, creates the experiment): one command of this machine at a time. Two starting at once on a project
    without its store both created and migrated the tables, and one failed (``table ... already exists``,
    ``duplicate column name``) and ran untracked. An exclusive ``flock`` on a file in the temporary folder,
    released when the block ends or its process dies; where it cannot be taken, the block runs unheld
    (``temporary_files.held_exclusively``)."""
    import tempfile

    from fastlm.temporary_files import held_exclusively

    user = getattr(os, "getuid", lambda: "")()  # POSIX; elsewhere no lock is taken
    with held_exclusively(Path(tempfile.gettempdir()) / f"fastlm-mlflow-setup-{user}.lock"):
        yield


# How long the store's check waits for a command that holds the SQLite store locked (a write, a migration of
# another machine's command) before leaving the store to MLflow: a busy store is not a broken one.
STORE_CHECK_WAIT_S = 2.0


def store_problem(uri: str | None) -> str | None:
    """One warning line naming a local SQLite store (``sqlite:///mlflow.db``) that a cut set-up left
    incomplete and the fix, or None (no such store, a new or complete one, one locked by another command, one
    an older MLflow made, which MLflow itself asks to upgrade). Reads the store only: its runs are the user's.

    A set-up cut part way (a kill, two commands migrating at once) leaves an ``_alembic_tmp_*`` table, a
    table or column missing, or a schema version row behind tables already migrated; MLflow then failed every
    later command's tracking (or re-made a missing table in its first schema, or asked for an upgrade that
    fails)."""
    local = local_store_uri(uri)
    if not isinstance(local, str) or not local.startswith("sqlite:////"):
        return None
    path = Path(local.removeprefix("sqlite:///").partition("?")[0])
    if not path.is_file():
        return None
    try:
        reason = _store_damage(path)
    except sqlite3.Error:  # locked, busy, unreadable: MLflow's own handling (its retries, its error)
        return None
    if reason is None:
        return None
    try:
        name = str(path.relative_to(Path.cwd()))
    except ValueError:
        name = str(path)
    move = f"mv {shlex.quote(name)} {shlex.quote(name + '.broken')}"
    return (
        f"{name} is not a complete MLflow store ({reason}); this run continues without tracking (training "
        f"and local outputs are kept). Fix: move it aside ({move}) and run again; the runs it holds can "
        "still be read with sqlite3."
    )


def _store_damage(path: Path) -> str | None:
    try:
        connection = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=STORE_CHECK_WAIT_S)
    except sqlite3.Error:
        return None
    try:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        left = sorted(name for name in tables if name.startswith("_alembic_tmp_"))
        if left:
            return f"a set-up was cut: table {', '.join(left)} left"
        if not {name for name in tables if not name.startswith(("alembic_", "sqlite_"))}:
            return None  # a new store: MLflow makes its tables
        versions = (
            [row[0] for row in connection.execute("SELECT version_num FROM alembic_version")]
            if "alembic_version" in tables
            else []
        )
        if len(versions) != 1:
            return f"a set-up was cut: {len(versions) or 'no'} schema version rows"
        columns = {
            name: {row[1] for row in connection.execute(f"PRAGMA table_xinfo('{name}')")} for name in tables
        }
    except sqlite3.DatabaseError as exc:
        if isinstance(exc, sqlite3.OperationalError):
            raise  # locked, busy
        return f"not an SQLite database: {exc}"
    finally:
        connection.close()
    try:
        head, known, first_tables, head_columns = mlflow_schema()
    except Exception:  # noqa: BLE001 - this MLflow's schema unreadable: the store is left to MLflow
        return None
    missing = sorted(name for name in first_tables if name not in tables)
    if missing:
        return f"a set-up was cut: table {', '.join(missing)} missing"
    version = versions[0]
    if version not in known:
        return None  # a newer MLflow's store: MLflow says so
    behind_head = [
        name if name not in columns else f"{name}.{column}"
        for name, wanted in head_columns.items()
        for column in ([None] if name not in columns else sorted(wanted - columns[name]))
    ]
    if version == head and behind_head:
        tables_missing = [name for name in behind_head if "." not in name]
        what = "table" if tables_missing else "column"
        return f"a set-up was cut: {what} {', '.join((tables_missing or behind_head)[:3])} missing"
    if version != head and not behind_head:
        return f"a set-up was cut: its schema version row says {version}, its tables are already at {head}"
    return None


def mlflow_schema() -> tuple[str, set[str], set[str], dict[str, set[str]]]:
    """This MLflow's store schema: its head revision, every revision it knows, the tables of its first schema
    (every store has them) and the columns of each table at the head."""
    import mlflow.store
    import mlflow.store.db.utils  # noqa: F401 - registers every table of the schema with Base
    from alembic.script import ScriptDirectory
    from mlflow.store.db.base_sql_model import Base
    from mlflow.store.tracking.dbmodels.initial_models import Base as InitialBase

    script = ScriptDirectory(str(Path(mlflow.store.__file__).parent / "db_migrations"))
    known = {revision.revision for revision in script.walk_revisions()}
    columns = {
        name: {column.name for column in table.columns} for name, table in Base.metadata.tables.items()
    }
    return script.get_current_head(), known, set(InitialBase.metadata.tables), columns


@contextlib.contextmanager
def outside_notebooks():
    """MLflow calls made by a process that has not imported IPython, which therefore runs in no IPython shell
    and no notebook: an import of IPython in them (MLflow's run start asks it for a Databricks notebook's
    ``dbutils``) finds none, as in a Python without IPython, instead of importing IPython and jedi (~0.4 s
    of each tracked command's start) to learn that. In a notebook or `kedro ipython`, IPython is imported
    and MLflow looks as it always does."""
    import sys

    if "IPython" in sys.modules:
        yield
        return
    sys.modules["IPython"] = None  # an import of it raises ImportError, MLflow's "no dbutils"
    try:
        yield
    finally:
        if "IPython" in sys.modules and sys.modules["IPython"] is None:
            del sys.modules["IPython"]


class SafeMlflow:
    """Calls into mlflow that warn once on the first failure and are skipped afterwards; a call that finds a
    SQLite store locked by another process is tried again first (``LOCKED_RETRY_WAITS``)."""

    def __init__(self) -> None:
        self.failed = False

    def give_up(self, line: str) -> None:
        """Turn tracking off for good with ``line``, the one warning (a store known not to work)."""
        self.failed = True
        log.warning("%s", line)

    def call(self, what: str, function, *args, needs_active_run: bool = True, **kwargs) -> None:
        if self.failed:
            return
        try:
            import mlflow

            if needs_active_run and mlflow.active_run() is None:
                return
            with outside_notebooks():
                retried_while_locked(what, lambda: function(mlflow, *args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - any store failure: warn once, keep training
            self.failed = True
            log.warning(
                "MLflow %s failed (%s: %s); training and local outputs continue without tracking.",
                what,
                type(exc).__name__,
                changed_params_text(str(exc)) or failure_text(exc),
            )


# SQLAlchemy's first line when a query's autoflush failed: what failed is on the next line.
_SQLALCHEMY_PREAMBLE = "(raised as a result of "


def failure_text(error: BaseException) -> str:
    """The line of a store failure that says what failed (SQLAlchemy's preamble skipped); a store that
    cannot be written is named as read-only."""
    text = str(error)
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith(_SQLALCHEMY_PREAMBLE)]
    line = lines[0] if lines else ""
    if "readonly database" in text or "read-only file system" in text.lower():
        import mlflow

        line += (
            f"; the store {redact(mlflow.get_tracking_uri())} is read-only (a read-only mount, or its file's "
            "or folder's permissions): make it writable, or set MLFLOW_TRACKING_URI to a writable "
            "sqlite:/// file"
        )
    return line


_CHANGED_PARAM = re.compile(
    r"key='(?P<key>.*?)' was already logged with value='(?P<old>.*?)' for run ID='[^']*'\. "
    r"Attempted logging new value '(?P<new>.*)'\.?$",
    re.DOTALL,
)
_CHANGED_PARAMS = re.compile(r"logged='(?P<list>\[.*\])' for run ID='[^']*'", re.DOTALL)
_NAMED_KEY = re.compile(r"""key(?:=|['"]:\s*)['"](?P<key>[^'"]+)['"]""")


def changed_params_text(message: str) -> str | None:
    """MLflow's refusal of parameters whose value changed within a run (``Changing param values is not
    allowed``), as one line naming each parameter with its logged and refused values (a secret's masked);
    None for any other message. MLflow names them as ``key='train.lr'``, which the secret masking reads as a
    secret named ``key``: the warning said ``'key': '***'``, never which parameter it was."""
    if not message.startswith("Changing param values is not allowed"):
        return None
    changes: list[tuple[str, str, str]] = []
    single, several = _CHANGED_PARAM.search(message), _CHANGED_PARAMS.search(message)
    if single is not None:
        changes = [(single.group("key"), single.group("old"), single.group("new"))]
    elif several is not None:
        with contextlib.suppress(ValueError, SyntaxError):
            changes = [
                (str(item["key"]), str(item["old_value"]), str(item["new_value"]))
                for item in ast.literal_eval(several.group("list"))
            ]
    if changes:
        named = [
            f"{key} (logged {redact(old, key)}, refused {redact(new, key)})" for key, old, new in changes
        ]
    else:
        named = _NAMED_KEY.findall(message) or ["(unnamed)"]
    return (
        f"a parameter's value changed within the run, which MLflow refuses; parameter(s) {', '.join(named)}"
    )


@dataclass(frozen=True)
class TrackingTarget:
    """The active run, for a launched training worker to log into (the worker has no active run of its
    own)."""

    tracking_uri: str
    run_id: str


def tracking_target() -> TrackingTarget | None:
    run_id = active_run_id()
    if run_id is None:
        return None
    import mlflow

    return TrackingTarget(mlflow.get_tracking_uri(), run_id)


class MlflowMetrics(SafeMlflow):
    """Loop callback: each logging-step record as MLflow metrics (``train/loss``, ``eval/val_loss``...).

    With ``run_id`` (a launched worker), metrics go to that run of ``tracking_uri`` instead of the active run.
    """

    def __init__(self, run_id: str | None = None, tracking_uri: str | None = None) -> None:
        super().__init__()
        self.run_id = run_id
        if tracking_uri is not None:
            import mlflow

            mlflow.set_tracking_uri(tracking_uri)

    def __call__(self, kind: str, record: dict) -> None:
        values = {
            f"{kind}/{key}": float(value)
            for key, value in record.items()
            if key != "step" and isinstance(value, Number) and math.isfinite(value)
        }
        if self.run_id is not None:
            self.call(
                "metric logging",
                lambda mlflow: mlflow.log_metrics(values, step=int(record["step"]), run_id=self.run_id),
                needs_active_run=False,
            )
            return
        self.call("metric logging", lambda mlflow: mlflow.log_metrics(values, step=int(record["step"])))

    def log_run_metrics(self, values: dict) -> None:
        """Whole-run figures (no step), e.g. ``real_tokens_per_s`` over the timed steps; missing ones
        skipped."""
        clean = {
            key: float(value)
            for key, value in values.items()
            if isinstance(value, Number) and math.isfinite(value)
        }
        self.call("metric logging", lambda mlflow: mlflow.log_metrics(clean))

    def log_params(self, params: dict) -> None:
        clean = {
            key: text[:500]
            for key, value in params.items()
            if (text := param_text(redact(value, key))) is not None
        }
        self.call("parameter logging", lambda mlflow: mlflow.log_params(clean))

    def log_artifacts(self, path: str, artifact_path: str | None) -> None:
        def log(mlflow):
            if Path(path).is_dir():
                mlflow.log_artifacts(path, artifact_path)
            else:
                mlflow.log_artifact(path, artifact_path)

        self.call(f"artifact logging of {path}", log)


def tuned_parameters_text() -> str | None:
    """The tuned file this process's run applies (``tune.record.in_effect``) and the train settings it sets,
    as the run's ``tuned_parameters``: ``conf/local/parameters_tuned.yml: train.batching.micro_batch_size,
    ...``; None where it applies none."""
    from fastlm.pipelines.tune.record import in_effect  # no torch: the tune record module alone

    tuned = in_effect()
    if tuned is None:
        return None
    where = Path(tuned.where)
    if where.is_absolute() and where.is_relative_to(Path.cwd()):
        where = where.relative_to(Path.cwd())
    settings = ", ".join("train." + ".".join(path) for path in tuned.leaves)
    return f"{where.as_posix()}: {settings}" if settings else where.as_posix()


class RunTracker:
    """The tracking a node is handed (catalog entry ``run_tracker``, filled by ``fastlm.hooks.RunTrackerHook``
    for each run): nodes pass its callbacks to the engine and report what they produced to it, and make no
    MLflow call themselves. One per run, so a store that failed once is not tried again by a later node."""

    def __init__(self) -> None:
        self.metrics = MlflowMetrics()

    @property
    def run_id(self) -> str | None:
        """The MLflow run of this ``kedro run`` (opened by the MLflow hook), if any."""
        return active_run_id()

    def callbacks(self) -> list:
        """Loop callbacks for this process: each logging-step record as metrics of the run."""
        return [self.metrics]

    def worker_callback_factory(self):
        """A picklable factory of the loop callback for launched training workers (they have no active run),
        or None without a run."""
        import functools

        target = tracking_target()
        return (
            functools.partial(MlflowMetrics, run_id=target.run_id, tracking_uri=target.tracking_uri)
            if target
            else None
        )

    def record(self, kind: str, record: dict) -> None:
        """One record with a ``step`` (e.g. a tune trial, ``step`` = its micro-batch size) as metrics."""
        self.metrics(kind, record)

    def log_params(self, params: dict) -> None:
        self.metrics.log_params(params)

    def training_finished(self, summary: dict) -> None:
        """The run's runtime settings, what its levers did (``SUMMARY_PARAMS``, dynamo's recompile limit
        reached and where), its data (the tokenized data's fingerprint, 12 digits: runs on other data show
        it; its test split's, ``data.test``) and the checkpoint and step a resumed run went on from as
        parameters, and its real tokens/s and training wall time (the run comparison's), its compiles,
        compile and validation seconds as metrics. A run applying the tune pipeline's tuned file names it
        and the settings it set (``tuned_parameters``): its micro-batch and accumulation are logged as any
        run's, and the same command before and after a tune otherwise shows no reason they differ."""
        fingerprint, test = summary.get("fingerprint"), summary.get("test_data")
        self.metrics.log_params(
            {
                "tuned_parameters": tuned_parameters_text(),
                **{f"runtime.{key}": value for key, value in summary["runtime"].items()},
                **{key: summary.get(key) for key in SUMMARY_PARAMS},
                "data.fingerprint": str(fingerprint)[:12] if fingerprint else None,
                # its test split's (corpus.fingerprint.identity_of_test_split): a fold run's test figures
                # compare with a run's on the same texts split without folds
                "data.test": str(test)[:12] if test else None,
                "recompile_limit_functions": summary.get("recompile_limit_functions") or None,
                # a training gone on with from its checkpoint: its curves begin after that step
                "resumed_checkpoint": summary.get("resumed_from"),
                "resumed_from_step": summary.get("resumed_from_step"),
            }
        )
        self.metrics.log_run_metrics(
            {
                "real_tokens_per_s": summary["real_tokens_per_s"],
                "wall_time_s": summary.get("wall_time_s"),
                "final_val_loss": summary.get("final_val_loss"),  # the model's (early stopping: best step's)
                # the last step's: also for a run entered again with nothing to train (no train/loss logged)
                "final_train_loss": summary.get("final_train_loss"),
                # the model's step (early stopping's best) and the last: the comparison names the losses'
                "model_step": (summary.get("early_stopping") or {}).get("model_from_step")
                or summary.get("steps"),
                "steps": summary.get("steps"),
                # the steps it set out to train (train.max_steps, or its epochs'): a run stopped before them
                # (its time budget, early stopping) is told apart from one that trained them
                "planned_steps": summary.get("planned_steps"),
                # where the time went besides the steps: torch.compile's compiles (the probe's among them)
                # and the validations
                **{key: summary.get(key) for key in ("compiles", "compile_s", "compile_probe_s", "eval_s")},
            }
        )

    def log_run_metrics(self, metrics: dict) -> None:
        """Metrics of the active run (a sweep's child run while one is open) without a step."""
        self.metrics.log_run_metrics(metrics)

    @contextlib.contextmanager
    def child_run(self, name: str, params: dict):
        """An MLflow run nested under the active run (a sweep's run), with ``params``; ended FAILED when the
        body raises (KILLED when a stop signal or Ctrl-C stopped it). Yields its run id. In a ParallelRunner
        worker it is nested in the run the main process shares (``shared_run``), never that run reopened.
        Without an active or shared run (tracking off or failed) nothing is opened, the body still runs and
        gets None. Its start, parameters
        and end are tried again where another command holds the SQLite store locked
        (``retried_while_locked``); a run that was opened is the body's and is ended, whatever fails after."""
        import mlflow

        parent = active_run_id() or shared_run(name)

        def start() -> None:
            if active_run_id() == parent:  # a try before this one that opened the run: not opened again
                with without_shared_run_id():
                    mlflow.start_run(
                        run_name=name, nested=True, parent_run_id=parent, tags={PROCESS_TAG: process_tag()}
                    )

        if parent is not None:
            try:
                retried_while_locked(f"child run {name} start", start)
            except Exception as exc:  # noqa: BLE001 - tracking fails open, training goes on
                log.warning(
                    "MLflow child run %s not started (%s); the sweep continues without it.", name, exc
                )
        run_id = active_run_id() if parent is not None and active_run_id() != parent else None
        if run_id is not None:
            texts = {key: param_text(redact(value, key)) for key, value in params.items()}
            logged = {key: text[:500] for key, text in texts.items() if text is not None}
            try:
                retried_while_locked(f"child run {name} parameters", mlflow.log_params, logged)
            except Exception as exc:  # noqa: BLE001 - the run stays the body's: it is ended below
                log.warning(
                    "MLflow child run %s: parameters not logged (%s); the sweep continues.", name, exc
                )

        def end(status: str) -> None:
            try:
                end_active_run(status)
            except Exception as exc:  # noqa: BLE001 - a finished run is kept, the sweep goes on
                log.warning("MLflow child run %s not ended %s (%s); the sweep continues.", name, status, exc)

        try:
            yield run_id
        except BaseException as error:
            if run_id is not None:
                end("KILLED" if stopped_by_user(error) else "FAILED")
            raise
        if run_id is not None:
            end("FINISHED")

    def adopt_child_run(self, run_id: str | None) -> None:
        """Nest the run ``run_id`` (a sweep member kept from an earlier sweep run: "finished before: kept")
        under the active run (or the shared one, in a ParallelRunner worker) where the sweep run it was
        nested in did not finish (stopped part way, KILLED, or failed): the sweep run whose cv/ metrics count
        it showed fewer folds than it compared, and the stopped one's children are what it left behind. A
        member of a sweep run that finished stays its child (that run's own table compared it). Nothing
        without a run either side; a failing store warns and the sweep goes on."""
        import mlflow

        parent = active_run_id() or shared_run("a kept sweep member")
        if run_id is None or parent is None or run_id == parent:
            return
        client = mlflow.MlflowClient()

        def adopt() -> None:
            earlier = client.get_run(run_id).data.tags.get("mlflow.parentRunId")
            if earlier == parent:
                return
            if earlier is not None and client.get_run(earlier).info.status == "FINISHED":
                return
            client.set_tag(run_id, "mlflow.parentRunId", parent)

        try:
            retried_while_locked("kept child run", adopt)
        except Exception as exc:  # noqa: BLE001 - tracking fails open, the sweep goes on
            log.warning("MLflow: kept run %s not nested under this sweep's run (%s)", run_id, exc)

    def log_test_metrics(self, values: dict, training_run_id: str | None, tags: dict | None = None) -> dict:
        """``values`` (``test_<name>``) on this run and on the training run, where the run comparison finds
        them, with ``tags``: how they were scored."""
        return log_test_metrics(values, training_run_id=training_run_id, tags=tags)

    def training_runs(self, training_run_id: str | None = None):
        """The runs of the experiment of the training run ``training_run_id`` reports (else this run's), for
        the run comparison (an empty frame, with a warning, if MLflow fails)."""
        return search_training_runs(training_run_id=training_run_id)


def log_test_metrics(values: dict, training_run_id: str | None, tags: dict | None = None) -> dict:
    """``values`` on the active run and on the training run (the one the comparison lists; it may be the
    active run), there less those it holds already with the same value (a report run again); ``tags`` (how
    they were scored: ``comparison.test_scoring_tags``) set on both, replacing an earlier report's. A failing
    store warns once. Returns them."""
    if not values:
        return values
    tags = tags or {}
    tracking = SafeMlflow()
    tracking.call("test metric logging", lambda mlflow: mlflow.log_metrics(values))
    if tags:
        tracking.call("test scoring tags", lambda mlflow: mlflow.set_tags(tags))
    if training_run_id and training_run_id != active_run_id():

        def log_on_training_run(mlflow):
            from mlflow.entities import Metric

            client, now = mlflow.MlflowClient(), int(time.time() * 1000)
            logged = client.get_run(training_run_id).data.metrics  # an earlier report's: not a second point
            batch = [
                Metric(key, value, now, 0)
                for key, value in values.items()
                if not _same_figure(logged.get(key), value)
            ]
            if batch:
                client.log_batch(training_run_id, metrics=batch)
            for key, value in tags.items():
                client.set_tag(training_run_id, key, value)

        tracking.call("test metric logging on the training run", log_on_training_run)
    return values


def _same_figure(logged, value: float) -> bool:
    """Whether ``value`` is the figure already ``logged`` (NaN as NaN: a report again adds no point)."""
    if logged is None:
        return False
    return logged == value or (math.isnan(logged) and math.isnan(value))


SEARCHED_RUNS = 500  # the newest runs of an experiment the run comparison reads (every kind of run counts)


def search_training_runs(experiment: str | None = None, training_run_id: str | None = None):
    """The runs of the active (or named) experiment as a DataFrame; an empty frame, with one warning, if
    MLflow fails. ``training_run_id``: the training run a report reports, whose experiment is listed where
    it is not the active run's (one line says so; the experiment renamed between train and report), the
    active run's with a warning where the store does not hold that run; that run is read also where
    ``SEARCHED_RUNS`` newer runs hide it."""
    import pandas as pd

    try:
        import mlflow

        if experiment is None:
            active = mlflow.active_run()
            ids = [active.info.experiment_id] if active is not None else None
            if training_run_id is not None:
                ids = _training_experiment(mlflow, training_run_id, ids)
            if not ids:
                return pd.DataFrame()
            runs = mlflow.search_runs(experiment_ids=ids, max_results=SEARCHED_RUNS)
            if training_run_id is None or (runs.get("run_id", pd.Series()) == training_run_id).any():
                return runs
            # an earlier training, behind SEARCHED_RUNS newer runs (splits, reports, predictions count)
            found = mlflow.search_runs(
                experiment_ids=ids, filter_string=f"attributes.run_id = '{training_run_id}'"
            )
            return pd.concat([runs, found], ignore_index=True) if len(found) else runs
        return mlflow.search_runs(experiment_names=[experiment], max_results=SEARCHED_RUNS)
    except Exception as exc:  # noqa: BLE001 - a report without the comparison beats no report
        log.warning("Run comparison skipped: MLflow search failed (%s: %s)", type(exc).__name__, exc)
        return pd.DataFrame()


def _training_experiment(mlflow, training_run_id: str, ids: list[str] | None) -> list[str] | None:
    """The experiment (as ``search_runs``' ids) of the training run ``training_run_id``, said where it is not
    the active run's (``ids``); ``ids`` with a warning where the store does not hold that run."""
    client = mlflow.MlflowClient()
    try:
        run = client.get_run(training_run_id)
    except Exception as exc:  # noqa: BLE001 - a run of another store, or deleted: this run's experiment
        log.warning(
            "Run comparison: the reported training run %s is not in this MLflow store (%s): the comparison "
            "lists this run's experiment, without it",
            training_run_id,
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
        )
        return ids
    experiment = run.info.experiment_id
    if not ids or experiment in ids:  # this run's experiment, or no run of its own (tracking off for it)
        return [experiment]

    def name(experiment_id: str) -> str:
        return client.get_experiment(experiment_id).name

    log.info(
        "Run comparison: the reported training run %s is in the MLflow experiment %r, not this run's %r: the "
        "comparison lists the runs of %r",
        run.info.run_name or training_run_id,
        name(experiment),
        name(ids[0]),
        name(experiment),
    )
    return [experiment]


OBJECT_REPR = re.compile(r"<([\w.]+) object at 0x[0-9a-fA-F]+>")


def param_text(value) -> str | None:
    """A parameter or tag value as MLflow stores it (text): ``None`` for an unset value (not logged at all),
    lists and mappings as JSON, an object without a readable value (a runner) as its class name."""
    if value is None:
        return None
    if isinstance(value, str):  # Kedro passes its runner as str(runner): "<pkg.Class object at 0x…>"
        found = OBJECT_REPR.fullmatch(value)
        return found.group(1).rsplit(".", 1)[-1] if found else value
    if isinstance(value, bool | Number):
        return str(value)
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, ensure_ascii=False, default=lambda item: type(item).__name__)
    return type(value).__name__


PROJECT_SCHEME = "fastlm-project"


def project_artifact_location(tracking_uri: str | None) -> str | None:
    """The experiment artefact location for ``tracking_uri``: ``fastlm-project:mlruns`` (a folder next to the
    SQLite store, resolved when used, so a copied or moved project keeps its artefacts with it) for a local
    SQLite store; ``None`` (the server's own default) for a tracking server."""
    return f"{PROJECT_SCHEME}:mlruns" if not tracking_uri or tracking_uri.startswith("sqlite:") else None


def project_folder(tracking_uri: str | None) -> Path:
    """The folder holding a local SQLite store (``sqlite:///mlflow.db``: the working directory)."""
    if tracking_uri and tracking_uri.startswith("sqlite:///"):
        return Path(tracking_uri.removeprefix("sqlite:///")).parent.resolve()
    return Path.cwd()


def register_project_artifacts() -> None:
    """Let MLflow read and write ``fastlm-project:`` artefact locations (also an
    ``mlflow.artifact_repository`` entry point, for ``mlflow ui``). Imports MLflow: call it where MLflow is
    used."""
    from mlflow.store.artifact.artifact_repository_registry import _artifact_repository_registry

    _artifact_repository_registry.register(PROJECT_SCHEME, ProjectArtifactRepository)


def _local_repository():
    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

    return LocalArtifactRepository


class ProjectArtifactRepository:
    """``fastlm-project:<path>``: a local artefact folder relative to the SQLite store's folder."""

    def __new__(cls, artifact_uri: str, tracking_uri: str | None = None, registry_uri: str | None = None):
        relative = artifact_uri.removeprefix(f"{PROJECT_SCHEME}:").lstrip("/")
        folder = project_folder(tracking_uri or _current_tracking_uri()) / relative
        return _local_repository()(folder.as_uri(), tracking_uri, registry_uri)


def _current_tracking_uri() -> str | None:
    try:
        import mlflow

        return mlflow.get_tracking_uri()
    except Exception:  # noqa: BLE001
        return None
