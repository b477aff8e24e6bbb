"""Project hooks."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import os
import pkgutil
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

from kedro.framework.hooks import hook_impl
from kedro_mlflow.framework.hooks.mlflow_hook import MAX_PARAM_VAL_LENGTH, MlflowHook

from fastlm.corpus.fingerprint import data_identity
from fastlm.datasets.integrity import damaged_input_error, find_damaged
from fastlm.engine.checkpoint.storage import check_writable
from fastlm.engine.paths import project_name
from fastlm.errors import ConfigError, InputDataError, StaleDataError
from fastlm.parameters import GROUPS, check_top_level_params, known_top_level_params, runtime_only_params
from fastlm.redaction import redact
from fastlm.tracking import (
    MlflowMetrics,
    RunTracker,
    SafeMlflow,
    active_run_id,
    begin_session_tracking,
    bound_tracking_requests,
    end_session_tracking,
    local_store_uri,
    param_text,
    register_project_artifacts,
    session_tracking_set,
)

log = logging.getLogger(__name__)


class MlflowArtifactsHook:
    """Logs a saved dataset as an MLflow artifact when its catalog entry has
    ``metadata: {mlflow_artifact: <dir>}``.

    Unlike a dataset wrapper, a failing tracking store only warns (once) and the local output stays written.
    """

    def __init__(self) -> None:
        self._catalog = None
        self._mlflow = MlflowMetrics()

    @hook_impl
    def after_catalog_created(self, catalog) -> None:
        self._catalog = catalog

    @hook_impl
    def after_dataset_saved(self, dataset_name: str) -> None:
        if self._catalog is None or dataset_name not in self._catalog:
            return
        dataset = self._catalog[dataset_name]
        metadata = getattr(dataset, "metadata", None) or {}
        path = getattr(dataset, "_filepath", None)
        if "mlflow_artifact" in metadata and path is not None:
            self._mlflow.log_artifacts(str(path), metadata["mlflow_artifact"] or None)


def all_pipelines() -> dict:
    """Every pipeline of the project (Kedro 1.7 builds only the requested ones during a run)."""
    import fastlm.pipelines

    return {
        info.name: importlib.import_module(f"fastlm.pipelines.{info.name}").create_pipeline()
        for info in pkgutil.iter_modules(fastlm.pipelines.__path__)
        if info.ispkg
    }


class MissingInputsHook:
    """Before a run starts, refuse inputs that another pipeline produces but that do not exist yet.

    One line names the dataset, its path and the pipeline to run first; nothing has run, nothing is written.
    An input that exists is checked to be whole (``fastlm.datasets.integrity``): a cut-off file is one line
    too; so is one that is whole but not what it should be, for a dataset with a ``check_saved`` method (e.g.
    ``TrainSummaryDataset``: a ``train_summary.json`` of ``{}``).
    Raw inputs (produced by no pipeline) are checked by their datasets, which explain themselves
    (``check_input``: a missing file, an unknown extension), so that a refused run opens no MLflow run.
    """

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        # every pipeline, imported only when an input is missing or damaged (torch etc. cost seconds)
        producers = None
        for dataset in sorted(pipeline.inputs()):
            if dataset.startswith("params:") or dataset == "parameters" or dataset not in catalog:
                continue
            if getattr(catalog[dataset], "raw_input", False):
                check_input = getattr(catalog[dataset], "check_input", None)
                if check_input is not None:
                    check_input()
                continue
            path = getattr(catalog[dataset], "_filepath", None) or getattr(catalog[dataset], "_path", None)
            exists = catalog.exists(dataset)
            damaged = find_damaged(str(path)) if exists and path is not None else None
            if exists and damaged is None:
                check_saved = getattr(catalog[dataset], "check_saved", None)  # whole, but what it should be?
                if check_saved is not None:
                    check_saved()
                continue
            producers = all_pipelines() if producers is None else producers
            producer = next((name for name, p in producers.items() if dataset in p.all_outputs()), None)
            if producer is None:
                continue
            if damaged is not None:  # a cut-off file is one line before any node writes
                raise damaged_input_error(*damaged, producer=producer)
            raise InputDataError(
                f"{dataset}{f' ({path})' if path else ''} does not exist yet.",
                fix=f"run `kedro run --pipeline={producer}` first.",
            )


SPLIT_COMPLETE = "split_complete.json"  # beside tokenized_corpus_fingerprint: the last split finished
RAW = "raw_corpus"  # the catalog entry of the raw file (raw_path)


def raw_record(raw: Path | None) -> dict | None:
    """The raw file a split read: its path (relative to the project folder when inside it), size, time and
    SHA-256; None for none or no local file."""
    if raw is None or not raw.is_file():
        return None
    stat = raw.stat()
    return {
        "path": project_name(raw),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sha256": _file_sha256(raw),
    }


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
    if given is not None and now is not None and now.resolve() != path.resolve():
        raise ConfigError(
            f"raw_path names {given}, but the split data this pipeline reads was made from "
            f"{recorded['path']}: it does not read the raw file.",
            fix=f"split it first: kedro run --pipeline=split --params raw_path={given} (or leave raw_path "
            "out).",
        )
    if not path.is_file():
        return
    stat = path.stat()
    if (stat.st_size, stat.st_mtime_ns) == (recorded.get("size"), recorded.get("mtime_ns")):
        return
    if stat.st_size == recorded.get("size") and _file_sha256(path) == recorded.get("sha256"):
        return
    raise StaleDataError(
        f"the raw file {recorded['path']} changed since the split made the data this pipeline reads "
        f"({recorded.get('size')} -> {stat.st_size} bytes): it would use the old texts.",
        fix="split it again: kedro run --pipeline=split (or put the file back as it was).",
    )


def _marker_raw(marker: Path) -> dict | None:
    """The raw file record of a finished split's marker (None when unreadable or without one)."""
    try:
        raw = json.loads(marker.read_text(encoding="utf-8")).get("raw")
    except (OSError, ValueError, AttributeError):
        return None
    return raw if isinstance(raw, dict) else None


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
    """

    def __init__(self) -> None:
        self._marker: Path | None = None
        self._raw: Path | None = None
        self._kept_raw: dict | None = None  # a run of the later nodes: the finished split's raw record
        self._group: set[str] = set()
        self._split_nodes: set[str] = set()
        self._done: set[str] = set()
        self._saved: set[str] = set()

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        fingerprint = _local_path(catalog, "tokenized_corpus_fingerprint")
        self._marker = fingerprint.parent / SPLIT_COMPLETE if fingerprint is not None else None
        if self._marker is None:
            return
        split = importlib.import_module("fastlm.pipelines.split").create_pipeline()
        self._group = {name for name in split.all_outputs() if _local_path(catalog, name) is not None}
        self._split_nodes, self._done, self._saved = {node.name for node in split.nodes}, set(), set()
        self._raw = _local_path(catalog, RAW) if RAW in pipeline.inputs() else None
        read = sorted(name for name in pipeline.inputs() & self._group if catalog.exists(name))
        self._kept_raw = None
        ran = {node.name for node in pipeline.nodes} & self._split_nodes
        if read and ran and self._marker.exists():  # the later nodes of a finished split, run again
            later = split.from_nodes(*ran)
            self._split_nodes = {node.name for node in later.nodes}
            self._group &= later.all_outputs()
            self._kept_raw = _marker_raw(self._marker)
        if read and not self._marker.exists():
            shown = ", ".join(str(_local_path(catalog, name)) for name in read)
            raise InputDataError(
                f"{shown} come from a split that did not finish (or from an older fastlm): "
                f"{self._marker} is missing, so newer and older split outputs may be mixed.",
                fix="run `kedro run --pipeline=split` to write them all again.",
            )
        if read and RAW not in pipeline.inputs():
            given = (run_params.get("runtime_params") or {}).get("raw_path")
            check_raw_unchanged(self._marker, given, _local_path(catalog, RAW))

    @hook_impl
    def before_dataset_saved(self, dataset_name: str) -> None:  # not before a node: one that refuses keeps it
        if self._marker is not None and dataset_name in self._group:
            self._marker.unlink(missing_ok=True)

    @hook_impl
    def after_node_run(self, node) -> None:
        self._done.add(node.name)

    @hook_impl
    def after_dataset_saved(self, dataset_name: str) -> None:  # a node's outputs are saved after its hook
        if self._marker is None or dataset_name not in self._group:
            return
        self._saved.add(dataset_name)
        if self._done >= self._split_nodes and self._saved >= self._group:
            partial = self._marker.with_name(f".{self._marker.name}.tmp")
            raw = raw_record(self._raw) if self._raw is not None else self._kept_raw
            record = {"outputs": sorted(self._saved), "raw": raw}
            partial.write_text(json.dumps(record) + "\n", encoding="utf-8")
            os.replace(partial, self._marker)


class ModelOfTheseSplitsHook:
    """A pipeline that evaluates the trained model on the tokenized splits without training it (the report)
    is refused before any node runs when the model was trained on other splits than those now on disk: the
    model folder's ``training_data.json`` records the identity of its training data
    (``corpus.fingerprint.data_identity``: the tokenizer, the parameters and the split texts), and a
    re-split since (another ``hash_salt``, ratios, folds, texts) changes it. Its test split may then hold rows
    the model trained on, and a test score, logged onto the training run, would look held out. A model
    folder without the record (written before it existed) is not checked."""

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        if (
            "trained_model" not in pipeline.inputs()
            or "tokenized_corpus_fingerprint" not in pipeline.inputs()
        ):
            return
        model, fingerprint = (
            _local_path(catalog, "trained_model"),
            _local_path(catalog, "tokenized_corpus_fingerprint"),
        )
        if model is None or fingerprint is None or not fingerprint.is_file():
            return
        from fastlm.datasets.pretrained_model import TRAINING_DATA

        try:
            trained_on = json.loads((model / TRAINING_DATA).read_text(encoding="utf-8"))["fingerprint"]
            split = json.loads(fingerprint.read_text(encoding="utf-8"))
            now = data_identity(split)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return  # no record, or a file the nodes explain when they read it
        # a model folder written before the texts' digest was part of its data identity records the
        # fingerprint alone (never equal to an identity that holds a digest)
        if trained_on not in (now, split.get("fingerprint")):
            data = _local_path(catalog, "tokenized_corpus") or fingerprint.parent
            raise StaleDataError(
                f"the model in {model} was trained on other data than {data} holds now (data fingerprint "
                f"{str(trained_on)[:12]}, now {str(now)[:12]}: split again since): its test split may hold "
                "rows the model trained on.",
                fix="train it again on these splits (`kedro run --pipeline=train`), or split again with the "
                "settings it was trained on.",
            )


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
        launch = (
            os.environ.get("TORCHELASTIC_RUN_ID") if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 else None
        )
        name = resolve_run_name(
            given,
            run_params.get("pipeline_names"),
            Path(str(train.get("checkpoint_dir", TrainParams().checkpoint_dir))),
            resume=str(train.get("resume", "auto")),
            trains=trains,
            launch_id=launch if launch not in (None, "", "none") else None,
        )
        _put(catalog, RUN_NAME, name)
        log.info("Run name: %s", name)


class RunOutputsHook:
    """Keep a copy of each output whose catalog entry has ``metadata: {keep_per_run: <folder>}`` in
    ``<folder>/<run name>/`` (a model folder as hard links where the disk allows, so no second copy of the
    weights), so an earlier run's model and report survive the next run for comparison.

    The run name is the TRAINING run's: this run's own name when it trains, else the name in the
    ``train_summary`` that a report run reads (its own name when that summary has none).
    """

    def __init__(self) -> None:
        self._catalog = None
        self._trained: str | None = None

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        self._catalog = catalog
        self._trained = catalog.load(RUN_NAME) if "train_summary" in pipeline.all_outputs() else None

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data, node) -> None:
        catalog = self._catalog
        if catalog is None or dataset_name not in catalog:
            return
        folder = (getattr(catalog[dataset_name], "metadata", None) or {}).get("keep_per_run")
        path = _local_path(catalog, dataset_name)
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
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
        except OSError as error:
            log.warning(
                "could not keep a copy of %s in %s (%s); the output itself is written", path, target, error
            )

    def _owner(self) -> str:
        if self._trained is None:
            try:
                summary = self._catalog.load("train_summary") if "train_summary" in self._catalog else None
            except Exception:  # noqa: BLE001 - no summary yet: this run's own name
                summary = None
            name = summary.get("run_name") if isinstance(summary, dict) else None
            self._trained = name or self._catalog.load(RUN_NAME)
        return self._trained


def _link_or_copy(source: str, target: str) -> None:
    """A hard link (no extra disk; the saved files are replaced, never rewritten in place), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


