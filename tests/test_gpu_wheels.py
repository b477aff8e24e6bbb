"""scripts/slim_wheel.py and scripts/gpu_wheels.sh, offline: a tiny wheel built here with two shared-library
stand-ins is slimmed to one, its RECORD follows, and pip installs it; the size check fails in one line."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
WHEEL_NAME = "tinylib-1.0-py3-none-any.whl"


@pytest.fixture()
def slim(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import slim_wheel

    return slim_wheel


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(
    folder: Path, name: str = "tinylib", libs: tuple[str, ...] = ("libtiny_cuda12.so", "libtiny_cuda13.so")
) -> Path:
    """A valid wheel of ``name`` 1.0: a package, shared-library stand-ins, METADATA, WHEEL, RECORD."""
    info = f"{name}-1.0.dist-info"
    files = {
        f"{name}/__init__.py": b"VALUE = 1\n",
        **{f"{name}/{lib}": b"\x7fELF stand-in " * 50 + lib.encode() for lib in libs},
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for path, data in files.items():
        writer.writerow([path, _hash(data), len(data)])
    writer.writerow([f"{info}/RECORD", "", ""])
    files[f"{info}/RECORD"] = record.getvalue().encode()
    path = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        for member, data in files.items():
            wheel.writestr(member, data)
    return path


def test_slim_wheel_removes_the_libraries_from_the_zip_and_the_record_and_pip_installs_it(slim, tmp_path):
    original = build_wheel(tmp_path)
    kept_bytes = zipfile.ZipFile(original).read("tinylib/libtiny_cuda13.so")
    out = slim.slim_wheel(original, r"_cuda13\.so$", out_dir=tmp_path / "slim")
    assert out == tmp_path / "slim" / WHEEL_NAME  # the same file name: pip reads name and tags from it
    with zipfile.ZipFile(out) as wheel:
        names = wheel.namelist()
        record = wheel.read("tinylib-1.0.dist-info/RECORD").decode()
        assert wheel.read("tinylib/libtiny_cuda13.so") == kept_bytes
    assert "tinylib/libtiny_cuda12.so" not in names and "tinylib/libtiny_cuda12.so" not in record
    assert "tinylib/libtiny_cuda13.so" in names and "tinylib/libtiny_cuda13.so," + _hash(kept_bytes) in record
    assert names[-1] == "tinylib-1.0.dist-info/RECORD"
    rows = list(csv.reader(io.StringIO(record)))
    assert sorted(r[0] for r in rows) == sorted(names)  # every file listed once, nothing listed that is gone
    site = tmp_path / "site"
    pip = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(site),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert pip.returncode == 0, pip.stderr
    assert (site / "tinylib" / "libtiny_cuda13.so").read_bytes() == kept_bytes
    assert not (site / "tinylib" / "libtiny_cuda12.so").exists()


def test_slim_wheel_in_place_keeps_the_path_and_a_second_pass_changes_nothing(slim, tmp_path):
    path = build_wheel(tmp_path)
    path.chmod(0o644)
    assert slim.slim_wheel(path, r"_cuda13\.so$") == path
    assert path.stat().st_mode & 0o777 == 0o644  # readable as before, not the temporary file's 0600
    first = sorted(zipfile.ZipFile(path).namelist())
    slim.slim_wheel(path, r"_cuda13\.so$")
    assert sorted(zipfile.ZipFile(path).namelist()) == first
    assert list(tmp_path.glob(".slim-*")) == []  # no temporary file left behind


def test_slim_wheel_refuses_a_file_that_is_not_a_wheel(slim, tmp_path):
    bogus = tmp_path / "bogus-1.0-py3-none-any.whl"
    bogus.write_text("not a zip")
    with pytest.raises(slim.WheelError, match="not a wheel"):
        slim.slim_wheel(bogus, "x")


@pytest.fixture()
def script_repo(tmp_path):
    """A git repository holding the two scripts and a tiny wheel in .whl/ (nothing is downloaded)."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("gpu_wheels.sh", "slim_wheel.py"):
        shutil.copy(SCRIPTS / name, repo / "scripts" / name)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".whl").mkdir()
    build_wheel(repo / ".whl")
    build_wheel(repo / ".whl", "bitsandbytes", ("libbitsandbytes_cuda128.so", "libbitsandbytes_cuda130.so"))
    return repo


def run_script(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(repo / "scripts" / "gpu_wheels.sh"), "--no-download", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHON": sys.executable},
    )


def test_gpu_wheels_sizes_the_wheels_and_keeps_them_out_of_git(script_repo):
    done = run_script(script_repo)
    assert done.returncode == 0, done.stderr
    assert WHEEL_NAME in done.stdout and "wheels in all (2)" in done.stdout
    bitsandbytes = zipfile.ZipFile(script_repo / ".whl" / "bitsandbytes-1.0-py3-none-any.whl").namelist()
    assert "bitsandbytes/libbitsandbytes_cuda130.so" in bitsandbytes  # slimmed to the CUDA 13 library
    assert "bitsandbytes/libbitsandbytes_cuda128.so" not in bitsandbytes
    assert "/.whl/" in (script_repo / ".git" / "info" / "exclude").read_text().splitlines()
    again = run_script(script_repo)  # the exclude line is written once
    assert again.returncode == 0
    assert (script_repo / ".git" / "info" / "exclude").read_text().splitlines().count("/.whl/") == 1


def test_gpu_wheels_over_the_limit_fails_with_one_line(script_repo):
    done = run_script(script_repo, "--limit-mib", "0")
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0 and "over the 0 MiB limit" in done.stderr


def test_gpu_wheels_refuses_an_unpinned_package_in_one_line(script_repo):
    done = run_script(script_repo, "peft")
    assert done.returncode == 2 and "is not NAME==VERSION" in done.stderr
    assert done.stderr.strip().count("\n") == 0
