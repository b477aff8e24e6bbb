"""benchmarks/linear_loss_memory.py runs end to end on a small shape: the plain path, the fused path at the
engine's chunk size and at the chunk sizes asked for, each in its own process, with the same loss."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tolerances import reordered_sum_rtol

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "linear_loss_memory.py"
TOKENS, VOCAB = 256, 4096


@pytest.mark.kernels  # the fused and the plain loss are two computations, compared with a tolerance
def test_the_benchmark_measures_each_path_and_chunk_size_with_the_same_loss(tmp_path):
    out = tmp_path / "figures.json"
    shown = subprocess.run(
        [sys.executable, str(SCRIPT), "--tokens", str(TOKENS), "--vocab", str(VOCAB), "--hidden", "32"]
        + ["--threads", "1", "--chunk-tokens", "64", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"plain", "fused", "fused@64"}
    plain = results["plain"]["loss"]
    for name in ("fused", "fused@64"):  # chunked sums vs one: the same terms in another order
        assert results[name]["loss"] == pytest.approx(plain, rel=reordered_sum_rtol(TOKENS * VOCAB))
        assert results[name]["peak_above_inputs_mb"] >= 0
    assert "fused@64" in shown.stdout and "memory: plain / fused" in shown.stdout
