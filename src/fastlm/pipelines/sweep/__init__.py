"""sweep file -> one named training run per parameter set (MLflow child runs) -> comparison, loss plot,
verdict."""

from fastlm.pipelines.sweep.pipeline import create_pipeline

__all__ = ["create_pipeline"]