_GATHERING = threading.local()  # RedactingMlflowHook: the parameters of the node whose hooks this thread runs


def pin_local_store(config_loader) -> None:
    """The session's mlflow.yml with a local SQLite store named relative to the working folder (the default
    ``sqlite:///mlflow.db``) as its absolute path (``fastlm.tracking.local_store_uri``), so that each project
    run in one process tracks into its own store."""
    config_loader.config_patterns.setdefault("mlflow", ["mlflow*", "mlflow*/**", "**/mlflow*"])
    conf = config_loader["mlflow"]
    server = conf.get("server") or {}
    uri = server.get("mlflow_tracking_uri")
    if local_store_uri(uri) != uri:
        config_loader["mlflow"] = {**conf, "server": {**server, "mlflow_tracking_uri": local_store_uri(uri)}}


class RedactingMlflowHook(MlflowHook):
    """kedro-mlflow's hook, fed copies of the parameters and run parameters with every secret masked.

    kedro-mlflow logs each node's ``params:*`` inputs verbatim as MLflow parameters and the run parameters
    (``--params`` included) as tags. This subclass replaces the plugin's own hook (``settings.py`` disables
    the plugin's registration), so what reaches MLflow is :func:`fastlm.redaction.redact`'s copy; the nodes
    still receive the real values.

    It also fails open: MLflow's requests get bounded retries and timeout, and the first failing tracking call
    (server down, a corrupt ``mlflow.db``) warns once and turns tracking off for the run; training and every
    local output continue.
    """

    @hook_impl
    def after_catalog_created(self, catalog, **kwargs) -> None:
        """Nothing: the plugin's version builds every catalog entry (seconds of imports at each start-up) to
        rename kedro-mlflow metric datasets, which this project does not use (MlflowArtifactsHook logs)."""

    @hook_impl
    def after_context_created(self, context) -> None:
        bound_tracking_requests()
        register_project_artifacts()  # the experiment's artefacts live next to the project's store
        begin_session_tracking()  # put back at the run's end: a later session in this process starts clean
        with contextlib.suppress(Exception):  # a missing or broken mlflow.yml: the plugin's own handling
            pin_local_store(context.config_loader)
        self._tracking = SafeMlflow()  # one per run: this hook object outlives a session in-process
        self._tracking.call(
            "tracking setup",
            lambda _: super(RedactingMlflowHook, self).after_context_created(context),
            needs_active_run=False,
        )
        session_tracking_set()

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        if RUN_NAME in catalog and getattr(self, "mlflow_config", None) is not None:
            self.mlflow_config.tracking.run.name = catalog.load(RUN_NAME)  # resolved by RunNameHook
        run_params = redact(run_params)
        self._guarded("run start", super().before_pipeline_run, run_params, pipeline, catalog)
        # Tags as values: the runner's class name, not its repr; lists and --params as JSON.
        tags = {key: text for key, value in run_params.items() if value and (text := param_text(value))}
        tracking = getattr(self, "_tracking", None)
        if tracking is not None:  # skipped once tracking has failed
            tracking.call("tagging", lambda mlflow: mlflow.set_tags(tags))

    @hook_impl
    def before_node_run(self, node, catalog, inputs: dict, is_async: bool) -> None:
        logged = {
            name: redact(value, name.removeprefix("params:"))
            if name.startswith("params:") or name == "parameters"
            else value
            for name, value in inputs.items()
        }
        run_id = self.run_id
        if run_id is not None and active_run_id() == run_id:
            # kedro-mlflow re-opens its run at every node (for threaded runners); MLflow 3 then stacks the
            # same run once per node, and closing it takes as many end_run calls: the last one, at exit, set
            # FINISHED on failed runs. Only a thread without the run re-opens it.
            self.run_id = None
        try:
            with self._gathering() as batch:  # the plugin's one log_param per key: a write or request each
                self._guarded("parameter logging", super().before_node_run, node, catalog, logged, is_async)
            if (tracking := getattr(self, "_tracking", None)) is not None:
                tracking.call("parameter logging", self._log_batch, active_run_id(), batch)
        finally:
            self.run_id = run_id

    @hook_impl
    def after_pipeline_run(self, run_params, pipeline, catalog) -> None:
        try:
            self._guarded("run end", super().after_pipeline_run, run_params, pipeline, catalog)
        finally:
            end_session_tracking()

    @hook_impl
    def on_pipeline_error(self, error, run_params, pipeline, catalog) -> None:
        try:
            self._guarded("run end", super().on_pipeline_error, error, run_params, pipeline, catalog)
        finally:
            end_session_tracking()

    def _guarded(self, what: str, method, *args) -> None:
        tracking = getattr(self, "_tracking", None)
        if tracking is None or tracking.failed:
            return
        tracking.call(what, lambda _: method(*args), needs_active_run=False)

    def _log_param(self, name: str, value) -> None:
        """Typed values: an unset parameter is not logged (no 'None' string); lists and mappings as JSON.
        In a node's parameter logging they are gathered for one batch (``_log_batch``); one longer than MLflow
        takes goes to the plugin's ``long_params_strategy`` (truncate, tag or fail) at once."""
        text = param_text(value)
        if text is None:
            return
        batch = getattr(_GATHERING, "params", None)
        if batch is None or len(text) > MAX_PARAM_VAL_LENGTH:
            super()._log_param(name, text)
        else:
            batch[name] = text

    @staticmethod
    @contextlib.contextmanager
    def _gathering() -> Iterator[dict[str, str]]:
        """``_log_param`` gathers into the dict yielded, in this thread only (a threaded runner runs several
        nodes' hooks at once)."""
        _GATHERING.params = batch = {}
        try:
            yield batch
        finally:
            _GATHERING.params = None

    def _log_batch(self, mlflow, run_id: str, batch: dict[str, str]) -> None:
        """A node's parameters in one write to the active run ``run_id``, less those already logged to it with
        the same value (the nodes of a pipeline share ``params:split``, ``params:train``); MLflow refuses a
        changed value as it did one key at a time."""
        if getattr(self, "_sent_to", None) != run_id:  # another run: nothing of it logged yet
            self._sent_to, self._sent = run_id, {}
        new = {name: text for name, text in batch.items() if self._sent.get(name) != text}
        if new:
            mlflow.log_params(new)
            self._sent.update(new)


