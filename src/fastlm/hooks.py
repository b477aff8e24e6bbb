"""Project hooks."""

from __future__ import annotations

from kedro.framework.hooks import hook_impl

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
