"""Wiring of the predict pipeline (run on its own, not part of ``__default__``)."""

from kedro.pipeline import Node, Pipeline

from fastlm.pipelines.predict import nodes


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                nodes.predict_file,
                ["predict_sources", "params:predict", "params:train"],
                ["predictions", "predict_summary"],
                name="predict_file",
            ),
        ],
        tags={"predict"},
    )
