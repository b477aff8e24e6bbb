"""Project hooks."""

from __future__ import annotations

import importlib
import pkgutil

from kedro.framework.hooks import hook_impl

from fastlm.errors import InputDataError
from fastlm.tracking import MlflowMetrics


class MlflowArtifactsHook:
    """Logs a saved dataset as an MLflow artifact when its catalog entry has ``metadata: {mlflow_artifact: <dir>}``.

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
    Raw inputs (produced by no pipeline) are left to their datasets, which explain themselves.
    """

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        producers = all_pipelines()
        for dataset in sorted(pipeline.inputs()):
            if dataset.startswith("params:") or dataset == "parameters" or dataset not in catalog:
                continue
            producer = next((name for name, p in producers.items() if dataset in p.all_outputs()), None)
            if producer is None or catalog.exists(dataset):
                continue
            path = getattr(catalog[dataset], "_filepath", None) or getattr(catalog[dataset], "_path", None)
            raise InputDataError(
                f"{dataset}{f' ({path})' if path else ''} does not exist yet.",
                fix=f"run `kedro run --pipeline={producer}` first.",
            )
