"""tokenized splits -> measured micro-batch ladder -> chosen micro-batch and accumulation for train."""

from fastlm.pipelines.tune.pipeline import create_pipeline

__all__ = ["create_pipeline"]
