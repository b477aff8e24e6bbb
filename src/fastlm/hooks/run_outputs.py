"""The run's name, resolved once before any node runs, and its outputs: their folders checked writable
before the run starts, written by one `kedro run` at a time, a copy of each kept per training run."""

from __future__ import annotations

import atexit
import logging
import os
import shlex
import shutil
import sys
from contextlib import ExitStack
from pathlib import Path

from kedro.framework.hooks import hook_impl

from fastlm.engine.checkpoint.lock import held_lock, refuse_held_checkpoint
from fastlm.engine.checkpoint.storage import check_writable
from fastlm.errors import FastlmError
from fastlm.hooks.catalog import ParallelRunOutputs, local_path, put
from fastlm.temporary_files import write_file_atomically

log = logging.getLogger(__name__)


RUN_NAME = "params:run_name"


class RunNameHook:
    """Resolve the run's name once, before any node runs, and put it in the catalog as ``params:run_name``.

    Every node and hook then reads the same name (``fastlm.runs``: ``--params run_name=...``, else the
    pipeline and a timestamp, else, for a training run with ``train.resume: auto``, the newest interrupted
    run). An unsafe name is one ConfigError line before anything is written.
    """

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        from fastlm.engine.config import TrainParams
        from fastlm.runs import resolve_run_name

        given = catalog.load(RUN_NAME) if RUN_NAME in catalog else None
        trains = "params:train" in pipeline.inputs() and any(
            "params:train" in node.inputs and "trained_model" in node.outputs for node in pipeline.nodes
        )
        train = catalog.load("params:train") if trains and "params:train" in catalog else {}
        train = train if isinstance(train, dict) else {}
        processes = int(os.environ.get("WORLD_SIZE", "1") or 1)
        launch = os.environ.get("TORCHELASTIC_RUN_ID") if processes > 1 else None
        checkpoints = Path(str(train.get("checkpoint_dir", TrainParams().checkpoint_dir)))
        name = resolve_run_name(
            given,
            run_params.get("pipeline_names"),
            checkpoints,
            resume=str(train.get("resume", "auto")),
            trains=trains,
            launch_id=launch if launch not in (None, "", "none") else None,
        )
        # a run of this name training now: refused before MLflow opens a second run of that name (not under
        # torchrun, where this job's rank 0 may hold it already while another rank starts)
        if trains and processes == 1:
            refuse_held_checkpoint(checkpoints / name)
        put(catalog, RUN_NAME, name)
        log.info("Run name: %s", name)


class OutputFoldersWritableHook:
    """Before a run starts, refuse an output folder that cannot be written: one line, nothing has run.

    A read-only ``data/`` folder would otherwise fail after the slow steps (tokenization, training).
    Each distinct parent folder of the pipeline's file outputs gets one probe file, written and removed.
    """

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        checked: set[Path] = set()
        for name in sorted(pipeline.all_outputs()):
            path = local_path(catalog, name)
            if path is None or path.parent in checked:
                continue
            checked.add(path.parent)
            check_writable(path.parent, parameter=f"{name} (conf/base/catalog.yml)")


# The latest training's outputs: two trainings under other run names may run at once (one per GPU): each
# holds its checkpoint folder's lock, keeps its own copies (keep_per_run) and writes these last, and every
# reader checks they are one training's (the report's check_one_training, ReportOfOneTrainingHook); the
# model folder is replaced whole. They take no project lock.
LATEST_TRAINING_OUTPUTS = frozenset({"trained_model", "train_history", "eval_history", "train_summary"})


def output_lock_file(path: Path) -> Path:
    """The lock a `kedro run` holds beside an output file or folder while its pipeline may write it."""
    return path.with_name(f".{path.name}.lock")


