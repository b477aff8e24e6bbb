"""The code style is checked, not hoped for: ruff's lint rules (line length 110 included) and ruff's formatter
pass on everything under src/, tests/, benchmarks/ and scripts/."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ["src", "tests", "benchmarks", "scripts"]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (bash scripts/install.sh --dev installs it)")
    return subprocess.run([ruff, *args, *FOLDERS], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_ruff_lint_passes_with_line_length_110():
    done = _ruff("check", "--no-cache")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]


def test_ruff_format_leaves_every_file_unchanged():
    done = _ruff("format", "--check", "--no-cache")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]


def test_the_line_length_rule_is_on():
    """E501 is not ignored: the limit is enforced, not only the formatter's target."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    lint = text.split("[tool.ruff.lint]", 1)[1].split("\n[", 1)[0]
    assert "E501" not in lint and "line-length = 110" in text
