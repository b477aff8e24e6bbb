"""One training run, the same code in every process: a plain run, a torchrun rank, or a launched worker.

``run_job(job)`` sets up the runtime on this rank's device, joins the process group when there are several
ranks, checks that no machine of a CPU run holds more of them than it has cores
(:func:`refuse_more_ranks_than_cores`) and that every rank holds the same tokenized data
(:func:`check_same_data`), builds the model,
checks the output storage (rank 0), trains, and returns :class:`JobResult` on rank 0
(``None`` elsewhere). Only rank 0 calls the loop callbacks (live MLflow metrics).

``run_torchrun_rank(job, rank)`` is ``run_job`` for a rank started by torchrun, whose process is its own: a
rank whose peer process ended (killed by the out-of-memory killer or kill -9) fails in its next collective on
the backend's words ("Connection reset by peer"), a plain RuntimeError; it ends as :class:`PeerLostError`,
one line saying what happened and how to continue (launched workers are named by their launcher instead,
``launch.workers``).

Kedro-free: the train node builds the :class:`TrainJob` from catalog inputs and parameters.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

from fastlm.engine.batching import loader_settings
from fastlm.engine.checkpoint.discovery import latest_checkpoint
from fastlm.engine.checkpoint.storage import check_training_storage
from fastlm.engine.config import TrainParams
from fastlm.engine.data import TextEnds, pad_id_of
from fastlm.engine.data.arrow_identity import content_of, split_identity
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.distributed.parallel import (
    Collectives,
    RankInfo,
    connect,
    full_state_dicts,
    is_sharded,
    lost_peer,
    rank_device,
)
from fastlm.engine.model.build import build_model, model_attention
from fastlm.engine.model.lora import load_trained_weights, trains_part_only
from fastlm.engine.observe.metrics import device_memory_mb
from fastlm.engine.runtime.environment import (
    RuntimeConfig,
    cpu_affinity,
    cpu_quota,
    setup_runtime,
    usable_cpu_count,
)
from fastlm.engine.train.loop import train
from fastlm.errors import ConfigError, FastlmError, StaleDataError, exception_chain

log = logging.getLogger(__name__)


@dataclass
class TrainJob:
    """Everything a rank needs; picklable (a memory-mapped ``datasets`` split pickles as its file paths)."""

    params: TrainParams
    max_length: int
    train_split: object  # datasets.Dataset (or anything TokenSequences.from_arrow reads)
    eval_split: object | None
    tokenizer: object
    model_dir: str  # where the final model is saved (checked for room before training)
    extra_summary: dict = field(default_factory=dict)
    runtime_choices: str | None = None  # the precisions measured before (engine.runtime.remembered)
    # {"train", "validation"}: each split's ``data.arrow_identity.split_identity`` as the launcher held it,
    # which a launched worker compares with the split it unpickled (``launch.workers.read_job``); None: none
    data_identity: dict | None = None


def expected_log_records(params: TrainParams) -> int | None:
    """Metric records a run's history will hold (train and evaluation), when ``max_steps`` fixes the
    length."""
    steps = params.max_steps
    if steps is None:
        return None
    return steps // params.log_every + 2 + (steps // params.eval_every + 1 if params.eval_every else 0)


@dataclass
class JobResult:
    model: object
    history: list[dict]
    eval_history: list[dict]
    summary: dict


def splits_identity(job: TrainJob) -> dict:
    """Each split of ``job`` as this process holds it (``data.arrow_identity.split_identity``)."""
    splits = {"train": job.train_split, "validation": job.eval_split}
    return {name: split_identity(split) for name, split in splits.items() if split is not None}


def check_same_data(job: TrainJob, comm: Collectives) -> None:
    """Refuse (StaleDataError, on every rank, one line naming the ranks and the fix) a run whose ranks do not
    all hold rank 0's tokenized data: each split's rows and sampled digest (``data.arrow_identity``), one
    gather over the gloo group at the start of the run.

    Ranks started on their own (torchrun, one node or several) each load the data themselves: a split run
    that wrote it again between two ranks' loads, or a node whose copy of ``data/`` is stale, leaves them
    training on other rows, each checked against its own, and DDP averaging gradients of two datasets while
    rank 0 records its own data. Launched workers (``nproc_per_node``) all opened the splits of one job and
    checked them against the launcher's record (``launch.workers.read_job``): theirs is that record, no split
    read twice. One process: nothing to compare."""
    if comm.world_size == 1:
        return
    identity = job.data_identity if job.data_identity is not None else splits_identity(job)
    held = comm.gather_host({name: content_of(split) for name, split in identity.items()})
    others = [rank for rank, theirs in enumerate(held) if theirs != held[0]]
    if not others:
        return
    first, what = held[others[0]], "other tokens"
    for name, mine in held[0].items():
        theirs = first.get(name)
        if theirs is None or theirs["rows"] != mine["rows"]:
            rows = "no" if theirs is None else theirs["rows"]
            what = f"a {name} split of {rows} rows, rank 0's {mine['rows']}"
            break
    who = f"rank {others[0]} holds" if len(others) == 1 else f"ranks {', '.join(map(str, others))} hold"
    raise StaleDataError(
        f"the {comm.world_size} ranks of this run do not hold the same tokenized data: {who} other data than "
        f"rank 0 (rank {others[0]}: {what}); trained together, their gradients would be averaged over "
        f"different datasets.",
        fix="let a running split (`kedro run --pipeline=split`) finish, or run it once and give every node "
        "the same data/05_model_input (a shared filesystem or one copy), then start the training again.",
    )


def refuse_more_ranks_than_cores(comm: Collectives, device_type: str) -> None:
    """One line, on every rank, where a machine of a CPU run holds more of its ranks than usable cores (the
    union of its ranks' affinity masks, capped by a container's CPU quota): two processes sharing a core
    wait for one another at every step's collectives, slower than fewer processes. The launcher refuses
    ``train.distributed.nproc_per_node`` so (``launch.workers.refuse_more_workers_than_cores``); a rank of
    torchrun (``--nproc-per-node=4`` on 2 cores) or of any other launcher is checked here. The ranks are
    grouped by host name, so the ranks of other nodes do not count against this one's cores; every rank
    judges the same gathered records, so all refuse or none (a rank going on alone would wait at its next
    collective until the timeout). A run on GPUs runs a process per GPU (``rank_device``)."""
    if comm.world_size == 1 or device_type != "cpu":
        return
    held = comm.gather_host(
        {"host": socket.gethostname(), "cpus": sorted(cpu_affinity()), "quota": cpu_quota()}
    )
    hosts: dict[str, dict] = {}
    for record in held:
        host = hosts.setdefault(record["host"], {"ranks": 0, "cpus": set(), "quotas": []})
        host["ranks"] += 1
        host["cpus"] |= set(record["cpus"])
        host["quotas"] += [record["quota"]] if record["quota"] is not None else []
    for name, host in hosts.items():
        cores = max(1, min([len(host["cpus"]), *host["quotas"]]))
        if host["ranks"] <= cores:
            continue
        raise ConfigError(
            f"{host['ranks']} processes of this CPU run are on host {name}, which has {cores} usable CPU "
            "cores: each process needs a core of its own (processes sharing a core wait for one another at "
            "every step, slower than fewer processes).",
            fix=f"start at most {cores} processes on it (torchrun --nproc-per-node={cores}, or "
            f"train.distributed.nproc_per_node: {cores}); raise train.batching.gradient_accumulation_steps "
            "to keep the effective batch.",
        )


def run_job(job: TrainJob, rank: RankInfo | None = None, *, callbacks=()) -> JobResult | None:
    """Train on this rank; ``rank`` None = one process. Returns the result on rank 0, None on the others."""
    params = job.params
    world = rank.world_size if rank is not None else 1
    runtime_config = params.runtime.model_dump()
    if rank is not None and world > 1:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        runtime_config["device"] = rank_device(
            runtime_config["device"], rank, local_world=local_world, backend=params.distributed.backend
        )
        if runtime_config["num_threads"] is None:  # the ranks on one machine share its cores
            runtime_config["num_threads"] = max(1, usable_cpu_count() // min(local_world, usable_cpu_count()))
    runtime = setup_runtime(RuntimeConfig(**runtime_config, seed=params.seed), measured_later=True)
    comm = connect(rank, params.distributed.backend, runtime.device, params.distributed.timeout_s)
    try:
        refuse_more_ranks_than_cores(comm, runtime.device.type)
        check_same_data(job, comm)
        attn = model_attention(
            params.model,
            runtime.device,
            runtime.precision,
            row_length=params.batching.longest_row(job.max_length),
        )
        model = build_model(params.model, job.tokenizer, max_length=job.max_length, attn_implementation=attn)
        if comm.is_main:
            check_training_storage(
                model,
                checkpoint_dir=Path(params.checkpoint_dir),
                model_dir=Path(job.model_dir),
                keep_last=params.keep_last,
                saves_checkpoints=params.save_every is not None,
                tokenizer=job.tokenizer,
                log_records=expected_log_records(params),
            )
        ends = TextEnds.of(job.tokenizer)  # an encoder-decoder model's rows get the tokenizer's ends back
        train_set = TokenSequences.from_arrow(job.train_split, text_ends=ends)
        eval_set = (
            TokenSequences.from_arrow(job.eval_split, text_ends=ends) if job.eval_split is not None else None
        )
        result = train(
            model,
            train_set,
            eval_set,
            params=params,
            runtime=runtime,
            pad_id=pad_id_of(job.tokenizer),
            max_length=job.max_length,
            attn=attn,
            callbacks=callbacks if comm.is_main else (),
            comm=comm,
            runtime_choices=Path(job.runtime_choices) if job.runtime_choices else None,
        )
        if is_sharded(result.model):  # FSDP2: gather the whole weights into a plain model on rank 0
            # LoRA: the adapters alone, into a model built again over its base (read from name_or_path)
            adapters = trains_part_only(result.model)
            whole, _ = full_state_dicts(result.model, None, trainable_only=adapters)
            if comm.is_main:
                result.model = build_model(
                    params.model, job.tokenizer, max_length=job.max_length, attn_implementation=attn
                )
                if adapters:
                    load_trained_weights(result.model, whole)
                else:
                    result.model.load_state_dict(whole)
    finally:
        comm.close()
    if not comm.is_main:
        return None
    summary = {
        **result.summary,
        "attention": attn,
        **job.extra_summary,
        "micro_batch_size": params.batching.micro_batch_size,
        "gradient_accumulation_steps": params.batching.gradient_accumulation_steps,
        **(
            {
                key: result.summary["oom_backoffs"][-1][key]  # what the run ended with after an OOM back-off
                for key in ("micro_batch_size", "gradient_accumulation_steps")
            }
            if result.summary.get("oom_backoffs")
            else {}
        ),
        "distributed_strategy": params.distributed.strategy if world > 1 else "none",
        "dataloader_workers": loader_settings(params, runtime.device)["num_workers"],
        "train_samples": len(train_set),
        # the epoch's real tokens as the steps count them (an encoder-decoder's rows get ends around its ids)
        "train_tokens": result.summary.get("train_tokens", train_set.num_tokens),
        "device_memory_mb": device_memory_mb(runtime.device),
        "runtime": (result.runtime or runtime).describe(),
    }
    return JobResult(result.model, result.history, result.eval_history, summary)


class PeerLostError(FastlmError):
    """A torchrun rank's collective failed because another rank's process ended: the user looks for why
    that one ended and runs the training again, which resumes from its last checkpoint."""


def _peer_lost(job: TrainJob, rank: RankInfo, words: str) -> PeerLostError:
    """The line of ``rank``, whose collective failed on ``words`` (the backend's): the peer it lost, and how
    to continue (the last checkpoint, where this node holds one: rank 0's)."""
    params = job.params
    if rank.world_size == 2:
        what = f"its peer rank {1 - rank.rank}: the other process ended (killed?)"
    else:
        what = "its peer rank(s): another rank's process ended (killed?)"
    if params.save_every is None:
        resume = "the run starts over (train.save_every is null: no checkpoint is saved)"
    else:
        latest = latest_checkpoint(Path(params.checkpoint_dir))
        last = "the last checkpoint" + (f" ({latest})" if latest is not None else "")
        resume = (
            f"train.resume: auto continues from {last}"
            if params.resume == "auto"
            else f"with train.resume: auto (it is {params.resume!r} now) it continues from {last}"
        )
    return PeerLostError(
        f"rank {rank.rank} of {rank.world_size} lost {what} while this one waited for it in a collective "
        f"({words}); this rank stopped too.",
        fix="look for why that process ended (its own output; the out-of-memory killer: `dmesg | grep -i "
        f"oom` or `journalctl -k`), then run the same torchrun command again; {resume}.",
    )


def run_torchrun_rank(job: TrainJob, rank: RankInfo, *, callbacks=()) -> JobResult | None:
    """``run_job`` on a rank torchrun started, a lost peer (module docstring) raised as :class:`PeerLostError`
    from the backend's error, which was a traceback of some 280 lines.

    A stop signal or Ctrl-C that reached the rank while it unwound that error is the lost peer too: torchrun's
    agent sends SIGTERM to the ranks left once it sees one end, and that one is not the user's. From then on
    this process ignores SIGTERM, so that it ends with its line and its MLflow run FAILED (the CLI's own
    handler would have ended it as stopped by SIGTERM, its default silently, status -15) within the agent's
    shutdown timeout, after which the agent kills it anyway."""
    try:
        return run_job(job, rank, callbacks=callbacks)
    except BaseException as error:
        peer_error = next((link for link in exception_chain(error) if lost_peer(link)), None)
        if rank.world_size < 2 or peer_error is None:
            raise
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise _peer_lost(job, rank, lost_peer(peer_error)) from peer_error
