"""Wiring of the tune pipeline."""

from kedro.pipeline import Node, Pipeline

from fastlm.pipelines.tune import nodes


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                nodes.tune_micro_batch,
                [
                    "tokenized_corpus",
                    "tokenized_corpus_fingerprint",
                    "tokenizer",
                    "params:train",
                    "params:split",
                    "params:tune",
                    "dataset_paths",
                    "run_tracker",
                ],
                ["tune_trials", "tune_choice", "tune_plot", "tuned_parameters"],
                name="tune_micro_batch",
            ),
        ],
        tags={"tune"},
    )
