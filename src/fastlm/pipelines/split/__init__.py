"""raw text -> clean, deduplicated, stable splits -> tokenized Arrow data."""

from fastlm.pipelines.split.pipeline import create_pipeline

__all__ = ["create_pipeline"]
