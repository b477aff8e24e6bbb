"""training outputs -> summaries, test evaluation, plots, run comparison, diagnosis, one HTML report."""

from fastlm.pipelines.report.pipeline import create_pipeline

__all__ = ["create_pipeline"]
