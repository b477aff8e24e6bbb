"""tokenized splits -> a trained causal LM (save_pretrained folder), metric histories, run summary."""

from fastlm.pipelines.train.pipeline import create_pipeline

__all__ = ["create_pipeline"]
