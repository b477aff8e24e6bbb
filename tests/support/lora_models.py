"""The LoRA set-up of the model tests (tests/engine/model: test_lora.py, test_adapter_folder.py, and the
fixtures of their conftest): the length their tiny Llama's prompt/summary pairs are cut at, the
``train.model`` parameters of a small LoRA over a base folder, train parameters around them, and a run."""

from __future__ import annotations

from fastlm.engine.config import parse_train_params
from fastlm.engine.model.build import build_model
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from fastlm.engine.train.loop import train

MAX_LENGTH = 48


def model_params(base_dir, **lora_overrides):
    return {
        "name_or_path": str(base_dir),
        "lora": {"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0, **lora_overrides},
    }


def train_params(tmp_path, base_dir, **overrides):
    raw = {
        "model": model_params(base_dir),
        "batching": {"mode": "packed", "micro_batch_size": 4},
        "optimizer": {"lr": 2e-2, "warmup_steps": 1},
        "max_steps": 8,
        "log_every": 2,
        "eval_every": None,
        "save_every": 4,
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "quiet": True,
        "runtime": {"device": "cpu", "precision": "fp32"},
        **overrides,
    }
    return parse_train_params(raw)


def run_train(params, tokenizer, pairs, eval_pairs=None, model=None):
    """``train`` with ``params`` on ``pairs``: ``model``, else a fresh one built from ``params.model``."""
    runtime = setup_runtime(RuntimeConfig(**params.runtime.model_dump(), seed=0))
    if model is None:
        model = build_model(params.model, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    return train(
        model,
        pairs,
        eval_pairs,
        params=params,
        runtime=runtime,
        pad_id=tokenizer.eos_token_id,
        max_length=MAX_LENGTH,
        attn="sdpa",
    )
