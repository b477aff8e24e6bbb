"""The report pipeline (filled by its own issue)."""

from fastlm.pipelines.report.pipeline import create_pipeline

__all__ = ["create_pipeline"]
