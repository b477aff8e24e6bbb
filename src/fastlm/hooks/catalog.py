"""The catalog entries the hooks fill for the nodes before any node runs (``dataset_paths``,
``run_tracker``), and the local file or folder of a catalog entry, which the other hooks read."""

from __future__ import annotations

from pathlib import Path

from kedro.framework.hooks import hook_impl

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