class OutputFoldersWritableHook:
    """Before a run starts, refuse an output folder that cannot be written: one line, nothing has run.

    A read-only ``data/`` folder would otherwise fail after the slow steps (tokenization, training).
    Each distinct parent folder of the pipeline's file outputs gets one probe file, written and removed.
    """

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        checked: set[Path] = set()
        for name in sorted(pipeline.all_outputs()):
            path = _local_path(catalog, name)
            if path is None or path.parent in checked:
                continue
            checked.add(path.parent)
            check_writable(path.parent, parameter=f"{name} (conf/base/catalog.yml)")


def _local_path(catalog, name: str) -> Path | None:
    """The local file or folder a catalog entry writes, or None (memory datasets, remote storage)."""
    try:
        dataset = catalog[name] if name in catalog else None
    except Exception:  # noqa: BLE001 - an entry that cannot be built explains itself when it is used
        return None
    path = getattr(dataset, "_filepath", None) or getattr(dataset, "_path", None)
    if path is None or getattr(dataset, "_protocol", "file") not in ("file", "", None):
        return None
    return Path(str(path))


class ProjectFolderHook:
    """A session opened in a subfolder of the project (a notebook in ``notebooks/``, a script) works in the
    project folder, as ``kedro run`` does (:func:`fastlm.cli.in_project_folder`); one opened outside the
    project keeps its folder. Kedro makes the catalog's paths the project's, but ``train.checkpoint_dir``,
    the MLflow store (``sqlite:///mlflow.db``) and the other paths in parameters are read from the working
    folder. Moved before any other hook reads one (the MLflow hook sets its store when the context is made);
    said once."""

    @hook_impl(tryfirst=True)
    def after_context_created(self, context) -> None:
        project, here = Path(context.project_path).resolve(), Path.cwd().resolve()
        if project == here or not here.is_relative_to(project):  # a script elsewhere keeps its own folder
            return
        log.info(
            "fastlm: working in the project folder %s (opened in %s): the paths in conf/ and parameters are "
            "the project's",
            project,
            here.relative_to(project).as_posix(),
        )
        os.chdir(project)


