"""A tiny training job for the tests that launch real worker processes (``launch.workers``) or compare them
with one process (``distributed.parallel``): tokenized splits, the parameters of a short packed run, and the
launch of its workers."""

from __future__ import annotations

import functools
import shutil
import warnings
from pathlib import Path

from fastlm.engine.config import parse_train_params
from fastlm.engine.launch.job import TrainJob, run_job
from fastlm.engine.launch.workers import WorkerFailedError, launch_workers
from fastlm.engine.model.build import build_model


def tokenized_splits(bpe_tokenizer, sample_texts):
    """Train and evaluation splits of samples of at most 48 tokens."""
    import datasets

    eos = bpe_tokenizer.eos_token_id
    ids = [
        row[:47] + [eos] for row in bpe_tokenizer(sample_texts[:400], add_special_tokens=False)["input_ids"]
    ]
    return datasets.Dataset.from_dict({"input_ids": ids[:360]}), datasets.Dataset.from_dict(
        {"input_ids": ids[360:]}
    )


def job_params(tmp_path, *, accum: int, nproc: int, **extra):
    return parse_train_params(
        {
            "max_steps": 4,
            "log_every": 1,
            "eval_every": 2,
            "save_every": 2,
            "quiet": True,
            "resume": "never",
            "checkpoint_dir": str(tmp_path / f"checkpoints-{nproc}"),
            "optimizer": {"warmup_steps": 1},
            "runtime": {"num_threads": 1},
            "model": {
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
            },
            "batching": {"mode": "packed", "micro_batch_size": 2, "gradient_accumulation_steps": accum},
            "distributed": {"nproc_per_node": nproc, "monitor_interval_s": 0.2},
            **extra,
        }
    )


def launch(params, tokenizer, tokenized, tmp_path, callback_factory=None, *, again_after_native_crash=True):
    """The job of ``params`` in its worker processes; its result.

    A worker that native code crashed (a SIGSEGV of an FSDP2 LoRA worker over gloo, seen once in CI's
    kernel-set run of 2026-12-02 and not in 260 runs of the FSDP2 tests here, two kernel sets at once;
    where it crashed is now recorded, ``launch.workers._native_crash_site``) is not what these tests
    compare: where
    ``again_after_native_crash``, the launch runs once more from nothing, with a warning carrying the
    crashed worker's every-thread stack (in the test session's warnings summary, for a report). A second
    crash fails the test; any other failure fails it at once."""
    job = TrainJob(params, 48, tokenized[0], tokenized[1], tokenizer, str(tmp_path / "model"))
    build = functools.partial(build_model, params.model, tokenizer, max_length=48, attn_implementation="sdpa")

    def run():
        return launch_workers(
            job,
            params.distributed.nproc_per_node,
            build_model=build,
            callback_factory=callback_factory,
            monitor_interval_s=params.distributed.monitor_interval_s,
            start_method=params.distributed.start_method,
        )

    try:
        return run()
    except WorkerFailedError as error:
        if not (again_after_native_crash and error.native_stack):
            raise
        warnings.warn(f"launched again after: {error}\n{error.native_stack}", stacklevel=2)
    for folder in (Path(params.checkpoint_dir), tmp_path / "model"):  # from nothing, as the first launch
        shutil.rmtree(folder, ignore_errors=True)
    return run()


class WorkerProcess:
    """A loop callback that writes, once, where rank 0's worker runs: its parent process, the value of one
    environment variable (``variable``) there, and the file its fastlm package was imported from.
    ``functools.partial(WorkerProcess, path, variable)`` is the picklable ``callback_factory`` of
    ``launch``."""

    def __init__(self, path: str, variable: str) -> None:
        import json
        import os
        import sys

        record = {
            "parent": os.getppid(),
            "variable": os.environ.get(variable),
            "fastlm": sys.modules["fastlm"].__file__,
        }
        with open(path, "w") as file:
            json.dump(record, file)

    def __call__(self, kind: str, record: dict) -> None:
        pass


def run_one(params, tokenizer, tokenized, folder):
    """The job of ``params`` in this process (the one-process side of a comparison), its model in
    ``folder``."""
    return run_job(TrainJob(params, 48, tokenized[0], tokenized[1], tokenizer, str(folder / "m")))


def one_and_two(tmp_path, tokenizer, tokenized, *, accum: int, strategy: str = "fsdp", two=None, **job):
    """The job (``job_params``' ``extra``) in one process of ``accum`` micro-batches a step and in two of
    ``accum // 2`` each under ``strategy``, the same effective batch: their results. ``two``: settings
    merged over ``job`` on the two-process side only."""
    alone = job_params(tmp_path / "one", accum=accum, nproc=1, **job)
    one = run_one(alone, tokenizer, tokenized, tmp_path / "one")
    distributed = {"nproc_per_node": 2, "strategy": strategy}
    params = job_params(
        tmp_path / "two", accum=accum // 2, nproc=2, distributed=distributed, **{**job, **(two or {})}
    )
    return one, launch(params, tokenizer, tokenized, tmp_path / "two")


class CrashInNativeCode:
    """A loop callback whose first call crashes the process in native code (a read of address 0: SIGSEGV),
    as a kernel or a collective's library can. ``CrashInNativeCode`` is itself the picklable
    ``callback_factory`` of ``launch``."""

    def __call__(self, kind: str, record: dict) -> None:
        import ctypes

        ctypes.string_at(0)


class CrashOnce:
    """``CrashInNativeCode`` in the first launch only: a launch whose worker finds no file at ``path`` makes
    it, then crashes. ``functools.partial(CrashOnce, path)`` is the picklable ``callback_factory``."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def __call__(self, kind: str, record: dict) -> None:
        if not self.path.exists():
            self.path.write_text("crashed")
            CrashInNativeCode()(kind, record)