class OutputsLockHook:
    """One `kedro run` at a time writes an output of the project: before any node runs, each local file or
    folder the pipeline writes gets a lock beside it (:func:`output_lock_file`, naming the run's PID, host and
    command), released when the run ends; the latest training's outputs excepted (LATEST_TRAINING_OUTPUTS:
    two trainings under other run names may run at once).

    Why: two commands writing one output at once (two splits, two predicts of one file, a report during a
    split-train-report run) leave one's file beside the other's (a split's tokenized data with the other's
    fingerprint, predictions.csv with another job's predict_summary.json), each looking whole. The second
    command is refused in one line naming the first's PID and command; nothing is written. Readers take no
    lock (outputs are replaced whole, and readers check what they read belongs together). A lock whose
    process no longer runs is taken over, as is this process's own (an in-process run that a later hook
    refused before it could end). A run that ends without Kedro's after_pipeline_run or on_pipeline_error
    (Ctrl-C during a node, a KeyboardInterrupt; a later hook refusing the run) releases them at the
    process's exit: a lock file left behind would be refused for good by a run of another host name (a new
    container on the same volume).
    """

    def __init__(self) -> None:
        self._held: ExitStack | None = None
        self._holder: int | None = None  # the PID that took them (a forked worker releases none)
        self._released_at_exit = False

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        self._release()
        command = (
            " ".join(shlex.quote(arg) for arg in ["kedro", *sys.argv[1:]]) if sys.argv[1:] else "kedro run"
        )
        held = ExitStack()
        try:
            for name in sorted(pipeline.all_outputs() - LATEST_TRAINING_OUTPUTS):
                path = local_path(catalog, name)
                if path is None:
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                held.enter_context(
                    held_lock(
                        output_lock_file(path),
                        lambda holder, name=name, path=path: _in_use(name, path, holder),
                        record={"command": command},
                        own_is_stale=True,
                    )
                )
        except BaseException:
            held.close()
            raise
        self._held, self._holder = held, os.getpid()
        if not self._released_at_exit:
            atexit.register(self._release)
            self._released_at_exit = True

    @hook_impl
    def after_pipeline_run(self) -> None:
        self._release()

    @hook_impl
    def on_pipeline_error(self) -> None:
        self._release()

    def _release(self) -> None:
        held, self._held = self._held, None
        if held is not None and self._holder == os.getpid():
            held.close()


def _in_use(name: str, path: Path, holder: dict) -> FastlmError:
    lock = output_lock_file(path)
    command = holder.get("command") or "another kedro run"
    return FastlmError(
        f"{name} ({path}) is being written by another command in this project: `{command}` (PID "
        f"{holder['pid']} on {holder.get('host', '?')}, lock file {lock}); two at once would mix their "
        "outputs.",
        fix=f"wait for it to finish (or stop it), then rerun; delete {lock} only if that process is gone.",
    )


