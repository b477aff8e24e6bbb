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
                    "dataset_paths",
                ],
                ["sweep_comparison", "sweep_loss_plot", "sweep_verdict", "sweep_folds", "sweep_best_run"],
                name="run_sweep",
            ),
        ],
        tags={"sweep"},
    )