class UnknownRuntimeParamsHook:
    """Refuse a top-level ``--params`` key that no parameters file defines and no conf file reads
    (``raw_pth=...``, ``trian.max_steps=5``): one ConfigError line with a suggestion, before any node runs.

    Keys inside a parameter group (``train.max_stesp``) are refused by the group's validation the same way; a
    misspelled top-level key would otherwise be dropped and the run go on with the defaults (the demo corpus
    re-split over the outputs). What is known: :func:`fastlm.parameters.known_top_level_params` of the run's
    conf folder (``--conf-source`` included; a packed conf archive is not read, so nothing is refused there).
    """

    def __init__(self) -> None:
        self._conf: Path | None = None

    @hook_impl
    def after_context_created(self, context) -> None:
        source = getattr(getattr(context, "config_loader", None), "conf_source", None)
        self._conf = Path(str(source)) if source else None
        try:
            self._params = dict(context.params)
        except Exception:  # noqa: BLE001 - a broken parameters file is Kedro's to report, when it is read
            self._params = {}

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        given = run_params.get("runtime_params") or {}
        conf = self._conf or Path(run_params.get("project_path") or ".") / "conf"
        if not conf.is_dir():
            return
        if given:
            check_top_level_params(given, known_top_level_params(conf))
        # a name the catalog reads from --params alone (raw_path), set in a parameters file: dropped silently
        for name, files in runtime_only_params(conf).items():
            value = getattr(self, "_params", {}).get(name)
            if name not in given and value is not None:
                raise ConfigError(
                    f"{name} = {value!r} is set in {', '.join(files)}, but the catalog reads {name} from "
                    "--params only: the run would read its default instead.",
                    fix=f"pass --params {name}={value} (and remove it from {files[0]}).",
                )


