"""The packed-attention check shared by the tests of ``attention.inputs`` and ``attention.kernels``: a tiny
Llama, samples of unequal lengths packed by the real engine path, each sample's logits and loss run alone, a
forward hook recording the logits of every sample the model saw, and a causal attention reference."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from fastlm.engine.config import parse_train_params
from fastlm.engine.data.token_dataset import TokenSequences
from tests.support.tolerances import OTHER_FP32_KERNEL, OTHER_FP32_MODEL

VOCAB, PAD, EOS = 96, 0, 2
ROW = 24
LENGTHS = [7, 13, 3, 20, 9, 2, 16, 11, 5, 14, 8, 6]


def make_samples() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    samples = [rng.integers(3, VOCAB, size=n) for n in LENGTHS]
    for ids in samples:
        ids[-1] = EOS
    return samples


SAMPLES = make_samples()


def packed_dataset() -> TokenSequences:
    offsets = np.concatenate([[0], np.cumsum(LENGTHS)])
    return TokenSequences(np.concatenate(SAMPLES), offsets)


def packed_model(attn: str) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=PAD,
        eos_token_id=EOS,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.config.use_cache = False
    # CUDA kernels are absent here: switch after the build (transformers checks the package at build time).
    model.config._attn_implementation = attn
    return model


def packed_params(tmp_path, rows: int = 4, **overrides):
    raw = {
        "batching": {"mode": "packed", "micro_batch_size": rows},
        "runtime": {"device": "cpu", "precision": "fp32"},
        "max_steps": 1,
        "eval_every": None,
        "save_every": None,
        "log_every": 1,
        "quiet": True,
        "dataloader": {"num_workers": 0},
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "optimizer": {"warmup_steps": 0},
        **overrides,
    }
    return parse_train_params(raw)


class Recorder:
    """Forward hook: the logits of every sample the model saw, found from the restarting position ids."""

    def __init__(self, model):
        self.seen: dict[tuple, torch.Tensor] = {}
        self.shapes: list[tuple] = []
        self.handle = model.register_forward_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs, output):
        ids, positions = kwargs["input_ids"], kwargs["position_ids"].expand_as(kwargs["input_ids"])
        self.shapes.append(tuple(ids.shape))
        # a copy: the training loss writes its gradient over the logits (accumulation.accumulate_gradients)
        logits = output.logits.detach().clone()
        keep = kwargs.get("logits_to_keep")
        if isinstance(keep, torch.Tensor):  # training: logits only where a label is predicted; NaN elsewhere
            full = torch.full((ids.numel(), logits.shape[-1]), math.nan)
            full[keep.reshape(-1).nonzero().flatten() if keep.dtype == torch.bool else keep.reshape(-1)] = (
                logits.reshape(-1, logits.shape[-1])
            )
            logits = full
        logits = logits.reshape(*ids.shape, -1)
        for row in range(ids.shape[0]):
            starts = (positions[row] == 0).nonzero().flatten().tolist() + [ids.shape[1]]
            for begin, end in zip(starts[:-1], starts[1:], strict=True):
                self.seen[tuple(ids[row, begin:end].tolist())] = logits[row, begin:end]


# The mean evaluation loss through another kernel or layout: logit differences of ~1e-6 shift each token's
# log-softmax by as much and average out over the tokens; a leak between packed samples moves it far more.
MEAN_LOSS_RTOL = OTHER_FP32_KERNEL["rtol"]


def check_samples(recorder: Recorder, reference_logits: dict, expected: int) -> None:
    matched = [key for key in recorder.seen if key in reference_logits]
    assert len(matched) == expected, "the packed batches did not hold the samples"
    for key in matched:
        got = recorder.seen[key]
        computed = ~got.isnan().any(dim=-1)  # a training step computes no logit for a sample's last token
        assert int(computed.sum()) in (len(key), len(key) - 1) and bool(computed[:-1].all())
        # a whole tiny model through another attention kernel and layout (per-op differences over the layers)
        torch.testing.assert_close(
            got[computed],
            reference_logits[key][computed],
            **OTHER_FP32_MODEL,
            msg=lambda m, key=key: f"sample of {len(key)} tokens sees its neighbours: {m}",
        )


def causal_attention(q, k, v, scale, causal):
    """q [L, H, D], k/v [L, Hkv, D] -> [L, H, D]."""
    groups = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(groups, dim=1) for x in (k, v))
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=causal, scale=scale
    )
    return out.transpose(0, 1)


def reference_outputs() -> tuple[dict, dict]:
    """Each sample alone (batch of one, no mask, no padding): its logits and summed loss."""
    model = packed_model("eager").eval()
    logits, losses = {}, {}
    with torch.no_grad():
        for ids in SAMPLES:
            out = model(input_ids=torch.as_tensor(ids)[None]).logits[0]
            logits[tuple(ids.tolist())] = out
            losses[tuple(ids.tolist())] = F.cross_entropy(out[:-1], torch.as_tensor(ids[1:]), reduction="sum")
    return logits, losses
