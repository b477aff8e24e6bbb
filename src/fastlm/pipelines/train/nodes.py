"""Node of the train pipeline: adapt parameters and catalog entries to the engine; nothing else."""

from __future__ import annotations

import logging
from pathlib import Path

import datasets
import pandas as pd

from fastlm.corpus.fingerprint import check_fresh
from fastlm.corpus.params import parse_split_params
from fastlm.engine.config import parse_train_params
from fastlm.engine.data import pad_id_of
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.loop import loader_settings, train
from fastlm.engine.metrics import device_memory_mb
from fastlm.engine.model import build_model, choose_attention
from fastlm.engine.runtime import RuntimeConfig, setup_runtime
from fastlm.tracking import MlflowMetrics, active_run_id

log = logging.getLogger(__name__)
TOKENIZED = "data/05_model_input/tokenized_corpus"
TUNED = "conf/local/parameters_tuned.yml"


def train_model(tokenized: datasets.DatasetDict, fingerprint: dict, tokenizer, train_params: dict,
                split_params: dict) -> tuple[dict, pd.DataFrame, pd.DataFrame, dict]:
    """Train on the tokenized splits; return the model+tokenizer, metric histories and the run summary."""
    params = parse_train_params(train_params)
    max_length = parse_split_params(split_params).max_length
    check_fresh(fingerprint, tokenizer, max_length, where=TOKENIZED)
    if Path(TUNED).is_file():
        log.info("%s is in effect (from `kedro run --pipeline=tune`): micro_batch_size=%d, "
                 "gradient_accumulation_steps=%d; delete it to go back to conf/base", TUNED,
                 params.batching.micro_batch_size, params.batching.gradient_accumulation_steps)
    runtime = setup_runtime(RuntimeConfig(**params.runtime.model_dump(), seed=params.seed))
    attn = choose_attention(params.model.attn_implementation, runtime.device)
    model = build_model(params.model, tokenizer, max_length=max_length, attn_implementation=attn)
    train_set = TokenSequences.from_arrow(tokenized["train"])
    eval_set = TokenSequences.from_arrow(tokenized["validation"]) if len(tokenized["validation"]) else None
    tracker = MlflowMetrics()
    tracker.log_params({f"runtime.{key}": value for key, value in runtime.describe().items()})
    result = train(model, train_set, eval_set, params=params, runtime=runtime, pad_id=pad_id_of(tokenizer),
                   max_length=max_length, attn=attn, callbacks=[tracker])
    summary = {**result.summary, "attention": attn, "fingerprint": fingerprint["fingerprint"],
               "micro_batch_size": params.batching.micro_batch_size,
               "gradient_accumulation_steps": params.batching.gradient_accumulation_steps,
               "dataloader_workers": loader_settings(params, runtime.device)["num_workers"],
               "train_samples": len(train_set), "train_tokens": train_set.num_tokens,
               "device_memory_mb": device_memory_mb(runtime.device), "mlflow_run_id": active_run_id(),
               "runtime": runtime.describe()}
    log.info("Trained %d steps in %.1fs: train loss %.4f, validation loss %s", summary["steps"],
             summary["wall_time_s"], summary["final_train_loss"], summary["final_val_loss"])
    return ({"model": result.model, "tokenizer": tokenizer}, pd.DataFrame(result.history),
            pd.DataFrame(result.eval_history), summary)
