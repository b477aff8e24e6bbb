"""benchmarks/liger_head_check.py, the check a GPU session runs before its plan: one line and exit 0 where
liger-kernel or Triton is missing (as here and in CI), PASS on the real kernel under Triton's interpreter
where both are installed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "liger_head_check.py"


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    paths = [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths), **env},
    )


@pytest.mark.skipif(importlib.util.find_spec("triton") is not None, reason="triton is installed here")
def test_without_triton_the_check_is_skipped_in_one_line():
    done = _run()
    assert done.returncode == 0 and done.stdout.startswith("SKIP  liger head check: ")
    assert done.stdout.count("\n") == 1 and "triton" in done.stdout


def test_the_check_passes_on_the_real_kernel_under_the_triton_interpreter():
    pytest.importorskip("triton")
    pytest.importorskip("liger_kernel.ops.cross_entropy")
    done = _run(
        "--device", "cpu", "--tokens", "256", "--vocab", "2048", "--hidden", "64", TRITON_INTERPRET="1"
    )
    assert done.returncode == 0 and "PASS  liger head check on cpu" in done.stdout, done.stderr[-2000:]


def test_a_gpu_session_runs_the_check_before_its_plan():
    session = (ROOT / "benchmarks" / "gpu_session.sh").read_text()
    assert session.index("benchmarks/liger_head_check.py") < session.index('for step in "${PLAN[@]}"')
