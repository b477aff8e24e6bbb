"""benchmarks/compile_scope.py runs end to end on a small shape, each scope in its own process, and the
figures it prints (times, losses and their relative difference) are the ones it writes. That both scopes
compute the same training, inductor's kernels included, is tested in-process, within a tolerance
(tests/engine/runtime/test_regions.py): here the script traces with ``--backend aot_eager`` (dynamo and
AOTAutograd without inductor's C++ kernels: two cold inductor compiles took 1-3 minutes of the suite's time
on 2 cores), a background job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import background

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "compile_scope.py"


def both_scopes(folder: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """The script on a 2-layer Llama (a job of tests/support/background.py)."""
    out = folder / "scopes.json"
    shape = ["--layers", "2", "--hidden", "32", "--vocab", "128", "--rows", "2", "--seq-len", "32"]
    command = [
        sys.executable,
        str(SCRIPT),
        *shape,
        "--steps",
        "1",
        "--backend",
        "aot_eager",
        "--json",
        str(out),
    ]
    return out, background.run(command, cwd=folder, timeout=300)


@pytest.mark.background(job=both_scopes)
def test_both_scopes_run_and_reach_the_same_loss():
    out, done = background.result(both_scopes)
    assert done.returncode == 0, done.stderr
    results = json.loads(out.read_text())
    assert set(results) == {"model", "layers"}
    model, layers = results["model"], results["layers"]
    assert (
        model["backend"] == layers["backend"] == "aot_eager"
        and "torch.compile backend aot_eager" in done.stdout
    )
    assert model["first_step_s"] > 0 and layers["step_s"] > 0
    rel = abs(layers["last_loss"] - model["last_loss"]) / abs(model["last_loss"])
    for row in (model, layers):
        assert f"{row['first_step_s']:.1f}" in done.stdout and f"{row['last_loss']:.4f}" in done.stdout
    speed = layers["tokens_per_s"] / model["tokens_per_s"]
    assert f"steady speed {speed:.2f}x; last losses differ by {rel:.1e} relative" in done.stdout
