"""Start the gloo ranks of the tests that run a process group of their own (tests/support/ddp_ranks,
fsdp_ranks, data_ranks) and join them, as ``torch.multiprocessing.start_processes`` does, with the same
guard as the launched workers' (``parallel_jobs.launch``): a rank that native code crashed (a SIGSEGV in
gloo's library, seen once in CI's kernel-set run of 2026-12-02 under FSDP2, not reproduced in 260 runs
here) is not what these tests compare. Each rank records its Python stack if native code crashes it
(``faulthandler``, into the ranks' folder); such a crash runs the ranks once more from what the folder
held before, with a warning carrying that stack (in the test session's warnings summary, for a report).
A second crash fails the test; any other failure (an exception, an exit status) fails it at once."""

from __future__ import annotations

import faulthandler
import shutil
import signal
import warnings
from pathlib import Path

import torch.multiprocessing
from torch.multiprocessing.spawn import ProcessExitedException

NATIVE = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}
_RECORDS: list = []  # each rank's open record file, kept open until the process ends


def start(rank, args: tuple, folder: Path, nprocs: int, *, start_method: str = "spawn") -> None:
    """``rank(index, *args)`` in ``nprocs`` processes (``start_method``), joined; once more after a
    native crash. ``folder``: where the ranks write (their store, their results); what was not there
    before the first start is removed before the second."""
    before = set(folder.iterdir())
    for attempt in (1, 2):
        try:
            torch.multiprocessing.start_processes(
                _recorded, args=(rank, folder, args), nprocs=nprocs, join=True, start_method=start_method
            )
            return
        except ProcessExitedException as error:
            crashed = error.signal_name is not None and signal.Signals[error.signal_name] in NATIVE
            if attempt == 2 or not crashed:
                raise
            stacks = "\n".join(
                f"rank {index}:\n{path.read_text(errors='replace')}"
                for index in range(nprocs)
                if (path := folder / f"native-crash-{index}.txt").exists() and path.stat().st_size
            )
            warnings.warn(f"ranks started again after: {error}\n{stacks}", stacklevel=2)
        for path in set(folder.iterdir()) - before:
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def _recorded(index: int, rank, folder: Path, args: tuple) -> None:
    record = open(folder / f"native-crash-{index}.txt", "w")  # noqa: SIM115 - open while the process runs
    _RECORDS.append(record)
    faulthandler.enable(record, all_threads=True)
    rank(index, *args)


def crash_once(index: int, folder: Path, marker: Path, always: bool = False) -> None:
    """A rank for the tests of ``start``: rank 1 crashes in native code (a SIGSEGV in ``ctypes.string_at``)
    the first time (``marker`` written: it outlives the folder's cleaning), or every time where ``always``;
    otherwise each rank writes its result."""
    import ctypes

    if index == 1 and (always or not marker.exists()):
        marker.write_text("crashed")
        ctypes.string_at(0)
    (folder / f"rank{index}.txt").write_text(f"done {index}")


def fail(index: int, folder: Path, calls: Path) -> None:
    """A rank for the tests of ``start`` that fails with an exception, counting its starts in ``calls``."""
    with open(calls, "a") as file:
        file.write(f"{index}\n")
    raise RuntimeError(f"rank {index} failed")
