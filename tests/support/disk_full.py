"""A file write that stops part way, as a full disk (ENOSPC), a file size limit (EFBIG) or a Ctrl-C
(KeyboardInterrupt) stops it: the first write to a file whose name holds a given text keeps half its data,
then raises. Patched at ``builtins.open``, which kedro-datasets' local files (through fsspec) and
``fastlm.temporary_files`` alike open with."""

from __future__ import annotations

import builtins
import errno
import os


class _StopsPartWay:
    def __init__(self, handle, stop: BaseException) -> None:
        self._handle, self._stop = handle, stop

    def write(self, data):
        self._handle.write(data[: len(data) // 2])
        self._handle.flush()
        raise self._stop

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._handle.close()


def disk_full(code: int = errno.ENOSPC) -> OSError:
    return OSError(code, os.strerror(code))


def write_stops_part_way(monkeypatch, name_part: str, stop: BaseException | None = None) -> None:
    """Writes to files whose name holds ``name_part`` write half their first data, then raise ``stop``
    (default: ENOSPC)."""
    real_open = builtins.open

    def opening(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        if name_part in os.fspath(file) if isinstance(file, str | os.PathLike) else False:
            if any(flag in mode for flag in "wax+"):
                return _StopsPartWay(handle, stop if stop is not None else disk_full())
        return handle

    monkeypatch.setattr(builtins, "open", opening)
