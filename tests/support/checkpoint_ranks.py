"""Two gloo ranks on this machine, each running ``launch.job.run_job`` with parameters of its own, as the
torchrun ranks of two nodes do on what each node's disk holds: for the tests of the start-of-run agreement
on the checkpoint a run continues (``train.persistence``). Each case runs in the same two processes, one
after the other (forked from the test process, one thread a rank, as ``data_ranks``)."""

from __future__ import annotations

import datetime
import json
import pathlib

import torch
import torch.distributed as dist

from tests.support import spawned_ranks

WORLD = 2


def run(folder: pathlib.Path, tokenizer, splits: tuple, cases: dict[str, list]) -> list[dict]:
    """Each rank's ``{case: {"steps": ..., "resumed_from_step": ...} or {"error": ..., "exit_code": ...}}``:
    ``cases[name][rank]`` is the train parameters that rank runs case ``name`` with, on ``splits`` (train,
    validation); ``steps`` and ``resumed_from_step`` are rank 0's (None on rank 1), ``error`` the line of a
    user error a rank raised."""
    args = (folder, tokenizer, splits, cases)
    spawned_ranks.start(_rank, args, folder, WORLD, start_method="fork")
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in range(WORLD)]


def _rank(rank: int, folder: pathlib.Path, tokenizer, splits, cases) -> None:
    from fastlm.engine.distributed.ranks import RankInfo
    from fastlm.engine.launch.job import TrainJob, run_job
    from fastlm.errors import FastlmError

    torch.set_num_threads(1)
    # a minute for any collective: ranks that went apart fail the test instead of holding it for gloo's 30
    dist.init_process_group(
        "gloo",
        init_method=f"file://{folder / 'store'}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        seen = {}
        for name, params in cases.items():
            job = TrainJob(params[rank], 48, *splits, tokenizer, str(folder / name / "model"))
            try:
                result = run_job(job, RankInfo(rank, WORLD, rank))
                summary = result.summary if result is not None else {}
                seen[name] = {
                    "steps": summary.get("steps_trained"),
                    "resumed_from_step": summary.get("resumed_from_step"),
                }
            except FastlmError as error:
                seen[name] = {"error": str(error), "exit_code": error.exit_code}
            dist.barrier()
        (folder / f"rank{rank}.json").write_text(json.dumps(seen))
    finally:
        dist.destroy_process_group()
