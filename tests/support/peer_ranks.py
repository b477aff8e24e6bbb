"""Two gloo ranks on this machine running one job as torchrun ranks do (``launch.job.run_torchrun_rank``),
rank 1's process killed outright (SIGKILL, as the out-of-memory killer does) at its third optimizer step's
sum of host numbers, for the tests of what the surviving rank 0 raises when a collective fails on its lost
peer (gloo's own words). The ranks are forked from the test process (as in tests/support/data_ranks)."""

from __future__ import annotations

import json
import os
import pathlib
import signal

import torch
import torch.distributed as dist

WORLD = 2
KILLED_AT = 3  # rank 1's sum_host call (one an optimizer step) at which its process is killed


def run(folder: pathlib.Path, params, tokenizer, splits: tuple) -> dict:
    """What rank 0 raised (``type``, ``error``, ``exit_code``, ``cause``: the error it was raised from) and
    its SIGTERM handler afterwards (``sigterm``), with each rank's exit status (``exit_codes``)."""
    args = (folder, params, tokenizer, splits)
    context = torch.multiprocessing.start_processes(
        _rank, args=args, nprocs=WORLD, join=False, start_method="fork"
    )
    for process in context.processes:
        process.join(timeout=120)
        if process.exitcode is None:
            process.kill()
            process.join()
    path = folder / "rank0.json"
    seen = json.loads(path.read_text()) if path.exists() else {}
    return {**seen, "exit_codes": [process.exitcode for process in context.processes]}


def _rank(rank: int, folder: pathlib.Path, params, tokenizer, splits: tuple) -> None:
    from fastlm.engine.distributed import parallel
    from fastlm.engine.distributed.ranks import RankInfo
    from fastlm.engine.launch.job import TrainJob, run_torchrun_rank

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder / 'store'}", rank=rank, world_size=WORLD)
    if rank == 1:
        calls = []
        sum_host = parallel.ProcessGroup.sum_host

        def killed_at_a_step(self, values):
            calls.append(values)
            if len(calls) == KILLED_AT:
                os.kill(os.getpid(), signal.SIGKILL)
            return sum_host(self, values)

        parallel.ProcessGroup.sum_host = killed_at_a_step
    job = TrainJob(params, 48, *splits, tokenizer, str(folder / "model"))
    try:
        run_torchrun_rank(job, RankInfo(rank, WORLD, rank))
        seen: dict = {"type": None}
    except BaseException as error:  # noqa: BLE001 - what the rank ended with is the result
        seen = {
            "type": type(error).__name__,
            "error": str(error),
            "exit_code": getattr(error, "exit_code", None),
            "cause": str(error.__cause__),
        }
    seen["sigterm"] = str(signal.getsignal(signal.SIGTERM))
    (folder / f"rank{rank}.json").write_text(json.dumps(seen))
