"""benchmarks/fixed_shapes.py runs end to end on a small corpus: one shape per micro-batch (CUDA graphs)
against the default's real tokens rounded up to 8, on the demo texts and the real reviews' lengths."""

from __future__ import annotations

import json

from tests.support.benchmark_scripts import run_main


def test_one_shape_computes_the_capacity_of_every_micro_batch_and_few_boundary_counts(
    tmp_path, monkeypatch, capsys
):
    # the script's main, run here: what it computes, not how it starts
    out = tmp_path / "fixed.json"
    exit_code = run_main(
        monkeypatch,
        "fixed_shapes",
        ["--demo-docs", "120", "--review-docs", "600", "--seq-len", "256", "--json", str(out)],
    )
    shown = capsys.readouterr()
    assert exit_code is None, shown.err[-3000:]
    results = json.loads(out.read_text())["results"]
    assert [result["texts"] for result in results] == ["demo", "reviews"]
    for result in results:
        default, graphs = result["default"], result["reduce-overhead"]
        assert graphs["real_tokens"] == default["real_tokens"] > 0  # the same samples, in the same batches
        assert graphs["computed_tokens"] == graphs["micro_batches"] * 4 * 256  # each at its capacity
        assert graphs["token_counts"] == 1 and graphs["computed_tokens"] >= default["computed_tokens"]
        assert all(count & (count - 1) == 0 for count in graphs["segment_counts"])  # powers of two
        assert len(graphs["segment_counts"]) <= len(default["segment_counts"])
        assert f"{result['texts']}: one shape computes {result['computed_ratio']:.4f}x" in shown.out
