"""Wiring of the train pipeline."""

from kedro.pipeline import Node, Pipeline

from fastlm.pipelines.train import nodes


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                nodes.train_model,
                [
                    "tokenized_corpus",
                    "tokenized_corpus_fingerprint",
                    "tokenizer",
                    "params:train",
                    "params:split",
                    "params:run_name",
                    "dataset_paths",
                    "run_tracker",
                ],
                ["trained_model", "train_history", "eval_history", "train_summary"],
                name="train_model",
            ),
        ],
        tags={"train"},
    )
