"""The engine tests' toy setting: learnable token data, a tiny Llama, train parameters and one training run
(CPU, one thread, no checkpoints unless asked for)."""

from __future__ import annotations

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from fastlm.engine.config import parse_train_params
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.runtime.environment import setup_runtime
from fastlm.engine.train.loop import train

VOCAB, EOS = 64, 1


def toy_sequences(n: int, seed: int) -> TokenSequences:
    """Learnable toy data: arithmetic progressions mod VOCAB, heavy-tailed lengths, EOS last."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        length = int(min(48, 2 + rng.lognormal(2.0, 0.7)))
        start, stride = rng.integers(2, VOCAB), rng.integers(1, 4)
        rows.append([(start + stride * k) % (VOCAB - 2) + 2 for k in range(length - 1)] + [EOS])
    lengths = np.array([len(r) for r in rows])
    return TokenSequences(np.concatenate(rows), np.concatenate([[0], np.cumsum(lengths)]))


def toy_model(seed: int = 0, attn: str = "sdpa", *, tied: bool = False) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        eos_token_id=EOS,
        pad_token_id=EOS,
        attn_implementation=attn,
        use_cache=False,
        tie_word_embeddings=tied,
    )
    return LlamaForCausalLM(config)


def toy_params(tmp_path, **overrides):
    raw = {
        "batching": {"mode": "packed", "micro_batch_size": 4},
        "optimizer": {"lr": 1e-2, "warmup_steps": 2},
        "max_steps": 30,
        "log_every": 5,
        "eval_every": 15,
        "save_every": None,
        "quiet": True,
        "checkpoint_dir": str(tmp_path / "checkpoints"),
        "resume": "never",
        "runtime": {"device": "cpu", "num_threads": 1},
        "profile": {"enabled": False},
    }
    for key, value in overrides.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return parse_train_params(raw)


def run_toy(params, callbacks=(), seed=0, model=None, attn: str = "sdpa", runtime_choices=None):
    """``train`` on the toy data with ``model`` (default: ``toy_model(seed, attn)``) on the attention path
    ``attn``. bf16 runs take ``eager``: on a machine with AMX, torch's CPU flash attention packs bf16 operands
    for AMX and refuses to where ``ATEN_CPU_CAPABILITY`` forces a kernel set below AVX-512 (the CI's check of
    other CPUs)."""
    runtime = setup_runtime(params.runtime, seed=params.seed)
    return train(
        model if model is not None else toy_model(seed, attn),
        toy_sequences(300, 1),
        toy_sequences(40, 2),
        params=params,
        runtime=runtime,
        pad_id=EOS,
        max_length=64,
        attn=attn,
        callbacks=callbacks,
        runtime_choices=runtime_choices,
    )


def poisoned_model(after_step: int):
    """A model whose embeddings turn NaN once a callback saw ``after_step``; returns (model, that
    callback)."""
    poisoned = {"on": False}

    def poison(kind, record):
        if record["step"] == after_step:
            poisoned["on"] = True

    model = toy_model()
    model.model.embed_tokens.register_forward_hook(
        lambda m, i, out: out * float("nan") if poisoned["on"] else out
    )
    return model, poison
