"""Wiring of the sweep pipeline."""

from kedro.pipeline import Node, Pipeline

from fastlm.pipelines.sweep import nodes


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                nodes.run_sweep,
                [
                    "tokenized_corpus",
                    "tokenized_corpus_fingerprint",
                    "tokenizer",
                    "corpus_splits",
                    "params:train",
                    "params:split",
                    "params:report",
                    "params:sweep",
                    "sweep_runs",
                    "run_tracker",
                ],
                ["sweep_comparison", "sweep_loss_plot", "sweep_verdict", "sweep_folds"],
                name="run_sweep",
            ),
        ],
        tags={"sweep"},
    )