class ParametersValidHook:
    """Before a run starts, validate every parameter group its nodes read (``fastlm.parameters.GROUPS``): a
    bad value is one line, before any node has written anything (a node that validates on entry may run after
    others saved their outputs). Across groups: a pipeline generating from ``report.prompts`` (it writes
    ``sample_generations``) on pre-tokenized data needs them to be ids of its vocabulary
    (``reporting.params.check_id_prompts``); the report's ``top_k`` must be below the trained model's
    vocabulary (``reporting.params.check_top_k``; the evaluation checks it again on the model it loads)."""

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        parsed = {}
        for dataset in sorted(pipeline.inputs()):
            group = dataset.removeprefix("params:")
            if dataset.startswith("params:") and group in GROUPS:
                parsed[group] = GROUPS[group].parse(catalog.load(dataset))
        report, split = parsed.get("report"), parsed.get("split")
        generates = "sample_generations" in pipeline.all_outputs()
        if generates and report is not None and split is not None and split.pretokenized:
            from fastlm.reporting.params import check_id_prompts

            check_id_prompts(report.prompts, split.vocab_size)
        vocab_size = _model_vocab_size(catalog) if "trained_model" in pipeline.inputs() else None
        if report is not None and vocab_size is not None:
            from fastlm.reporting.params import check_top_k

            check_top_k(report.top_k, vocab_size)