class RunOutputsHook:
    """Keep a copy of each output whose catalog entry has ``metadata: {keep_per_run: <folder>}`` in
    ``<folder>/<run name>/`` (a model folder as hard links where the disk allows, so no second copy of the
    weights), so an earlier run's model and report survive the next run for comparison.

    The run name is the TRAINING run's: this run's own name when it trains, else the name in the
    ``train_summary`` that a report run reads (its own name when that summary has none). A training's summary
    kept there removes the folder's copies of outputs the run does not write (an earlier training's report
    under the same name).

    Under Kedro's ParallelRunner the dataset hooks run in its worker processes (spawned: fresh hooks that
    never saw the run start): there the process that runs the pipeline keeps the copies when the run ends,
    of every output (of those saved since it started when a node failed), and the workers keep none.
    """

    def __init__(self) -> None:
        self._catalog = None
        self._trained: str | None = None
        self._pid: int | None = None  # the PID of before_pipeline_run (a forked worker copy: another)
        self._parallel: ParallelRunOutputs | None = None  # under ParallelRunner
        self._outputs: set[str] = set()  # the datasets this run writes

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        self._catalog, self._pid, self._parallel = catalog, os.getpid(), None
        self._outputs = set(pipeline.all_outputs())
        self._trained = catalog.load(RUN_NAME) if "train_summary" in pipeline.all_outputs() else None
        self._parallel = ParallelRunOutputs.at_start(run_params, pipeline, catalog)

    @hook_impl
    def after_pipeline_run(self) -> None:
        self._keep_parallel(changed_only=False)

    @hook_impl
    def on_pipeline_error(self) -> None:
        self._keep_parallel(changed_only=True)

    def _keep_parallel(self, *, changed_only: bool) -> None:
        started, self._parallel = self._parallel, None
        for name in started.at_end(changed_only=changed_only) if started is not None else []:
            self._keep(name)

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data, node) -> None:
        if self._parallel is None and self._pid == os.getpid():
            self._keep(dataset_name)

    def _keep(self, dataset_name: str) -> None:
        catalog = self._catalog
        if catalog is None or dataset_name not in catalog:
            return
        folder = (getattr(catalog[dataset_name], "metadata", None) or {}).get("keep_per_run")
        path = local_path(catalog, dataset_name)
        if not folder or path is None or not path.exists():
            return
        from fastlm.datasets.atomic_folder import write_folder_atomically

        target = Path(folder) / self._owner() / path.name
        try:
            if path.is_dir():
                write_folder_atomically(
                    target,
                    lambda tmp: shutil.copytree(path, tmp, dirs_exist_ok=True, copy_function=_link_or_copy),
                )
            else:
                _copy_file_atomically(path, target)
        except OSError as error:
            log.warning(
                "could not keep a copy of %s in %s (%s); the output itself is written", path, target, error
            )
        if dataset_name == "train_summary":
            self._drop_earlier_training_copies()

    def _drop_earlier_training_copies(self) -> None:
        """A training's summary kept in its run's folder: the copies there of outputs this run does not write
        (the report's: report.html, report.md, test_metrics.json) are an earlier training's under the same
        name (trained again from the start, or continued past its report), removed so the folder holds one
        training's outputs, not another's report beside this one's summary."""
        catalog = self._catalog
        if "train_summary" not in self._outputs:  # not a training run's (or a run this hook did not start)
            return
        try:
            names = [name for name in catalog.keys() if name not in self._outputs]
        except Exception:  # noqa: BLE001 - a catalog that cannot list its entries: nothing removed
            return
        for name in names:
            if name.startswith("params:") or name == "parameters":
                continue
            try:
                folder = (getattr(catalog[name], "metadata", None) or {}).get("keep_per_run")
            except Exception:  # noqa: BLE001 - an entry that cannot be built keeps no copy either
                continue
            path = local_path(catalog, name) if folder else None
            copy = Path(folder) / self._owner() / path.name if path is not None else None
            if copy is not None and copy.is_file():
                try:
                    copy.unlink()
                except OSError as error:
                    log.warning("could not remove %s, an earlier training's (%s)", copy, error)
                else:
                    log.info("Removed %s: an earlier training's under the run name %s", copy, self._owner())

    def _owner(self) -> str:
        if self._trained is None:
            try:
                summary = self._catalog.load("train_summary") if "train_summary" in self._catalog else None
            except Exception:  # noqa: BLE001 - no summary yet: this run's own name
                summary = None
            name = summary.get("run_name") if isinstance(summary, dict) else None
            self._trained = name or self._catalog.load(RUN_NAME)
        return self._trained


def _copy_file_atomically(source: Path, target: Path) -> None:
    """``source`` copied to ``target`` through a sibling temporary file renamed over it: a copy stopped part
    way (a full disk, Ctrl-C) leaves the previous copy, never a cut one that the run comparison and the
    report's checks would read."""
    with open(source, "rb") as handle:
        write_file_atomically(target, lambda copy: shutil.copyfileobj(handle, copy), binary=True)
    shutil.copystat(source, target)


def _link_or_copy(source: str, target: str) -> None:
    """A hard link (no extra disk; the saved files are replaced, never rewritten in place), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
