"""benchmarks/optimizer_step.py runs end to end on a small shape: both AdamW kernels timed over the same
parameter groups, the kernel fastlm picks here named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "optimizer_step.py"


def test_the_benchmark_times_both_kernels_and_names_fastlms(tmp_path):
    out = tmp_path / "figures.json"
    shown = subprocess.run(
        [sys.executable, str(SCRIPT), "--vocab", "512", "--hidden", "32", "--layers", "1", "--steps", "2"]
        + ["--threads", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["chosen"] == "fused"  # every parameter on the CPU: torch's fused kernel
    assert set(figures["results"]) == {"fused", "foreach"}
    assert {r["parameters"] for r in figures["results"].values()} == {512 * 32 + 32 * 128}
    assert all(r["seconds"] > 0 for r in figures["results"].values())
    assert "foreach / fused = " in shown.stdout
