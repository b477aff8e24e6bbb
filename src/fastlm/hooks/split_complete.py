"""The split pipeline's outputs used together or not at all (the ``split_complete.json`` marker), and
the raw file a finished split read, checked unchanged by the pipelines that read its outputs."""

from __future__ import annotations

import importlib
import json
import logging
import os
import shlex
from pathlib import Path

from kedro.framework.hooks import hook_impl

from fastlm.corpus.shards import (
    data_files,
    file_changed,
    file_record,
    shards_changed,
    shards_record,
    size_change,
)
from fastlm.engine.paths import project_name
from fastlm.errors import ConfigError, FastlmError, InputDataError, StaleDataError
from fastlm.hooks.catalog import local_path
from fastlm.temporary_files import write_file_atomically

log = logging.getLogger(__name__)

SPLIT_COMPLETE = "split_complete.json"  # beside tokenized_corpus_fingerprint: the last split finished


RAW = "raw_corpus"  # the catalog entry of the raw file (raw_path)


def raw_record(raw: Path | None) -> dict | None:
    """The raw file a split read: its path (relative to the project folder when inside it), size, time and
    SHA-256; for a folder or glob of shards, its path and each shard's record (``corpus.shards``); None for
    none or no local file."""
    if raw is None:
        return None
    shards = shards_record(Path(project_name(raw)))
    if shards is not None:  # a folder or glob of shards: each one's record
        return {"path": project_name(raw), "shards": shards}
    return file_record(raw, project_name(raw)) if raw.is_file() else None


def _record_before_read(raw: Path) -> dict | None:
    """``raw_record`` of the raw data before the split reads it, so that the split's record is of the bytes
    it read (None where it cannot be taken now: recorded when the split finishes, as before)."""
    try:
        return raw_record(raw)
    except (OSError, FastlmError):
        return None


def check_raw_unchanged(marker: Path, given: str | None, now: Path | None) -> None:
    """Refuse a pipeline that reads the split data without making it when ``--params raw_path`` names another
    file than the split read, or when that file changed since (its bytes: a new time alone is the same
    file). A split recorded without its raw file (an older fastlm), or a raw file gone since, is not
    compared."""
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8")).get("raw")
    except (OSError, ValueError, AttributeError):
        return
    if not isinstance(recorded, dict) or not isinstance(recorded.get("path"), str):
        return
    path = Path(recorded["path"])
    if given is not None and now is not None and not _same_raw(now, recorded):
        raise ConfigError(
            f"raw_path names {given}, but the split data this pipeline reads was made from "
            f"{recorded['path']}: it does not read the raw data.",
            fix=f"split it first: {_split_command(given)} (or leave raw_path out).",
        )
    if isinstance(recorded.get("shards"), list):
        _check_shards_unchanged(recorded)
        return
    if not path.is_file() or not file_changed(path, recorded):
        return
    raise StaleDataError(
        f"the raw file {recorded['path']} changed since the split made the data this pipeline reads "
        f"({size_change(recorded.get('size'), path.stat().st_size)}): it would use the old texts.",
        fix=f"split it again: {_split_command(recorded['path'])} (or put the file back as it was).",
    )


def _same_raw(now: Path, recorded: dict) -> bool:
    """Whether ``now`` (``--params raw_path``) names the raw data of ``recorded``: the same path, or for
    shards, the same shards named another way (a glob of a folder's shards, a folder's other name)."""
    if now.resolve() == Path(recorded["path"]).resolve():
        return True
    shards = recorded.get("shards")
    if not isinstance(shards, list):
        return False
    files = data_files(now) or ([now] if now.is_file() else [])
    return [project_name(file) for file in files] == [
        project_name(str(shard.get("path"))) for shard in shards
    ]


def _check_shards_unchanged(recorded: dict) -> None:
    """A folder or glob of shards: refused when a shard was added, removed or changed since the split (a new
    time alone is the same shard); not compared when none is left (the raw data gone, as a file gone)."""
    path = recorded["path"]
    if not data_files(path):
        return
    changed = shards_changed(path, recorded["shards"])
    if changed is not None:
        raise StaleDataError(
            f"the raw shards {path} changed since the split made the data this pipeline reads ({changed}): "
            "it would use the old texts.",
            fix=f"split it again: {_split_command(path)} (or put the shards back as they were).",
        )


def _split_command(raw: str) -> str:
    """The split of the raw data ``raw`` a split read: ``raw_path`` named, as a split without it reads the
    catalog's default file."""
    return f"kedro run --pipeline=split --params raw_path={shlex.quote(raw)}"


def _marker_raw(marker: Path) -> dict | None:
    """The raw file record of a finished split's marker (None when unreadable or without one)."""
    try:
        raw = json.loads(marker.read_text(encoding="utf-8")).get("raw")
    except (OSError, ValueError, AttributeError):
        return None
    return raw if isinstance(raw, dict) else None


