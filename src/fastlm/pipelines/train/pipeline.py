"""Wiring of the train pipeline: empty until its nodes land."""

from kedro.pipeline import Pipeline


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline([])
