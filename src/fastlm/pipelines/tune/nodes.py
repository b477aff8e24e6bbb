"""Node of the tune pipeline: measure the ladder with the user's model, data and settings; choose; explain."""

from __future__ import annotations

import logging

import datasets
import pandas as pd
from matplotlib.figure import Figure

from fastlm.corpus.fingerprint import check_fresh
from fastlm.corpus.params import parse_split_params
from fastlm.engine import tune
from fastlm.engine.config import parse_train_params
from fastlm.engine.data import pad_id_of
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.metrics import device_memory_mb
from fastlm.engine.model import build_model, choose_attention
from fastlm.engine.runtime import RuntimeConfig, setup_runtime
from fastlm.errors import ConfigError
from fastlm.pipelines.tune.params import parse_tune_params
from fastlm.tracking import MlflowMetrics

log = logging.getLogger(__name__)
TUNED_FILE = "conf/local/parameters_tuned.yml"


def tune_micro_batch(tokenized: datasets.DatasetDict, fingerprint: dict, tokenizer, train_params: dict,
                     split_params: dict, tune_params: dict):
    """Trials table, chosen settings (with the explanation), a plot, and the parameters file for train."""
    params, settings = parse_train_params(train_params), parse_tune_params(tune_params)
    split = parse_split_params(split_params)
    max_length = split.max_length
    check_fresh(fingerprint, tokenizer, split, where="data/05_model_input/tokenized_corpus")
    runtime = setup_runtime(RuntimeConfig(**params.runtime.model_dump(), seed=params.seed))
    attn = choose_attention(params.model.attn_implementation, runtime.device, runtime.precision)
    model = build_model(params.model, tokenizer, max_length=max_length, attn_implementation=attn)
    measure = tune.real_step_measurer(model, TokenSequences.from_arrow(tokenized["train"]), params=params,
                                      runtime=runtime, pad_id=pad_id_of(tokenizer), max_length=max_length,
                                      attn=attn, warmup=settings.warmup_steps, timed=settings.timed_steps)
    limit = device_memory_mb(runtime.device)
    trials = tune.run_ladder(measure, tune.ladder(settings.min_micro_batch_size, settings.max_micro_batch_size),
                             memory_limit_mb=limit, headroom=settings.memory_headroom,
                             cliff_tolerance=settings.cliff_tolerance)
    chosen = tune.choose(trials)
    accumulation = tune.accumulation_for(settings.target_effective_batch,
                                         chosen.micro_batch_size if chosen else 1,
                                         current=params.batching.gradient_accumulation_steps)
    explanation = tune.explain(trials, chosen, accumulation=accumulation, target=settings.target_effective_batch,
                               headroom=settings.memory_headroom, memory_limit_mb=limit)
    log.info("Tune: %s", explanation)
    table = pd.DataFrame([trial.as_row() for trial in trials])
    tracker = MlflowMetrics()
    for trial in trials:
        tracker("tune", {"step": trial.micro_batch_size, "real_tokens_per_s": trial.real_tokens_per_s,
                         "peak_memory_mb": trial.peak_memory_mb})
    choice = {"micro_batch_size": chosen.micro_batch_size if chosen else None, "trials": len(trials),
              "gradient_accumulation_steps": accumulation, "device": str(runtime.device),
              "memory_limit_mb": limit, "explanation": explanation}
    tracker.log_params({f"tune.chosen.{k}": v for k, v in choice.items() if k != "explanation"})
    if chosen is None:
        raise ConfigError(f"no micro-batch size from {settings.min_micro_batch_size} fit: {explanation}",
                          fix="free device memory, turn on train.model.gradient_checkpointing, or use a smaller "
                              "model; conf/local/parameters_tuned.yml was left as it was.")
    tuned = {"train": {"batching": {"micro_batch_size": chosen.micro_batch_size,
                                    "gradient_accumulation_steps": accumulation}}}
    log.info("Writing %s: train.batching.micro_batch_size=%d, gradient_accumulation_steps=%d (the train "
             "pipeline picks them up; delete the file to go back to conf/base)", TUNED_FILE,
             chosen.micro_batch_size, accumulation)
    return table, choice, tune_figure(trials, chosen), tuned


def tune_figure(trials, chosen) -> Figure:
    """Real tokens/s and peak memory against micro-batch size; the cliff (or OOM) and the choice marked."""
    figure = Figure(figsize=(7, 3.5), dpi=110)
    speed = figure.add_subplot()
    measured = [t for t in trials if t.real_tokens_per_s is not None]
    sizes = [t.micro_batch_size for t in measured]
    speed.plot(sizes, [t.real_tokens_per_s for t in measured], marker="o", color="tab:blue", label="real tokens/s")
    speed.set_xscale("log", base=2)
    speed.set_xlabel("micro-batch size")
    speed.set_ylabel("real tokens/s", color="tab:blue")
    memory = speed.twinx()
    memory.plot(sizes, [t.peak_memory_mb for t in measured], marker="s", color="tab:red", label="peak memory")
    memory.set_ylabel("peak memory (MB)", color="tab:red")
    for trial in trials:
        if trial.status != tune.OK:
            speed.axvline(trial.micro_batch_size, color="black", linestyle="--", linewidth=1)
            speed.annotate(trial.status, (trial.micro_batch_size, speed.get_ylim()[1]), fontsize=8, ha="right",
                           va="top", rotation=90)
    if chosen is not None:
        speed.plot([chosen.micro_batch_size], [chosen.real_tokens_per_s], marker="*", markersize=14,
                   color="tab:green", linestyle="none", label="chosen")
    speed.legend(loc="lower right", fontsize=8)
    speed.set_title("Throughput and memory against micro-batch size")
    figure.tight_layout()
    return figure
