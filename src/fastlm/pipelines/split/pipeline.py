"""Wiring of the split pipeline."""

from kedro.pipeline import Node, Pipeline

from fastlm.pipelines.split import nodes


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                nodes.clean_corpus,
                ["raw_corpus", "params:split"],
                ["clean_corpus", "cleaning_counts"],
                name="clean_corpus",
            ),
            Node(
                nodes.split_corpus,
                ["clean_corpus", "cleaning_counts", "params:split"],
                ["corpus_splits", "split_counts"],
                name="split_corpus",
            ),
            Node(
                nodes.build_tokenizer,
                ["corpus_splits", "params:split", "split_counts"],
                "tokenizer",
                name="build_tokenizer",
            ),
            Node(
                nodes.tokenize_corpus,
                ["corpus_splits", "tokenizer", "params:split", "split_counts"],
                ["tokenized_corpus", "tokenized_corpus_fingerprint", "token_length_stats"],
                name="tokenize_corpus",
            ),
            Node(
                nodes.report_split,
                ["split_counts", "token_length_stats", "tokenized_corpus_fingerprint"],
                ["split_report", "split_summary"],
                name="report_split",
            ),
        ],
        tags={"split"},
    )
