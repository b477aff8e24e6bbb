"""The catalog entries the hooks fill for the nodes before any node runs (``dataset_paths``,
``run_tracker``), and the local file or folder of a catalog entry, which the other hooks read."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from kedro.framework.hooks import hook_impl

from fastlm.errors import ConfigError
from fastlm.tracking import RunTracker


def local_path(catalog, name: str) -> Path | None:
    """The local file or folder a catalog entry writes, or None (memory datasets, remote storage)."""
    try:
        dataset = catalog[name] if name in catalog else None
    except Exception:  # noqa: BLE001 - an entry that cannot be built explains itself when it is used
        return None
    path = getattr(dataset, "_filepath", None) or getattr(dataset, "_path", None)
    if path is None or getattr(dataset, "_protocol", "file") not in ("file", "", None):
        return None
    return Path(str(path))


def local_state(path: Path | None) -> tuple | None:
    """A local output's file or folder state (a save replaces it: another inode, time or size), or None."""
    try:
        stat = path.stat() if path is not None else None
    except OSError:
        return None
    return (stat.st_ino, stat.st_mtime_ns, stat.st_size) if stat is not None else None


class ParallelRunOutputs:
    """Under Kedro's ParallelRunner the dataset hooks run in its workers (spawned: fresh hooks without the
    catalog), so a hook acting on saved outputs acts in the process that runs the pipeline, when the run
    ends: on every output, or (a node failed) on those saved since the start. Made by ``at_start`` in
    ``before_pipeline_run``; a forked worker's copy hands out none."""

    def __init__(self, catalog, outputs) -> None:
        self._catalog, self._pid = catalog, os.getpid()
        self._states = {name: local_state(local_path(catalog, name)) for name in sorted(outputs)}

    @classmethod
    def at_start(cls, run_params: dict, pipeline, catalog) -> ParallelRunOutputs | None:
        """Each output's state now where the run is under the ParallelRunner, else None."""
        if "ParallelRunner" not in str(run_params.get("runner")):
            return None
        return cls(catalog, pipeline.all_outputs())

    def at_end(self, *, changed_only: bool) -> list[str]:
        """The outputs to act on: all, or ``changed_only`` those saved since the start; none in another
        process than the one that made this."""
        if self._pid != os.getpid():
            return []
        return [
            name
            for name, state in self._states.items()
            if not changed_only or local_state(local_path(self._catalog, name)) != state
        ]


def put(catalog, name: str, value) -> None:
    """``value`` as the data of the memory dataset ``name`` (declared in catalog.yml, else made here)."""
    if name in catalog:
        catalog[name].save(value)
    else:
        catalog[name] = value


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
            if name != DATASET_PATHS and (path := local_path(catalog, name)) is not None
        }
        put(catalog, DATASET_PATHS, paths)


RUN_TRACKER = "run_tracker"


class RunTrackerHook:
    """Hand the nodes that track (train, tune, report) one ``fastlm.tracking.RunTracker`` per run as the
    catalog entry ``run_tracker``: they pass its callbacks to the engine and report their results to it, and
    the tracker logs to the MLflow run the MLflow hook opened. Nodes make no MLflow call themselves."""

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        if RUN_TRACKER in pipeline.inputs():
            put(catalog, RUN_TRACKER, RunTracker())


def versioned_datasets(conf_catalog: dict) -> list[str]:
    """The catalog entries (``conf_catalog``: catalog.yml's, merged) with ``versioned: true``."""
    return sorted(
        str(name)
        for name, entry in conf_catalog.items()
        if not str(name).startswith("_") and isinstance(entry, dict) and entry.get("versioned")
    )


def load_versions_error(load_versions: dict, conf_catalog: dict, resolve=None) -> ConfigError | None:
    """``--load-versions`` naming a dataset the catalog does not hold, or one that is not versioned (Kedro
    ignores its version: the run would read the latest data, not the one asked), as one line with the
    datasets that are versioned; None when every name is a versioned dataset. ``resolve``: a name's entry
    from the catalog's dataset patterns (``{name: ...}`` factories), None for none."""
    versioned = versioned_datasets(conf_catalog)
    known = sorted(str(name) for name in conf_catalog if not str(name).startswith("_"))
    use = (
        f"give --load-versions one of the versioned datasets: {', '.join(versioned)}"
        if versioned
        else (
            "drop --load-versions: no dataset of this catalog is versioned (each keeps one copy, its latest)"
        )
    )
    for name in load_versions:
        entry = conf_catalog.get(name)
        if entry is None and resolve is not None:
            entry = resolve(name) or None
        if entry is None:
            close = difflib.get_close_matches(str(name), known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            return ConfigError(
                f"--load-versions {name}: no dataset of that name in the catalog{hint}.", fix=f"{use}."
            )
        if not (isinstance(entry, dict) and entry.get("versioned")):
            return ConfigError(
                f"--load-versions {name}: {name} is not versioned (no versioned: true in its catalog entry), "
                "so the run would read its latest data, not the version asked.",
                fix=f"{use}.",
            )
    return None


class LoadVersionsHook:
    """Refuse ``--load-versions`` of a dataset that is not versioned before anything runs: Kedro ignores the
    version of such a dataset, so the run read its latest data, not the version asked, without a word. (An
    unknown name is Kedro's DatasetNotFoundError, said in one line by ``fastlm.cli.selection_error``.)"""

    @hook_impl
    def after_catalog_created(self, catalog, conf_catalog: dict, load_versions: dict) -> None:
        if not load_versions:
            return
        resolver = getattr(catalog, "config_resolver", None)
        resolve = getattr(resolver, "resolve_pattern", None) if resolver is not None else None
        error = load_versions_error(load_versions, conf_catalog or {}, resolve)
        if error is not None:
            raise error


class OnlyMissingOutputsHook:
    """``--only-missing-outputs`` (``only_missing_outputs=True`` of a session's run): the hooks see the
    nodes that will run. Kedro hands the hooks the whole selected pipeline and drops the nodes whose
    outputs exist in its runner only, so every check made on the run's nodes looked at nodes that did not
    run: a split run of its later nodes removed the finished split's marker and never wrote it again ("this
    run left out , ..."), and split then train trained on the outputs of a split that did not finish.
    Called before every other hook's ``before_pipeline_run``, this narrows the pipeline (the object the
    runner then runs, where Kedro's filter finds the same nodes again) to those Kedro's runner keeps, by
    Kedro's own filter."""

    @hook_impl(tryfirst=True)
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        if not run_params.get("only_missing_outputs"):
            return
        from kedro.runner import SequentialRunner

        try:
            kept = SequentialRunner()._filter_pipeline_for_missing_outputs(pipeline, catalog)
        except AttributeError as exc:  # a Kedro without it: the run's checks would miss the nodes it skips
            raise ConfigError(
                "--only-missing-outputs: this Kedro's runner has no filter fastlm can check the run against.",
                fix="select the nodes to run with --nodes (or --from-nodes), or drop --only-missing-outputs.",
            ) from exc
        if {node.name for node in kept.nodes} != {node.name for node in pipeline.nodes}:
            # the same object, the runner's, made the kept pipeline (its cached properties included)
            vars(pipeline).clear()
            vars(pipeline).update(vars(kept))
