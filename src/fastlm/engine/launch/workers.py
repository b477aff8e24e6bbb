"""Launch N training workers on this machine with PyTorch's elastic launcher (what torchrun runs).

``launch_workers(job, nproc)`` starts ``nproc`` processes through
``torch.distributed.launcher.api.elastic_launch`` with a c10d rendezvous on a free local port, runs
:func:`fastlm.engine.launch.job.run_job` in each, and returns rank 0's result. The parent only waits.

How the workers start (``distributed.start_method``, ``worker_start_method``): ``spawn`` starts each as a
fresh interpreter, which imports torch, transformers and the engine before it can train, at every launch;
``forkserver`` forks each from one server process that imported this module once (Python's forkserver,
started by this process's first such launch and kept until it exits): a sweep's, k-fold's or test suite's
later launches skip the imports. Neither copies the parent's CUDA or thread state. ``auto`` takes forkserver
for a job on the CPU and spawn for one on another device; forkserver for a GPU job is refused: the server's
imports ask the CUDA driver for its devices (torchao's modules call ``torch.cuda.is_available()`` when
imported), after which PyTorch refuses CUDA in a forked child.

A forked worker's environment is the server's, the launcher's when the server started: when the launcher's
environment (or its ``sys.path``) has changed since, the server is stopped and started again before that
launch, so that its workers see it (and the imports see it: torch, transformers and others read some
variables when imported); a Python without the forkserver's stop spawns that launch's workers. Two variables
are left out of that comparison: ``TORCHELASTIC_SIGNALS_TO_HANDLE``, which the elastic launcher sets in
this process at each launch and reads here, not in a worker, and ``PYTEST_CURRENT_TEST``, which pytest sets
to the running test's name at each of its phases and nothing reads at import. The server imports the
engine from the launcher's ``sys.path`` (``_importing_from``), wherever the launcher found it.

The job (its tokenized data and tokenizer) is pickled once into a file beside the model folder, which each
worker reads: spawn writes a worker's arguments into its start pipe, and the worker reads their end only
after importing its parent's main module, so arguments beyond a pipe's buffer held the launcher at each
worker until that one had imported, and N workers started one after another. A memory-mapped split
pickles as its Arrow files' paths, which each worker opens again: the launcher records what it holds (its
rows, its files' inodes and a sampled digest, ``data.arrow_identity``) and a worker refuses a split that is
not that data (``read_job``), as when a split run wrote the tokenized data again after the train node
checked it: the run would have trained on other rows than those it records.

Failure handling is the elastic agent's: when any worker exits with an error or is killed, the agent stops
the others (SIGTERM, then SIGKILL after ``SHUTDOWN_TIMEOUT_S``) and raises ``ChildFailedError`` naming the
first failure; it is turned into one :class:`WorkerFailedError` line carrying that rank's own message (a
user error raised in a worker keeps its text and exit status). No worker is restarted (``max_restarts=0``):
a training run resumes from its checkpoint instead. The workers' error files and traceback files (torch's
``pytorch-errorfile-*``, written by a worker that raised) go into the launch's own log folder beside the
model folder (``.launch-<pid>-*.logs``), removed when the launch ends (``_tracebacks_in``). A worker that
native code crashes (SIGSEGV and the like) raises nothing: each writes its Python stack there on such a
crash (``faulthandler``), and the line names where it crashed (``_native_crash_site``).

The trained weights travel back through one safetensors file written by rank 0 next to the model folder,
not through a pipe; the parent builds the model once more and loads them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import json
import logging
import multiprocessing.forkserver
import os
import pickle
import re
import secrets
import shutil
import signal
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import safetensors.torch

from fastlm.engine.checkpoint.discovery import latest_checkpoint
from fastlm.engine.data.arrow_identity import identity_change, split_identity
from fastlm.engine.distributed.parallel import lost_peer, rank_from_env
from fastlm.engine.launch import server
from fastlm.engine.launch.job import JobResult, TrainJob, run_job, splits_identity
from fastlm.engine.model.lora import load_trained_weights, trains_part_only
from fastlm.engine.runtime.environment import usable_cpu_count
from fastlm.engine.train.signals import TrainingInterrupted, raise_swallowed_stop
from fastlm.errors import ConfigError, FastlmError, StaleDataError

log = logging.getLogger(__name__)
# How long the launcher's agent waits for its workers after it forwarded a stop signal (or after a worker
# failed) before it kills them: a worker stopped by a signal finishes its step and rank 0 saves it first.
SHUTDOWN_TIMEOUT_S = 30
_ELASTIC_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")
_EXIT_CODES = {"TrainingInterrupted": TrainingInterrupted.exit_code}
_server_environment: dict[str, str] | None = None  # the launcher's environment when its forkserver started
_server_path: list[str] | None = None  # and its sys.path
_NOT_COMPARED = frozenset({"TORCHELASTIC_SIGNALS_TO_HANDLE", "PYTEST_CURRENT_TEST"})  # module docstring


class WorkerFailedError(FastlmError):
    """A training worker failed or was killed; the launcher stopped the others. ``native_stack``: a worker
    crashed by native code, every thread's Python stack at the crash (``faulthandler``'s text), else ''."""

    exit_code = 1
    native_stack = ""


class WorkersStopped(FastlmError):
    """A stop signal (Ctrl-C, SIGTERM) ended the workers before rank 0 saved a checkpoint: a stop, not a
    failure, so the run ends with status 130 and its MLflow run KILLED, as a one-process run stopped before
    its first checkpoint does."""

    exit_code = 130


def launch_workers(
    job: TrainJob,
    nproc: int,
    *,
    build_model: Callable[[], object],
    callback_factory: Callable[[], Callable] | None = None,
    monitor_interval_s: float = 0.5,
    start_method: str = "auto",
) -> JobResult:
    """Run ``job`` in ``nproc`` worker processes; return rank 0's result with the trained model.

    ``build_model()`` makes the (untrained) model in this process, to load rank 0's weights into;
    ``callback_factory`` (picklable) makes rank 0's loop callback inside the worker (e.g. MLflow metrics);
    ``start_method``: ``distributed.start_method`` (module docstring).
    """
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    refuse_more_workers_than_cores(nproc, job.params.runtime.device)  # refused before any file is made
    method = worker_start_method(start_method, job.params.runtime.device)
    staging = Path(job.model_dir).parent
    staging.mkdir(parents=True, exist_ok=True)
    _remove_stale_handovers(staging)
    handover = staging / f".launch-{os.getpid()}-{secrets.token_hex(4)}"
    weights, job_file = handover.with_suffix(".safetensors"), handover.with_suffix(".job")
    # the agent's log folder (each worker's error file): torch's default is a new /tmp/torchelastic_* folder
    # at each launch, never removed; it also holds each worker's traceback file (_tracebacks_in)
    logs = handover.with_suffix(".logs")
    start = _server_or_spawn(method, job)
    log.info(
        "Launching %d training workers (elastic launcher, %s, c10d rendezvous on 127.0.0.1)", nproc, start
    )
    launched = time.time()
    try:
        logs.mkdir(mode=0o700)
        config = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=nproc,
            rdzv_backend="c10d",
            rdzv_endpoint="127.0.0.1:0",
            run_id=f"fastlm-{secrets.token_hex(6)}",
            max_restarts=0,
            monitor_interval=monitor_interval_s,
            start_method=start,
            shutdown_timeout=SHUTDOWN_TIMEOUT_S,
            logs_specs=DefaultLogsSpecs(log_dir=str(logs)),
        )
        job = dataclasses.replace(job, data_identity=splits_identity(job))  # before the pickling
        _write_private(job_file, pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))
        raise_swallowed_stop()  # a Ctrl-C a finalizer swallowed while the job was prepared: no worker starts
        with (
            _quiet_elastic_logs(),
            _own_signal_handlers(),
            _rendezvous_names_from_frames(),
            _tracebacks_in(logs),
        ):
            results = elastic_launch(config, _worker)(
                str(job_file), str(weights), callback_factory, os.environ.get("PYTHONPATH")
            )
        result: JobResult = results[0]
        model = build_model()
        if trains_part_only(model):  # the adapters alone: the base was built again from name_or_path
            load_trained_weights(model, safetensors.torch.load_file(str(weights)))
        else:
            safetensors.torch.load_model(model, str(weights))
        result.model = model
        return result
    except ChildFailedError as error:
        raise _worker_error(error, nproc, logs) from None
    except SignalException as error:
        raise _stopped_by(error.sigval.name, job, nproc, since=launched) from None
    finally:
        weights.unlink(missing_ok=True)
        job_file.unlink(missing_ok=True)
        shutil.rmtree(logs, ignore_errors=True)  # the workers' error files were read into the error raised


def _stopped_by(signal_name: str, job: TrainJob, nproc: int, *, since: float) -> FastlmError:
    """The launcher got a stop signal and its workers have ended: as a one-process run would say it
    (``TrainingInterrupted``, exit 130) where rank 0 saved a checkpoint since the launch (the workers finish
    their step and save it: ``GracefulStop``'s ``persistent``), else that nothing was saved
    (:class:`WorkersStopped`, exit 130 too)."""
    saved = latest_checkpoint(Path(job.params.checkpoint_dir))
    if saved is not None and saved.stat().st_mtime >= since:
        step = int(saved.name.rsplit("-", 1)[1])  # checkpoint-<step>
        return TrainingInterrupted(signal_name, step, saved, resume=job.params.resume)
    return WorkersStopped(
        f"training stopped by {signal_name}: the {nproc} workers were stopped before a checkpoint was saved.",
        fix="run the same command again; train.resume: auto continues from the last checkpoint.",
    )


def _device_kind(device: str) -> str:
    """The kind of device a job on ``device`` (``runtime.device``) trains on: ``auto`` is CUDA where it is
    present, else the CPU."""
    import torch

    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else torch.device(device).type


def refuse_more_workers_than_cores(nproc: int, device: str) -> None:
    """One line where a CPU job (``runtime.device``) would start more workers than this machine has usable
    cores (``runtime.environment.usable_cpu_count``: the affinity mask, a container's CPU quota): each
    worker takes one thread and two share a core, and every step's collectives wait for the slowest, so
    the run is slower than with fewer processes. A job on a GPU runs a process per GPU (``rank_device``)."""
    cores = usable_cpu_count()
    if nproc <= cores or _device_kind(device) != "cpu":
        return
    raise ConfigError(
        f"train.distributed.nproc_per_node is {nproc} and this CPU run has {cores} usable CPU cores: each "
        f"worker process needs a core of its own (processes sharing a core wait for one another at every "
        f"step, slower than fewer processes).",
        fix=f"set train.distributed.nproc_per_node to at most {cores} (raise "
        "train.batching.gradient_accumulation_steps to keep the effective batch), or 1.",
    )


def worker_start_method(requested: str, device: str) -> str:
    """``distributed.start_method`` for a job on ``device`` (``runtime.device``): ``auto`` is forkserver for
    the CPU, spawn for any other device; forkserver for another device is refused (module docstring)."""
    if requested == "spawn":
        return requested
    kind = _device_kind(device)
    if kind == "cpu":
        return "forkserver"
    if requested == "forkserver":
        raise ConfigError(
            f"train.distributed.start_method is forkserver and the job trains on {kind}: the server's "
            f"imports ask the {kind} driver for its devices, after which a forked worker cannot use it.",
            fix="set train.distributed.start_method: auto (or spawn).",
        )
    return "spawn"


def server_preload(job: TrainJob) -> list[str]:
    """The modules a forkserver imports before it forks a worker: ``fastlm.engine.launch.server`` (the
    launcher's logging levels, first), this module (the engine), then what each worker would import for
    ``job`` on its own: the module of its splits' class (``datasets``, read as the job is unpickled) and of
    the transformers class it trains (None where the configuration alone cannot tell it: a hub id, remote
    code)."""
    from fastlm.engine.model.pretrained import trained_class

    modules = [server.__name__, __name__]
    for split in (job.train_split, job.eval_split):
        if split is not None and type(split).__module__ not in (*modules, "builtins"):
            modules.append(type(split).__module__)
    trained = trained_class(job.params.model.name_or_path, job.params.model.trust_remote_code)
    if trained is not None and trained.__module__ not in modules:
        modules.append(trained.__module__)
    return modules


def _server_or_spawn(method: str, job: TrainJob) -> str:
    """``method``; for forkserver, a server started with this process's environment and ``sys.path`` as
    they are now: one started with others is stopped and started again (its workers would not see the
    change), or where it cannot be, this launch spawns. The first forkserver launch starts the server, which
    imports this module under the launcher's logging levels (``fastlm.engine.launch.server``) before it
    forks any worker, then the rest of :func:`server_preload` (the first forkserver launch's ``job``'s, kept
    by a server started again)."""
    global _server_environment, _server_path
    if method != "forkserver":
        return method
    environment = {name: value for name, value in os.environ.items() if name not in _NOT_COMPARED}
    changed = None
    if _server_environment is not None and environment != _server_environment:
        names = sorted({name for name, _ in set(environment.items()) ^ set(_server_environment.items())})
        changed = f"the environment changed since the worker server started ({', '.join(names)})"
    elif _server_path is not None and sys.path != _server_path:
        changed = "sys.path changed since the worker server started"
    if changed is not None:
        # Python's forkserver has no public stop; between launches no worker of it runs
        stop = getattr(getattr(multiprocessing.forkserver, "_forkserver", None), "_stop", None)
        if stop is None:
            log.info("%s: these workers are spawned", changed)
            return "spawn"
        log.info("%s: the server is started again", changed)
        stop()
    if _server_environment is None:
        multiprocessing.forkserver.set_forkserver_preload(server_preload(job))
    with _importing_from(sys.path), _handing_over_log_levels():
        multiprocessing.forkserver.ensure_running()
    _server_environment, _server_path = environment, list(sys.path)
    return "forkserver"


@contextlib.contextmanager
def _importing_from(path: list[str]) -> Iterator[None]:
    """``PYTHONPATH`` set to ``path`` while the forkserver starts: it imports this module before it applies
    the launcher's ``sys.path`` (Python 3.11), so it would find the engine where the interpreter does by
    itself, not in a folder the launcher put on its path at run time. Each worker puts the launcher's own
    ``PYTHONPATH`` back (``_worker``)."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(entry for entry in path if entry)
    try:
        yield
    finally:
        _restore_pythonpath(before)


@contextlib.contextmanager
def _handing_over_log_levels() -> Iterator[None]:
    """This process's logging levels in the environment while the forkserver starts (its
    ``fastlm.engine.launch.server`` sets them before it imports the engine)."""
    os.environ[server.LEVELS_VARIABLE] = json.dumps(server.logger_levels())
    try:
        yield
    finally:
        os.environ.pop(server.LEVELS_VARIABLE, None)


def _restore_pythonpath(value: str | None) -> None:
    if value is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = value


_HANDOVER = re.compile(r"\.launch-(\d+)-[0-9a-f]+\.(job|safetensors|logs)")


def _remove_stale_handovers(staging: Path) -> None:
    """The hand-over files (job, weights) and log folder a launcher killed outright left in ``staging``: those
    of a process that no longer runs are removed (a running one's, another run's launch, are kept)."""
    for path in staging.glob(".launch-*"):
        match = _HANDOVER.fullmatch(path.name)
        if match is None:
            continue
        try:
            os.kill(int(match[1]), 0)
        except ProcessLookupError:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            log.info("removed %s, left by a launch whose process no longer runs", path.name)
        except (PermissionError, OverflowError):
            continue  # another user's running process, or an id too large to be one a launcher wrote


def _write_private(path: Path, data: bytes) -> None:
    """``data`` into a new file only this user can read."""
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
        file.write(data)


def _worker(job_file: str, weights: str, callback_factory, pythonpath: str | None) -> JobResult | None:
    """A worker's entry point (runs in the worker process): the job from the file its parent wrote.
    ``pythonpath``: the launcher's ``PYTHONPATH`` (a forked worker has its server's, ``_importing_from``)."""
    for signum in server.SERVER_IGNORES:  # a forked worker inherits its server's SIG_IGN (launch.server)
        signal.signal(signum, signal.SIG_DFL)
    _restore_pythonpath(pythonpath)
    rank = rank_from_env()
    _record_native_crashes(Path(job_file).with_suffix(".logs"), rank.rank)
    job = read_job(job_file)
    _configure_worker_logging(rank.rank)
    callbacks = (callback_factory(),) if callback_factory is not None and rank.is_main else ()
    try:
        result = run_job(job, rank, callbacks=callbacks)
    except Exception as error:
        # A collective whose peer process is gone (``parallel.lost_peer``): the launcher names one failed
        # worker, the first it finds at a check (the lowest rank when several ended since the last), and the
        # killed peer is the cause; a worker failing this way waits two checks before it ends.
        if lost_peer(error):
            time.sleep(2 * job.params.distributed.monitor_interval_s)
        raise
    if result is None:
        return None
    if trains_part_only(result.model):  # LoRA: its trained weights (a 4-bit base's state is no tensor)
        trained = {name: p.detach() for name, p in result.model.named_parameters() if p.requires_grad}
        safetensors.torch.save_file({name: t.contiguous() for name, t in trained.items()}, weights)
    else:
        safetensors.torch.save_model(result.model, weights)
    result.model = None
    return result


# the tokenized data written again between the launcher's check and a worker's open of its files
_SPLIT_AGAIN = (
    "a split (`kedro run --pipeline=split`) wrote the tokenized data again while this training started: wait "
    "for it to finish, then run the training again (its data is checked again then)."
)


def read_job(job_file: str | Path) -> TrainJob:
    """The job a launcher pickled into ``job_file``, its splits opened again from their files, refused
    (StaleDataError, one line naming the split and the fix) where one of them is not the data the launcher
    held and checked: the tokenized data was written again in between (module docstring). The check reads
    the splits' file sizes and a few hundred KiB a column (``data.arrow_identity``)."""
    try:
        job: TrainJob = pickle.loads(Path(job_file).read_bytes())
    except FileNotFoundError as error:  # the folder swapped in holds other file names
        raise StaleDataError(
            f"the tokenized data's files are gone since the launcher checked them "
            f"({error.filename or error}).",
            fix=_SPLIT_AGAIN,
        ) from None
    for name, expected in (job.data_identity or {}).items():
        split = job.train_split if name == "train" else job.eval_split
        change = identity_change(expected, split_identity(split))
        if change is not None:
            files = getattr(split, "cache_files", None)
            where = f" ({Path(files[0]['filename']).parent})" if files else ""
            raise StaleDataError(
                f"the {name} split of the tokenized data{where} changed since the launcher checked it: "
                f"{change}.",
                fix=_SPLIT_AGAIN,
            )
    return job


def _configure_worker_logging(rank: int) -> None:
    """Rank 0 logs like the parent (INFO); the other ranks only warnings and errors, each line tagged. The
    filter is the handler's: a worker's loggers keep the levels the forkserver was handed and its kedro import
    applied (``fastlm`` at INFO, conf/logging.yml's), which the root's level alone does not hold back."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[rank {rank}] %(levelname)s %(name)s: %(message)s"))
    if rank != 0:
        handler.setLevel(logging.WARNING)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    for name in ("httpx", "urllib3", "datasets", "transformers"):
        logging.getLogger(name).setLevel(logging.WARNING)


@contextlib.contextmanager
def _quiet_elastic_logs():
    """The agent logs every failure with a stack of its own internals; we report the root cause in one
    line."""
    loggers = [logging.getLogger(name) for name in _ELASTIC_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _method_name_from_frame(depth: int = 2) -> str:
    """The elastic rendezvous's ``get_method_name``: the function ``depth`` frames above this one, from the
    frame itself (``inspect.stack()``, which it called twice, reads every frame's source lines)."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # fewer frames: what the rendezvous's own function says then
        return "no_method_name"


@contextlib.contextmanager
def _rendezvous_names_from_frames() -> Iterator[None]:
    """The rendezvous names each of its events by its caller's method, even where no handler records them
    (``construct_and_record_rdzv_event`` drops them afterwards); under a deep stack (a test session, a
    Kedro run) its ``inspect.stack()`` calls took the launcher most of a second per launch. During the
    launch the same name comes from the frame (:func:`_method_name_from_frame`); put back afterwards."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    original = getattr(dynamic_rendezvous, "get_method_name", None)
    if original is None:  # a torch without it: nothing to replace
        yield
        return
    dynamic_rendezvous.get_method_name = _method_name_from_frame
    try:
        yield
    finally:
        dynamic_rendezvous.get_method_name = original


@contextlib.contextmanager
def _tracebacks_in(folder: Path) -> Iterator[None]:
    """torch's process start (``torch.multiprocessing.start_processes``, which the agent's
    ``MultiprocessContext._start`` calls) names each worker's traceback file
    (``pytorch-errorfile-*.pickle``, written by a worker that raised) in this process's temporary folder,
    ``tempfile``'s, and never removes it: every failed launch left one a worker in /tmp. It takes no folder,
    so during the launch that start runs with ``tempfile.tempdir`` set to ``folder`` (the launch's log
    folder, removed when the launch ends), put back as soon as the workers are started, even on an error.
    The workers do not inherit it (spawned: a new interpreter; forked: from the server)."""
    from torch.distributed.elastic.multiprocessing import api

    original = getattr(api.MultiprocessContext, "_start", None)
    if original is None:  # a torch without it: nothing to redirect
        yield
        return

    def start_with_tracebacks_in_folder(context) -> None:
        before = tempfile.tempdir
        tempfile.tempdir = str(folder)
        try:
            original(context)
        finally:
            tempfile.tempdir = before

    api.MultiprocessContext._start = start_with_tracebacks_in_folder
    try:
        yield
    finally:
        api.MultiprocessContext._start = original


@contextlib.contextmanager
def _own_signal_handlers():
    """The agent installs SIGTERM/SIGINT/... handlers that raise its SignalException; put ours back
    afterwards."""
    saved = {}
    if threading.current_thread() is threading.main_thread():
        for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"):
            if hasattr(signal, name):
                saved[getattr(signal, name)] = signal.getsignal(getattr(signal, name))
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


# signals by which a process's own native code ends it (a kernel's or a library's bad read, an abort)
_NATIVE_CRASHES = ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<name>\S+)', re.MULTILINE)


def _native_crash_path(logs: Path, rank: int) -> Path:
    return logs / f"native-crash-rank{rank}.txt"


def _record_native_crashes(logs: Path, rank: int) -> None:
    """This worker writes its Python stack into the launch's log folder if native code crashes it (SIGSEGV,
    SIGBUS, SIGILL, SIGFPE, SIGABRT: ``faulthandler``), which otherwise leaves no error behind: the launcher
    names where it crashed (``_native_crash_site``). Nothing is written unless it crashes."""
    if not logs.is_dir():  # a worker started by another launcher
        return
    # a descriptor, open until the process ends (a file object would be closed, and warned of, at its exit)
    record = os.open(_native_crash_path(logs, rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    faulthandler.enable(record, all_threads=True)


def _native_crash_record(logs: Path | None, rank: int) -> str:
    """Worker ``rank``'s stack record of a native crash (``faulthandler``'s text), or ''."""
    try:
        return _native_crash_path(logs, rank).read_text(errors="replace") if logs is not None else ""
    except OSError:
        return ""


def _native_crash_site(record: str) -> str | None:
    """Where native code crashed a worker, from its stack record: the Python function that was running,
    and the innermost frame under it of the engine or of the caller's own code (outside the standard
    library and the installed packages), or None."""
    current = record.partition("Current thread")[2].split("\n\n", 1)[0]
    frames = list(_FRAME.finditer(current))  # most recent call first
    if not frames:
        return None
    where = f"under {frames[0]['name']} ({frames[0]['file']}:{frames[0]['line']})"
    libraries = {sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    own = [  # the engine's frames, or the caller's own code (neither the standard library nor a package)
        f
        for f in frames[1:]
        if "/fastlm/" in f["file"] or not any(f["file"].startswith(lib) for lib in libraries if lib)
    ]
    if own:
        where += f", from {own[0]['name']} ({own[0]['file']}:{own[0]['line']})"
    return where


def _worker_error(error, nproc: int, logs: Path | None = None) -> FastlmError:
    """The cause of a ChildFailedError as one line (the worker's own message when it raised): a worker
    killed by a signal, else the first failure. A killed worker writes no error and its peers fail on the
    closed connection a moment later; the launcher dates theirs by their error files and the killed one's by
    when it looked, in whole seconds, so its "first failure" can be a peer's. A worker that native code
    crashed is named with where it crashed (its stack record in ``logs``)."""
    killed = {rank: failure for rank, failure in error.failures.items() if failure.exitcode < 0}
    rank, failure = min(killed.items()) if killed else error.get_first_failure()
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    message = " ".join(str(message or f"exit code {failure.exitcode}").split())
    kind, _, text = message.partition(": ")
    if failure.exitcode < 0 or kind.startswith("Signal"):
        record = _native_crash_record(logs, rank) if any(s in message for s in _NATIVE_CRASHES) else ""
        site = _native_crash_site(record)
        if site is not None:
            crashed = WorkerFailedError(
                f"training worker rank {rank} of {nproc} was killed ({message}): it crashed in native code "
                f"{site}; the other workers were stopped.",
                fix="run the same command again (train.resume: auto continues from the last checkpoint); if "
                "it crashes at the same place again, report it with the versions the run logged first.",
            )
            crashed.native_stack = record  # every thread's stack, for a report (not printed)
            return crashed
        return WorkerFailedError(
            f"training worker rank {rank} of {nproc} was killed ({message}); the other workers were stopped.",
            fix="look for the cause (e.g. the out-of-memory killer in `dmesg`), then run the same command "
            "again: train.resume: auto continues from the last checkpoint.",
        )
    user_error = re.fullmatch(r"\w*(Error|Interrupted)", kind) and kind in _user_error_names()
    failed = WorkerFailedError(
        f"training worker rank {rank} of {nproc} failed: {text if user_error else message}"
    )
    if user_error:
        failed.exit_code = _EXIT_CODES.get(kind, FastlmError.exit_code)
    return failed


def _user_error_names() -> set[str]:
    """Names of every FastlmError subclass (a worker's user error is reported as such)."""
    names, todo = set(), [FastlmError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names
