"""Node of the train pipeline: adapt parameters and catalog entries to the engine; nothing else. The engine
(torch, transformers) is imported when the node runs: building the pipelines, as every `kedro run` does,
imports neither (tests/test_project.py)."""

from __future__ import annotations

import functools
import logging
import uuid
from pathlib import Path

import datasets
import pandas as pd

from fastlm.corpus.fingerprint import data_folds, data_identity, folds_mismatch, identity_of_test_split
from fastlm.corpus.prompts import tokenizer_as_trained
from fastlm.pipelines.start import start_node
from fastlm.redaction import redact
from fastlm.reporting.summaries import TRAINING_ID, end_of_run_losses
from fastlm.runs import default_run_name, validate_run_name
from fastlm.tracking import RunTracker

log = logging.getLogger(__name__)


def train_model(
    tokenized: datasets.DatasetDict,
    fingerprint: dict,
    tokenizer,
    train_params: dict,
    split_params: dict,
    run_name: str | None = None,
    paths: dict | None = None,
    tracker: RunTracker | None = None,
    choices_dir: str | None = None,
) -> tuple[dict, pd.DataFrame, pd.DataFrame, dict]:
    """Train on the tokenized splits (in this process, as a torchrun rank, or in launched workers); return the
    model+tokenizer, metric histories and the run summary.

    Checkpoints go to ``<train.checkpoint_dir>/<run_name>/`` (the name the hooks resolved for this run).
    ``paths`` (``dataset_paths``) names the tokenized data in a freshness error and gives the folder the model
    is saved to (``trained_model``), whose disk space the engine checks before training; a caller that saves
    no model through the catalog (the sweep) has room for it counted on the checkpoint disk. ``tracker``
    (``run_tracker``) gets the live metrics and the finished run; without one, a tracker of its own.
    ``choices_dir``: where the measured runtime choices are kept (default ``train.checkpoint_dir``; a
    sweep's runs keep theirs with the plain runs').
    """
    from fastlm.engine.data.folds import fold_splits
    from fastlm.engine.distributed.parallel import launch_mode, rank_from_env
    from fastlm.engine.launch.job import TrainJob, run_job, run_torchrun_rank
    from fastlm.engine.launch.workers import launch_workers
    from fastlm.engine.model.lora import adapter_description, parameter_counts
    from fastlm.engine.runtime.remembered import CHOICES_FILE

    # the engine applies the runtime per rank
    start = start_node(
        train_params,
        split_params,
        fingerprint=fingerprint,
        tokenizer=tokenizer,
        tokenized=tokenized,
        paths=paths,
        runtime=False,
    )
    run_name = validate_run_name(run_name) if run_name is not None else default_run_name(["train"])
    params = start.train.model_copy(
        update={"checkpoint_dir": str(Path(start.train.checkpoint_dir) / run_name)}
    )
    max_length = start.split.max_length
    if params.fold is not None and folds_mismatch(fingerprint, start.split.folds):  # the data's folds win
        log.warning("%s", folds_mismatch(fingerprint, start.split.folds))
    train_split, eval_split = fold_splits(tokenized, params.fold, data_folds(fingerprint))  # train.fold
    job = TrainJob(
        params=params,
        max_length=max_length,
        train_split=train_split,
        eval_split=eval_split if len(eval_split) else None,
        tokenizer=tokenizer,
        model_dir=(paths or {}).get("trained_model", params.checkpoint_dir),
        extra_summary={
            "fingerprint": data_identity(fingerprint),
            # the test split alone: a fold run's is a plain split's of the same texts (test figures compare)
            "test_data": identity_of_test_split(fingerprint, tokenized["test"])
            if "test" in tokenized
            else None,
            **(
                {"fold": params.fold, "folds": data_folds(fingerprint), "validation_samples": len(eval_split)}
                if params.fold is not None
                else {}
            ),
        },
        # precision auto on a CPU: measured once per machine, model and micro-batch shape (run to run alike)
        runtime_choices=str(Path(choices_dir or start.train.checkpoint_dir) / CHOICES_FILE),
    )
    mode = launch_mode(params.distributed.nproc_per_node)
    tracker = tracker if tracker is not None else RunTracker()
    if mode == "spawn":
        result = launch_workers(
            job,
            params.distributed.nproc_per_node,
            monitor_interval_s=params.distributed.monitor_interval_s,
            start_method=params.distributed.start_method,
            build_model=functools.partial(_untrained_model, params, tokenizer, max_length),
            callback_factory=tracker.worker_callback_factory(),
        )
    elif mode == "torchrun":  # a rank whose peer process ended says so in one line (PeerLostError)
        result = run_torchrun_rank(job, rank_from_env(), callbacks=tracker.callbacks())
    else:
        result = run_job(job, None, callbacks=tracker.callbacks())
    if result is None:  # a torchrun rank other than 0: rank 0 writes every output (see fastlm.rank_hooks)
        return {"model": None, "tokenizer": tokenizer}, pd.DataFrame(), pd.DataFrame(), {}
    summary = {
        "run_name": run_name,
        **result.summary,
        **parameter_counts(result.model),
        "lora": params.model.lora.enabled,
        "adapter": adapter_description(params.model.lora) if params.model.lora.enabled else None,
        "base_model": params.model.name_or_path,
        "checkpoint_dir": params.checkpoint_dir,
        "mlflow_run_id": tracker.run_id,
        "runtime": redact(result.summary["runtime"]),
        # one id for the summary and the model folder: the report refuses to mix two trainings' outputs
        TRAINING_ID: uuid.uuid4().hex,
    }
    tracker.training_finished(summary)
    resumed = (
        f" (resumed at step {summary['resumed_from_step']}, run at step {summary['steps']})"
        if summary.get("resumed_from")
        else ""
    ) + (f" on fold {params.fold} of {summary['folds']}" if params.fold is not None else "")
    log.info(
        "Run %s: trained %d steps%s in %.1fs on %d process(es): %s",
        run_name,
        summary["steps_trained"],
        resumed,
        summary["wall_time_s"],
        summary["world_size"],
        end_of_run_losses(summary),
    )
    # Without evaluations (eval_every: null) the table keeps its header: an empty CSV file cannot be read
    # back.
    evaluations = pd.DataFrame(
        result.eval_history, columns=None if result.eval_history else ["step", "val_loss"]
    )
    record = {  # how the data it was trained on was made: predict reads it (PretrainedModelDataset)
        "fingerprint": data_identity(fingerprint),
        "data_format": fingerprint["params"].get("data_format"),
        "max_length": max_length,  # its longest row: predict cuts prompts as its report does
        TRAINING_ID: summary[TRAINING_ID],
    }
    if fingerprint.get("system_prompt") is not None:  # every training chat's system turn: asked after it
        record["system_prompt"] = fingerprint["system_prompt"]
    # chats trained as role: content lines: the folder's chat template renders them so (plain transformers)
    saved = tokenizer_as_trained(tokenizer, record["data_format"])
    model = {"model": result.model, "tokenizer": saved, "training_data": record}
    return model, pd.DataFrame(result.history), evaluations, summary


def _untrained_model(params, tokenizer, max_length: int):
    """The model as the workers built it, on the CPU, to receive rank 0's trained weights."""
    import torch

    from fastlm.engine.model.build import build_model, model_attention

    attn = model_attention(
        params.model, torch.device("cpu"), row_length=params.batching.longest_row(max_length)
    )
    return build_model(params.model, tokenizer, max_length=max_length, attn_implementation=attn)
