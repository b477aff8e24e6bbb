"""Wiring of the report pipeline."""

from kedro.pipeline import Node, Pipeline

from fastlm.pipelines.report import nodes


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                nodes.summarize_training,
                ["train_summary", "train_history", "eval_history", "dataset_paths"],
                ["training_summary", "efficiency_summary", "bottleneck_diagnosis"],
                name="summarize_training",
            ),
            Node(
                nodes.evaluate_model,
                [
                    "trained_model",
                    "tokenized_corpus",
                    "tokenized_corpus_fingerprint",
                    "params:train",
                    "params:split",
                    "params:report",
                    "dataset_paths",
                ],
                ["evaluation_metrics", "error_pairs", "worst_samples", "sample_generations"],
                name="evaluate_model",
            ),
            Node(
                nodes.generate_on_references,
                [
                    "trained_model",
                    "corpus_splits",
                    "params:train",
                    "params:split",
                    "params:report",
                    "dataset_paths",
                ],
                ["reference_predictions", "reference_metrics"],
                name="generate_on_references",
            ),
            Node(
                nodes.collect_test_metrics,
                ["evaluation_metrics", "reference_metrics", "train_summary", "run_tracker"],
                "test_metrics",
                name="collect_test_metrics",
            ),
            Node(
                nodes.plot_training,
                ["train_history", "eval_history", "train_summary"],
                ["loss_plot", "throughput_plot", "learning_rate_plot", "memory_plot"],
                name="plot_training",
            ),
            Node(
                nodes.compare_training_runs,
                ["params:report", "test_metrics", "train_summary", "run_tracker"],
                "run_comparison",
                name="compare_training_runs",
            ),
            Node(
                nodes.write_report,
                [
                    "train_summary",
                    "train_history",
                    "eval_history",
                    "training_summary",
                    "efficiency_summary",
                    "bottleneck_diagnosis",
                    "test_metrics",
                    "error_pairs",
                    "worst_samples",
                    "sample_generations",
                    "reference_predictions",
                    "run_comparison",
                    "split_report",
                    "sweep_results",
                    "dataset_paths",
                ],
                ["report_html", "report_markdown"],
                name="write_report",
            ),
        ],
        tags={"report"},
    )