def _refuse_memory_inputs(pipeline, split, catalog) -> None:
    """Refuse a run that starts at a split node reading what the split holds in memory only (the cleaned
    rows, the length stats): one line naming where a run of its later nodes can start (was: Kedro's
    "Pipeline input(s) ... not found" traceback)."""
    held = sorted(
        name
        for name in pipeline.inputs() & split.all_outputs()
        if local_path(catalog, name) is None and not catalog.exists(name)
    )
    if not held:
        return
    readers = sorted(node.name for node in pipeline.nodes if set(node.inputs) & set(held))
    raise ConfigError(
        f"{', '.join(readers)} read {', '.join(held)}, which the split holds in memory only: a run of the "
        "split's nodes cannot start there.",
        fix="start at a node that reads saved data: kedro run --pipeline=split --from-nodes tokenize_corpus "
        "(or build_tokenizer), or run the whole split.",
    )


def _refuse_outputs_as_shards(raw: Path, catalog, outputs: set[str]) -> None:
    """Refuse a folder or glob of shards (``raw_path``) holding a file or folder of ``outputs`` (the split's
    and the run's), such as ``data/**/*.parquet`` matching the split's own
    ``data/03_primary/corpus_splits.parquet``: the split would read an earlier run's output as raw data
    (beside real shards: a shard said to have other columns)."""
    files = data_files(raw)
    if not files:
        return
    written = {
        path.resolve(): name for name in sorted(outputs) if (path := local_path(catalog, name)) is not None
    }
    for file in files:
        full = file.resolve()
        name = next((written[out] for out in (full, *full.parents) if out in written), None)
        if name is not None:
            raise ConfigError(
                f"raw_path {project_name(raw)} reads {project_name(file)}, the project's {name} output (a "
                "pipeline writes it), not raw data.",
                fix="name the raw shards alone: a folder or glob under data/01_raw (e.g. --params "
                "raw_path='data/01_raw/shards/*.parquet').",
            )


def _whole_split_command(run_params: dict) -> str:
    """The whole split under the run's ``--env`` (another environment's settings split other data)."""
    command = "kedro run --pipeline=split"
    if run_params.get("env"):
        command += f" --env {shlex.quote(str(run_params['env']))}"
    return command


def _unfinished_split(marker: Path, left_out: list[str], run_params: dict) -> str:
    """The warning of a run of the split's first nodes only (``--to-nodes``, ``--nodes``): the split it
    leaves is unfinished, and the whole split finishes it (a run of the nodes left out reads unfinished
    outputs, which is refused)."""
    command = _whole_split_command(run_params)
    same = " with this run's --params" if run_params.get("runtime_params") else ""
    return (
        f"the split is not complete: this run left out {', '.join(left_out)}, so {project_name(marker)} "
        "is not written and train, tune, sweep and the report refuse the split's outputs. "
        f"Fix: run `{command}`{same} to finish it."
    )


