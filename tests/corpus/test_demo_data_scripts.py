"""The committed demo files are what the scripts regenerate, byte for byte (scripts/demo_data generates them;
the fastlm package itself holds no generator and reads only the files)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "script, args, committed",
    [
        ("make_demo_corpus.py", ["--dialogues"], "demo_dialogues.jsonl"),
        ("make_demo_logkeys.py", [], "demo_logkeys.jsonl"),
    ],
)
def test_scripts_regenerate_the_committed_demo_files_byte_for_byte(tmp_path, script, args, committed):
    out = tmp_path / committed
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *args, "--out", str(out)],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    assert out.read_bytes() == (ROOT / "data" / "01_raw" / committed).read_bytes()


def test_the_package_holds_no_demo_data_generator():
    package = ROOT / "src" / "fastlm"
    assert not [
        path for path in package.rglob("*.py") if "synthetic" in path.name or "demo_data" in path.read_text()
    ]
