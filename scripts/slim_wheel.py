"""Slim a binary wheel down to the native libraries one machine needs, keeping it installable by pip.

bitsandbytes' manylinux wheel bundles one shared library per CUDA / ROCm / XPU toolkit (41 MB); a CUDA 13
machine loads only ``libbitsandbytes_cuda13*.so`` (or the CPU one). ``slim_wheel`` removes every shared
library whose file name does not match ``keep_pattern``, drops their lines from the wheel's ``RECORD`` (the
other lines, hashes included, stay as they were: the kept files are unchanged) and writes the wheel again
under the same file name, so ``pip install --no-index`` takes it as the original.

    python scripts/slim_wheel.py .whl/bitsandbytes-0.50.0-py3-none-manylinux_2_24_x86_64.whl \
        --keep 'libbitsandbytes_(cpu|cuda13[0-9]*)\\.so$'
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import sys
import tempfile
import zipfile
from pathlib import Path

SHARED_LIBRARY = r"\.so(\.[0-9.]+)?$"
BITSANDBYTES_CUDA13 = r"libbitsandbytes_(cpu|cuda13[0-9]*)\.so$"


class WheelError(ValueError):
    """A file that is not a wheel this module can slim."""


def record_name(names: list[str]) -> str:
    """The ``*.dist-info/RECORD`` entry of a wheel's file list."""
    records = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)]
    if len(records) != 1:
        raise WheelError(f"expected one *.dist-info/RECORD in the wheel, found {len(records)}")
    return records[0]


def slimmed_record(text: str, removed: set[str]) -> str:
    """``RECORD`` without the rows of ``removed`` files (CSV: path, hash, size)."""
    rows = [row for row in csv.reader(io.StringIO(text)) if row and row[0] not in removed]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


def slim_wheel(
    path: str | Path,
    keep_pattern: str,
    *,
    candidates: str = SHARED_LIBRARY,
    out_dir: str | Path | None = None,
) -> Path:
    """Remove from the wheel at ``path`` every file whose name matches ``candidates`` (shared libraries) but
    whose base name does not match ``keep_pattern`` (``re.search``); drop them from ``RECORD``; write the
    wheel under the same file name in ``out_dir`` (default: in place, replaced atomically). Returns its path.
    A wheel with nothing to remove is copied (or left) unchanged."""
    path = Path(path)
    if not zipfile.is_zipfile(path):
        raise WheelError(f"{path} is not a wheel (not a zip file)")
    keep, candidate = re.compile(keep_pattern), re.compile(candidates)
    target = Path(out_dir or path.parent) / path.name
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path) as source:
        infos = source.infolist()
        record = record_name([i.filename for i in infos])
        removed = {
            i.filename
            for i in infos
            if candidate.search(i.filename) and not keep.search(i.filename.rsplit("/", 1)[-1])
        }
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=".slim-", suffix=".whl")
        os.close(handle)
        try:
            with zipfile.ZipFile(temporary, "w", compression=zipfile.ZIP_DEFLATED) as sink:
                # RECORD last, as the wheel format recommends
                for info in sorted(infos, key=lambda i: i.filename == record):
                    if info.filename in removed:
                        continue
                    data = source.read(info)
                    if info.filename == record:
                        data = slimmed_record(data.decode("utf-8"), removed).encode("utf-8")
                    info.compress_type = zipfile.ZIP_DEFLATED
                    sink.writestr(info, data)
            os.chmod(temporary, path.stat().st_mode & 0o777)  # mkstemp makes it 0600
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument(
        "--keep",
        default=BITSANDBYTES_CUDA13,
        help=f"shared libraries whose file name matches this are kept (default: {BITSANDBYTES_CUDA13})",
    )
    parser.add_argument("--out-dir", type=Path, default=None, help="default: replace the wheel in place")
    args = parser.parse_args(argv)
    if not args.wheel.is_file():
        print(f"slim_wheel: wheel {args.wheel} does not exist; pass a downloaded .whl file", file=sys.stderr)
        return 2
    before = args.wheel.stat().st_size
    try:
        out = slim_wheel(args.wheel, args.keep, out_dir=args.out_dir)
    except (WheelError, re.error) as error:
        print(f"slim_wheel: {args.wheel}: {error}", file=sys.stderr)
        return 2
    print(f"slimmed {out.name}: {before / 2**20:.1f} MiB -> {out.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