def _model_vocab_size(catalog) -> int | None:
    """The vocabulary of the model folder's config.json (a language model's, or its text model's); None where
    the folder has none (an adapter folder, not trained yet: the nodes say so)."""
    folder = _local_path(catalog, "trained_model")
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return size if isinstance(size, int) and size > 0 else None


DATASET_PATHS = "dataset_paths"


class DatasetPathsHook:
    """Put the local path of each file dataset the run reads or writes into the catalog entry
    ``dataset_paths`` (``{name: path}``), for the nodes that name a file in a message or hand a folder to the
    engine: nodes hold no path of their own, so a catalog change cannot leave one behind."""

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        if DATASET_PATHS not in pipeline.inputs():
            return
        names = sorted(pipeline.all_inputs() | pipeline.all_outputs())
        paths = {
            name: str(path)
            for name in names
            if name != DATASET_PATHS and (path := _local_path(catalog, name)) is not None
        }
        _put(catalog, DATASET_PATHS, paths)


def _put(catalog, name: str, value) -> None:
    """``value`` as the data of the memory dataset ``name`` (declared in catalog.yml, else made here)."""
    if name in catalog:
        catalog[name].save(value)
    else:
        catalog[name] = value


RUN_TRACKER = "run_tracker"


class RunTrackerHook:
    """Hand the nodes that track (train, tune, report) one ``fastlm.tracking.RunTracker`` per run as the
    catalog entry ``run_tracker``: they pass its callbacks to the engine and report their results to it, and
    the tracker logs to the MLflow run the MLflow hook opened. Nodes make no MLflow call themselves."""

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        if RUN_TRACKER in pipeline.inputs():
            _put(catalog, RUN_TRACKER, RunTracker())


