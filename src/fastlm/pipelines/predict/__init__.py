"""a file of inputs + a trained model -> predictions in input order and a summary (`--pipeline=predict`)."""

from fastlm.pipelines.predict.pipeline import create_pipeline

__all__ = ["create_pipeline"]
