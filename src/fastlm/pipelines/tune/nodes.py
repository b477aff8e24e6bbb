"""Node of the tune pipeline: measure the ladder with the user's model, data and settings; choose; explain.
The engine (torch, transformers) is imported when the node runs: building the pipelines, as every `kedro
run` does, imports neither (tests/test_project.py)."""

from __future__ import annotations

import functools
import logging

import datasets
import pandas as pd

from fastlm.corpus.fingerprint import data_identity
from fastlm.engine.config import train_processes
from fastlm.parameters import parse_group
from fastlm.pipelines.start import start_node
from fastlm.pipelines.tune import record
from fastlm.tracking import RunTracker

log = logging.getLogger(__name__)


def tune_micro_batch(
    tokenized: datasets.DatasetDict,
    fingerprint: dict,
    tokenizer,
    train_params: dict,
    split_params: dict,
    tune_params: dict,
    paths: dict | None = None,
    tracker: RunTracker | None = None,
):
    """Trials table, chosen settings (with the explanation), a plot, and the parameters for train
    (``tuned_parameters``, named in messages by its path from ``paths``). Each trial and the choice go to
    ``tracker`` (``run_tracker``), also when no size fits."""
    from fastlm.engine.data import TextEnds, pad_id_of
    from fastlm.engine.data.token_dataset import TokenSequences
    from fastlm.engine.model.build import build_model, model_attention
    from fastlm.engine.model.recompute import enable_checkpointing
    from fastlm.engine.observe.metrics import device_memory_mb
    from fastlm.engine.train import tune
    from fastlm.reporting.plots import tune_figure

    start = start_node(
        train_params,
        split_params,
        fingerprint=fingerprint,
        tokenizer=tokenizer,
        tokenized=tokenized,
        paths=paths,
    )
    params, runtime, max_length = start.train, start.runtime, start.split.max_length
    settings = parse_group("tune", tune_params)
    tuned_file = (paths or {}).get("tuned_parameters", "tuned_parameters")
    attn = model_attention(
        params.model, runtime.device, runtime.precision, row_length=params.batching.longest_row(max_length)
    )
    model = build_model(params.model, tokenizer, max_length=max_length, attn_implementation=attn)
    limit = tune.memory_budget_mb(
        runtime.device, settings.memory_limit_gb, total_mb=device_memory_mb(runtime.device)
    )
    graphs = params.runtime.compile_mode == "reduce-overhead"  # CUDA graphs: packed, no recompute
    modes, modes_left_out = tune.modes_to_measure(
        settings.modes or [params.batching.mode], params.runtime.compile_mode
    )
    ladder_settings = tune.LadderSettings(
        warmup=settings.warmup_steps,
        timed=settings.timed_steps,
        sizes=tune.ladder(settings.min_micro_batch_size, settings.max_micro_batch_size),
        memory_limit_mb=limit,
        headroom=settings.memory_headroom,
        cliff_tolerance=settings.cliff_tolerance,
        deadline=tune.deadline_after(settings.max_minutes),
    )
    train_set = TokenSequences.from_arrow(tokenized["train"], text_ends=TextEnds.of(tokenizer))
    run_modes = functools.partial(
        tune.tune_modes,
        model,
        train_set,
        modes,
        params=params,
        runtime=runtime,
        pad_id=pad_id_of(tokenizer),
        max_length=max_length,
        attn=attn,
        settings=ladder_settings,
    )
    requested = params.model.gradient_checkpointing  # auto: more recompute is measured where memory stops it
    policies = tune.tune_checkpointing(
        run_modes,
        functools.partial(enable_checkpointing, model),
        requested,
        deadline=ladder_settings.deadline,
        cuda_graphs=graphs,
    )
    picked = tune.best_policy(policies) or policies[0]
    ladders = picked.ladders
    best = tune.best_mode(ladders)
    chosen = best.chosen if best else None
    current = params.batching.gradient_accumulation_steps
    # the accumulation is for the processes a training step spans (micro-batch x accumulation x processes)
    processes = train_processes(params.distributed.nproc_per_node)
    accumulation = (
        tune.mode_accumulation(best, settings.target_effective_batch, current=current, world_size=processes)
        if best
        else current
    )
    explanation = tune.explain_modes(
        ladders,
        best,
        current_accumulation=current,
        target=settings.target_effective_batch,
        world_size=processes,
        headroom=settings.memory_headroom,
        memory_limit_mb=limit,
    )
    explanation = " ".join(
        filter(None, [explanation, tune.explain_checkpointing(policies, picked), modes_left_out])
    )
    log.info("Tune: %s", explanation)
    table = pd.DataFrame(
        [
            {"mode": ladder.mode, "gradient_checkpointing": result.policy, **trial.as_row()}
            for result in policies
            for ladder in result.ladders
            for trial in ladder.trials
        ]
    )
    tracker = tracker if tracker is not None else RunTracker()
    for result in policies:
        for ladder in result.ladders:
            for trial in ladder.trials:
                tracker.record(
                    f"tune_{ladder.mode}" + (f"_{result.policy}" if len(policies) > 1 else ""),
                    {
                        "step": trial.micro_batch_size,
                        "real_tokens_per_s": trial.real_tokens_per_s,
                        "peak_memory_mb": trial.peak_memory_mb,
                    },
                )
    choice = {
        "mode": best.mode if best else None,
        "micro_batch_size": chosen.micro_batch_size if chosen else None,
        "trials": len(table),
        "gradient_accumulation_steps": accumulation,
        "processes": processes,
        "device": str(runtime.device),
        "memory_limit_mb": limit,
        "gradient_checkpointing": picked.policy,
        "explanation": explanation,
    }
    tracker.log_params({f"tune.chosen.{k}": v for k, v in choice.items() if k != "explanation"})
    if chosen is None:
        raise tune.no_fit_error(
            policies,
            min_size=settings.min_micro_batch_size,
            headroom=settings.memory_headroom,
            memory_limit_mb=limit,
            tuned_file=tuned_file,
            limit_gb=settings.memory_limit_gb,
        )
    tuned = {
        "train": {
            "batching": {
                "mode": best.mode,
                "micro_batch_size": chosen.micro_batch_size,
                "gradient_accumulation_steps": accumulation,
            }
        }
    }
    if requested == "auto":  # the policy measured fastest replaces auto in train
        tuned["train"]["model"] = {"gradient_checkpointing": picked.policy}
    # train applies the file only to runs on these settings (fastlm.hooks.conf.TunedParametersHook)
    tuned[record.RECORD_KEY] = record.measured_on(
        params,
        max_length=max_length,
        data=data_identity(fingerprint),
        device=record.device_description(str(runtime.device)),
        # under a limit the file is for a card of this kind with that much memory, not this card alone
        memory_limit_gb=settings.memory_limit_gb,
        float8_cores=record.float8_tensor_cores(str(runtime.device)) if settings.memory_limit_gb else None,
    )
    # a train run on another process count divides the accumulation to keep the target (hooks.conf)
    tuned[record.ACCUMULATION_KEY] = record.accumulation_record(
        processes, settings.target_effective_batch, chosen.samples_per_micro_batch
    )
    log.info(
        "Writing %s: train.batching.mode=%s, micro_batch_size=%d, gradient_accumulation_steps=%d for %d "
        "process(es) (train runs in the default environment on the settings measured pick them up; delete "
        "the file to go back to conf/base)",
        tuned_file,
        best.mode,
        chosen.micro_batch_size,
        accumulation,
        processes,
    )
    shown = table[table["gradient_checkpointing"] == picked.policy]  # the chosen policy's ladders
    figure = tune_figure(shown, chosen.micro_batch_size, ok=tune.OK, chosen_mode=best.mode)
    return table, choice, figure, tuned
