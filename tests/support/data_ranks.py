"""Two gloo ranks on this machine, each running ``launch.job.run_job`` on the splits it was handed, as
torchrun ranks do on the data each loads itself: for the tests of the start-of-run agreement on the
tokenized data (``launch.job``). Each case runs in the same two processes, one after the other. The ranks
are forked from the test process (its imports done: a fraction of a second, where spawning them imports
the engine again in each); the test process has made no process group and runs one thread a rank."""

from __future__ import annotations

import json
import pathlib

import torch
import torch.distributed as dist

from tests.support import spawned_ranks

WORLD = 2


def run(folder: pathlib.Path, params, tokenizer, cases: dict[str, list[tuple]]) -> list[dict]:
    """Each rank's ``{case: {"steps": ...} or {"error": ..., "exit_code": ...}}``: ``cases[name][rank]`` is
    the ``(train, validation)`` splits that rank trains on in case ``name``; ``steps`` is rank 0's trained
    steps (None on rank 1), ``error`` the line of a user error a rank raised."""
    args = (folder, params, tokenizer, cases)
    spawned_ranks.start(_rank, args, folder, WORLD, start_method="fork")
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in range(WORLD)]


def _rank(rank: int, folder: pathlib.Path, params, tokenizer, cases) -> None:
    from fastlm.engine.distributed.ranks import RankInfo
    from fastlm.engine.launch.job import TrainJob, run_job
    from fastlm.errors import FastlmError

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder / 'store'}", rank=rank, world_size=WORLD)
    try:
        seen = {}
        for name, splits in cases.items():
            train, validation = splits[rank]
            job = TrainJob(params, 48, train, validation, tokenizer, str(folder / name / "model"))
            try:
                result = run_job(job, RankInfo(rank, WORLD, rank))
                seen[name] = {"steps": result.summary["steps_trained"] if result is not None else None}
            except FastlmError as error:
                seen[name] = {"error": str(error), "exit_code": error.exit_code}
            dist.barrier()
        (folder / f"rank{rank}.json").write_text(json.dumps(seen))
    finally:
        dist.destroy_process_group()
