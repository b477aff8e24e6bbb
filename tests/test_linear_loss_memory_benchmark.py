"""benchmarks/linear_loss_memory.py runs end to end on a small shape: the plain path, the fused path at the
engine's chunk size, at the chunk sizes and with the weight-gradient blocks asked for, each in its own
process, with the same loss."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tolerances import reordered_sum_rtol

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "linear_loss_memory.py"
TOKENS, VOCAB = 256, 4096


@pytest.fixture(scope="module")
def fp32_run(tmp_path_factory) -> tuple[dict, subprocess.CompletedProcess]:
    """One fp32 run of the script, its figures and what it printed: each path and chunk size, and the GPU
    kernels asked for (``--kernels liger cce``, the GPU session's head_kernels step), which a CPU skips."""
    out = tmp_path_factory.mktemp("linear_loss_memory") / "figures.json"
    shown = subprocess.run(
        [sys.executable, str(SCRIPT), "--tokens", str(TOKENS), "--vocab", str(VOCAB), "--hidden", "32"]
        + ["--threads", "1", "--chunk-tokens", "64", "--vocab-blocks", "1000"]
        + ["--kernels", "liger", "cce", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    return json.loads(out.read_text()), shown


@pytest.mark.kernels  # the fused and the plain loss are two computations, compared with a tolerance
def test_the_benchmark_measures_each_path_and_chunk_size_with_the_same_loss(fp32_run):
    figures, shown = fp32_run
    results = figures["results"]
    assert set(results) == {"plain", "fused", "fused@64", "blocks@1000"}
    plain = results["plain"]["loss"]
    for name in ("fused", "fused@64", "blocks@1000"):  # chunked sums vs one: the same terms in another order
        assert results[name]["loss"] == pytest.approx(plain, rel=reordered_sum_rtol(TOKENS * VOCAB))
        assert results[name]["peak_above_inputs_mb"] >= 0
    assert "fused@64" in shown.stdout and "memory: plain / fused" in shown.stdout


@pytest.mark.kernels  # bf16 products on both sides, compared with bf16's tolerance
def test_under_bf16_the_benchmark_runs_both_heads_under_autocast(tmp_path):
    """``--precision bf16``: a mixed-precision full fine-tune's head (fp32 weights, bf16 autocast), the fused
    path's weight gradient by vocabulary blocks; both losses within bf16's rounding of the products."""
    from tests.support.tolerances import BF16_VS_FP32

    out = tmp_path / "figures.json"
    shown = subprocess.run(
        [sys.executable, str(SCRIPT), "--tokens", str(TOKENS), "--vocab", str(VOCAB), "--hidden", "32"]
        + ["--threads", "1", "--precision", "bf16", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["args"]["precision"] == "bf16" and set(figures["results"]) == {"plain", "fused"}
    results = figures["results"]
    assert results["fused"]["loss"] == pytest.approx(results["plain"]["loss"], rel=2 * BF16_VS_FP32["rtol"])
    assert "bf16 autocast, fp32 weights" in shown.stdout and "by blocks of" in shown.stdout


def test_the_gpu_kernels_are_skipped_with_their_reason_where_they_cannot_run(fp32_run):
    """``--kernels liger cce`` (the GPU session's head_kernels step) on a CPU: each kernel reported as
    skipped with why, ours and the plain head measured, exit 0; an fp32 run says why cce cannot run."""
    figures, shown = fp32_run  # exit 0: asserted by the fixture
    assert {"plain", "fused"} <= set(figures["results"]) and not {"liger", "cce"} & set(figures["results"])
    assert "not on a CUDA device" in figures["skipped"]["liger"]
    assert "bf16 or fp16 only" in figures["skipped"]["cce"]
    assert "liger: skipped: this run is not on a CUDA device" in shown.stdout