class SplitCompleteHook:
    """The split pipeline's outputs are used together or not at all.

    Its nodes write ``corpus_splits``, the tokenizer and the tokenized data one after the other, so a split
    stopped part way (kill -9, a full disk, Ctrl-C) leaves new files beside older ones, which each look whole.
    Just before the first split output is saved, the ``split_complete.json`` marker is removed (a node that
    refuses its input before returning leaves everything as it was); it is written again
    once every split node has run and every split output is saved. A run of the split's later nodes
    (`--from-nodes tokenize_corpus`: a new max_length on the same splits) reads the outputs of a finished
    split: it writes the marker again once every node downstream of the ones it ran has run and saved. A
    pipeline reading split outputs it does not produce itself is refused in one line while the marker is
    missing. Nothing relies on code running at the interruption.

    Under Kedro's ParallelRunner the node and dataset hooks run in its worker processes (spawned: fresh
    hooks; forked: copies of this one), each seeing the nodes it ran: there the process that runs the
    pipeline removes the marker before any node runs (put back when the run fails with no split output
    changed) and writes it when every node has run, and the workers leave it alone.
    """

    def __init__(self) -> None:
        self._marker: Path | None = None
        self._owner: int | None = None  # the PID of before_pipeline_run (a forked worker copy: another)
        self._parallel: dict | None = None  # under ParallelRunner: the marker's text and the outputs' state
        self._paths: dict[str, Path | None] = {}
        self._raw: Path | None = None
        self._kept_raw: dict | None = None  # a run of the later nodes: the finished split's raw record
        self._read_raw: dict | None = None  # the raw file's record before the split read it
        self._group: set[str] = set()
        self._split_nodes: set[str] = set()
        self._done: set[str] = set()
        self._saved: set[str] = set()

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        fingerprint = local_path(catalog, "tokenized_corpus_fingerprint")
        self._marker = fingerprint.parent / SPLIT_COMPLETE if fingerprint is not None else None
        self._owner, self._parallel = os.getpid(), None
        if self._marker is None:
            return
        split = importlib.import_module("fastlm.pipelines.split").create_pipeline()
        self._group = {name for name in split.all_outputs() if local_path(catalog, name) is not None}
        self._split_nodes, self._done, self._saved = {node.name for node in split.nodes}, set(), set()
        _refuse_memory_inputs(pipeline, split, catalog)
        self._raw = local_path(catalog, RAW) if RAW in pipeline.inputs() else None
        self._read_raw = None
        if self._raw is not None:
            _refuse_outputs_as_shards(self._raw, catalog, split.all_outputs() | pipeline.all_outputs())
            self._read_raw = _record_before_read(self._raw)
        read = sorted(name for name in pipeline.inputs() & self._group if catalog.exists(name))
        self._kept_raw = None
        ran = {node.name for node in pipeline.nodes} & self._split_nodes
        if read and ran and self._marker.exists():  # the later nodes of a finished split, run again
            later = split.from_nodes(*ran)
            self._split_nodes = {node.name for node in later.nodes}
            self._group &= later.all_outputs()
            self._kept_raw = _marker_raw(self._marker)
        if read and not self._marker.exists():
            shown = ", ".join(str(local_path(catalog, name)) for name in read)
            raise InputDataError(
                f"{shown} come from a split that did not finish (or from an older fastlm): "
                f"{self._marker} is missing, so newer and older split outputs may be mixed.",
                fix=f"run `{_whole_split_command(run_params)}` to write them all again.",
            )
        if read and RAW not in pipeline.inputs():
            given = (run_params.get("runtime_params") or {}).get("raw_path")
            check_raw_unchanged(self._marker, given, local_path(catalog, RAW))
        self._paths = {name: local_path(catalog, name) for name in self._group}
        if "ParallelRunner" in str(run_params.get("runner")) and self._group & pipeline.all_outputs():
            kept = self._marker.read_text(encoding="utf-8") if self._marker.exists() else None
            self._parallel = {"marker": kept, "outputs": self._outputs_state()}
            self._marker.unlink(missing_ok=True)

    def _outputs_state(self) -> dict:
        """Each split output's file or folder state (a save replaces it: another inode, time or size)."""
        state = {}
        for name, path in self._paths.items():
            try:
                stat = path.stat()
                state[name] = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            except OSError:
                state[name] = None
        return state

    def _here(self) -> bool:
        """Whether the node hooks keep the marker here: not under ParallelRunner, not in a forked worker."""
        return self._marker is not None and self._parallel is None and self._owner == os.getpid()

    @hook_impl
    def after_pipeline_run(self, run_params: dict, pipeline) -> None:
        if self._marker is None or self._owner != os.getpid():
            return
        ran = {node.name for node in pipeline.nodes}
        if self._parallel is not None:
            self._parallel = None
            if ran >= self._split_nodes:
                self._write_marker(sorted(self._group))
        if ran & self._split_nodes and not self._marker.exists():
            split = importlib.import_module("fastlm.pipelines.split").create_pipeline()
            left_out = [node.name for node in split.nodes if node.name in self._split_nodes - ran]
            log.warning(_unfinished_split(self._marker, left_out, run_params))

    @hook_impl
    def on_pipeline_error(self) -> None:
        parallel, self._parallel = self._parallel, None
        if parallel is None or self._owner != os.getpid():
            return
        if parallel["marker"] is not None and self._outputs_state() == parallel["outputs"]:
            self._write_text(parallel["marker"])  # a node refused before any split output was saved

    @hook_impl
    def before_dataset_saved(self, dataset_name: str) -> None:  # not before a node: one that refuses keeps it
        if self._here() and dataset_name in self._group:
            self._marker.unlink(missing_ok=True)

    @hook_impl
    def after_node_run(self, node) -> None:
        self._done.add(node.name)

    @hook_impl
    def after_dataset_saved(self, dataset_name: str) -> None:  # a node's outputs are saved after its hook
        if not self._here() or dataset_name not in self._group:
            return
        self._saved.add(dataset_name)
        if self._done >= self._split_nodes and self._saved >= self._group:
            self._write_marker(sorted(self._saved))

    def _write_marker(self, outputs: list[str]) -> None:
        if self._raw is None:
            raw = self._kept_raw
        else:  # as the split read it: a file changed while the split ran is stale data
            raw = self._read_raw if self._read_raw is not None else raw_record(self._raw)
        self._write_text(json.dumps({"outputs": outputs, "raw": raw}) + "\n")

    def _write_text(self, text: str) -> None:
        # a temporary file of its own per write: two outputs saved at once (--async) may both find the split
        # finished; what a killed write left is removed by the next
        write_file_atomically(self._marker, lambda handle: handle.write(text))