class TunedParametersHook:
    """Say, before a training run, that ``tuned_parameters`` (written by the tune pipeline into conf/local)
    is in effect, with the micro-batch settings it gives; and after a tune run under an environment that does
    not read conf/local, that a train run under it will not use them."""

    @hook_impl
    def after_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        if "tuned_parameters" not in pipeline.all_outputs():
            return
        path, env = _local_path(catalog, "tuned_parameters"), run_params.get("env") or "local"
        if path is not None and path.parent.name == "local" and env != "local":
            log.warning(
                "%s is not read under --env %s (conf/base and conf/%s are): `kedro run --pipeline=train` "
                "without --env uses its settings, a train run under --env %s does not",
                path,
                env,
                env,
                env,
            )

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        if "trained_model" not in pipeline.all_outputs() or "tuned_parameters" not in catalog:
            return
        path = _local_path(catalog, "tuned_parameters")
        if path is None or not catalog.exists("tuned_parameters"):
            return
        env = run_params.get("env") or "local"
        if path.parent.name == "local" and env != "local":  # Kedro reads conf/base and conf/<env> alone
            log.info(
                "%s is not read under --env %s (conf/base and conf/%s are): its tuned settings are not used",
                path,
                env,
                env,
            )
            return
        batching = GROUPS["train"].parse(catalog.load("params:train")).batching
        tuned = ((catalog.load("tuned_parameters") or {}).get("train") or {}).get("batching") or {}
        keys = ("micro_batch_size", "gradient_accumulation_steps")
        given = ", ".join(f"{key}={tuned[key]}" for key in keys if key in tuned)
        overridden = ", ".join(
            f"{key}={getattr(batching, key)}"
            for key in keys
            if key in tuned and tuned[key] != getattr(batching, key)
        )
        log.info(
            "%s is in effect (from `kedro run --pipeline=tune`): %s%s; delete it to go back to conf/base",
            path,
            given or "no batching settings",
            f" (--params or a later file overrides it: {overridden})" if overridden else "",
        )
