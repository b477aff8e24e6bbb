"""The train pipeline (filled by its own issue)."""

from fastlm.pipelines.train.pipeline import create_pipeline

__all__ = ["create_pipeline"]
