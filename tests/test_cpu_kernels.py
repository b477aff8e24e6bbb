"""scripts/check_cpu_kernels.sh: tests run under other CPU kernel sets really get other kernels, and a test
that passes on this CPU's kernels but not on another set fails the check."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support import background

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_cpu_kernels.sh"


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return background.run(
        ["bash", str(SCRIPT), *args],
        cwd=cwd,
        timeout=120,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHON": sys.executable},
    )


def listed_sets(folder: Path) -> subprocess.CompletedProcess:
    """``--list`` (a job of tests/support/background.py)."""
    return run("--list", cwd=folder)


def check_of_a_kernel_dependent_test(folder: Path) -> subprocess.CompletedProcess:
    """The check, under avx2 and default at once (``--jobs 2``, as CI runs it), of a test that passes only
    where ATen has vector kernels (a job of tests/support/background.py)."""
    test = folder / "test_depends_on_the_cpu.py"
    with open(test, "w") as file:
        file.write(
            "import os\n\nimport torch\n\n\ndef test_vector_kernels():\n"
            f"    with open({str(folder / 'caches.txt')!r}, 'a') as seen:\n"
            "        seen.write(os.environ['TORCHINDUCTOR_CACHE_DIR'] + '\\n')\n"
            "    assert torch.backends.cpu.get_cpu_capability() != 'DEFAULT'\n"
        )
    return run("--sets", "avx2,default", "--jobs", "2", str(test), cwd=folder)


def unknown_set(folder: Path) -> subprocess.CompletedProcess:
    """``--sets avx9`` (a job of tests/support/background.py)."""
    return run("--sets", "avx9", cwd=folder)


@pytest.mark.background(job=listed_sets)
def test_each_kernel_set_makes_pytorch_dispatch_its_own_kernels():
    listed = background.result(listed_sets)
    assert listed.returncode == 0, listed.stderr
    picked = dict(line.split(": ", 1) for line in listed.stdout.splitlines())
    assert set(picked) == {"native", "avx2", "default"}
    own = torch.backends.cpu.get_cpu_capability()
    native = picked["native"].rsplit("ATen ", 1)[1]
    if os.environ.get("ATEN_CPU_CAPABILITY"):  # this process runs a forced set: the CPU's own is at least it
        ranks = ["DEFAULT", "AVX2", "AVX512"]
        assert ranks.index(native) >= ranks.index(own), (native, own)
    else:
        assert native == own
    assert (
        picked["default"].endswith("ATen DEFAULT") and "MKL_ENABLE_INSTRUCTIONS=SSE4_2" in picked["default"]
    )
    assert picked["avx2"].endswith("ATen AVX2") or torch.backends.cpu.get_cpu_capability() == "DEFAULT"


@pytest.mark.background(job=check_of_a_kernel_dependent_test)
def test_a_test_that_passes_only_on_some_kernels_fails_the_check():
    checked = background.result(check_of_a_kernel_dependent_test)
    assert checked.returncode == 1, checked.stdout[-2000:]
    lines = checked.stdout.splitlines()
    assert (
        lines[0]
        == "== check_cpu_kernels: 2 sets, 2 at a time (--jobs); each set's output follows when it ends"
    )
    # the two sets ran at once, and each one's output is printed whole, in the order of --sets
    ends = [
        i for i, line in enumerate(lines) if line.startswith("== check_cpu_kernels: ") and ": exit " in line
    ]
    assert [lines[i].split(": ")[1] for i in ends] == ["avx2", "default"]
    assert "avx2: exit 0" in lines[ends[0]] and "default: exit 1" in lines[ends[1]]
    assert lines[ends[0] + 1].startswith("== check_cpu_kernels: default (ATEN_CPU_CAPABILITY=default")
    assert "every set done in" in lines[-1]
    # each set compiles into an inductor cache of its own (its cache is not keyed on the kernel set), removed
    caches = (Path(checked.args[-1]).parent / "caches.txt").read_text().split()
    assert sorted(Path(cache).name for cache in caches) == ["avx2", "default"] and caches[0] != caches[1]
    assert not any(Path(cache).parent.exists() for cache in caches)


@pytest.mark.background(job=unknown_set)
def test_an_unknown_set_is_refused_in_one_line():
    refused = background.result(unknown_set)
    assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0 and "avx9" in refused.stderr


def test_help_prints_the_usage_and_runs_nothing(tmp_path):
    shown = subprocess.run(
        ["bash", str(SCRIPT), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHON": "/nonexistent/python"},  # runs no Python, no pytest
    )
    assert shown.returncode == 0, shown.stderr
    assert "bash scripts/check_cpu_kernels.sh --list" in shown.stdout and "--jobs N" in shown.stdout
    assert not shown.stdout.startswith("#!") and "set -uo pipefail" not in shown.stdout
