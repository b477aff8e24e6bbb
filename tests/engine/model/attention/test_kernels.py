"""The attention functions of ``attention.kernels``: ``torch_varlen`` (PyTorch's ``varlen_attn`` under each
torch signature, half-precision inputs under autocast) and ``sdpa_varlen`` (length buckets, one causal SDPA
call each), checked through the packed evaluation path against each sample run alone, or op by op."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fastlm.engine.evaluate.evaluation import evaluate
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from tests.support.packed_attention import (
    LENGTHS,
    MEAN_LOSS_RTOL,
    PAD,
    ROW,
    SAMPLES,
    Recorder,
    causal_attention,
    check_samples,
    packed_dataset,
    packed_model,
    packed_params,
)
from tests.support.tolerances import BF16_MODEL_LOSS_REL, OTHER_FP32_KERNEL

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too


@pytest.mark.parametrize("signature", ["torch_2_9", "torch_2_11"])
def test_torch_varlen_adapts_to_older_torch_signatures(signature, reference, tmp_path, monkeypatch):
    """torch 2.9-2.10 ``varlen_attn(..., is_causal=False, return_aux=None)`` (no scale, no GQA) and torch 2.11
    (``scale``, ``window_size`` but no ``enable_gqa``: seen on an H200 with torch 2.11): the GQA model (2 KV
    heads for 4 query heads) must still give each sample its own logits."""
    from fastlm.engine.model.attention import kernels

    calls = []

    def split(query, key, value, cu_seq_q, scale, causal):
        assert key.shape[1] == query.shape[1], "older varlen_attn has no GQA: KV heads must be expanded"
        assert causal, "causal attention was not asked for"
        bounds = cu_seq_q.tolist()
        calls.append(signature)
        return torch.cat(
            [
                causal_attention(query[a:b], key[a:b], value[a:b], scale, True)
                for a, b in zip(bounds[:-1], bounds[1:], strict=True)
            ]
        )

    if signature == "torch_2_9":

        def old_varlen_attn(
            query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None
        ):
            return split(query, key, value, cu_seq_q, None, is_causal)
    else:

        def old_varlen_attn(
            query,
            key,
            value,
            cu_seq_q,
            cu_seq_k,
            max_q,
            max_k,
            *,
            return_aux=None,
            scale=None,
            window_size=(-1, -1),
        ):
            return split(query, key, value, cu_seq_q, scale, window_size == (-1, 0))

    monkeypatch.setattr(kernels, "varlen_attn", old_varlen_attn)
    reference_logits, reference_losses = reference
    params = packed_params(tmp_path)
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))
    model = packed_model("torch_varlen")
    recorder = Recorder(model)
    result = evaluate(
        model,
        packed_dataset(),
        params=params,
        runtime=runtime,
        pad_id=PAD,
        max_length=ROW,
        attn="torch_varlen",
    )
    check_samples(recorder, reference_logits, len(SAMPLES))
    expected = sum(float(loss) for loss in reference_losses.values()) / sum(n - 1 for n in LENGTHS)
    assert calls and math.isclose(result.metrics["loss"], expected, rel_tol=MEAN_LOSS_RTOL)


def test_torch_varlen_gets_half_precision_inputs_under_autocast(reference, tmp_path, monkeypatch):
    """Under bf16 autocast Llama's rotary embedding gives fp32 queries and keys (fp32 weights); the flash
    kernel behind varlen_attn takes only fp16/bf16 ("FlashAttention only support fp16 and bf16 data type",
    seen on an H200): fastlm casts them to the autocast dtype, as transformers' flash-attention paths do."""
    from fastlm.engine.model.attention import kernels

    dtypes = []

    def half_only_varlen_attn(
        query,
        key,
        value,
        cu_seq_q,
        cu_seq_k,
        max_q,
        max_k,
        *,
        scale=None,
        window_size=(-1, -1),
        enable_gqa=False,
        **kwargs,
    ):
        if {query.dtype, key.dtype, value.dtype} - {torch.bfloat16, torch.float16}:
            raise RuntimeError("FlashAttention only support fp16 and bf16 data type")
        dtypes.append(query.dtype)
        bounds = cu_seq_q.tolist()
        return torch.cat(
            [
                causal_attention(query[a:b], key[a:b], value[a:b], scale, True)
                for a, b in zip(bounds[:-1], bounds[1:], strict=True)
            ]
        )

    monkeypatch.setattr(kernels, "varlen_attn", half_only_varlen_attn)
    _, reference_losses = reference
    params = packed_params(tmp_path)
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="bf16", num_threads=1))
    result = evaluate(
        packed_model("torch_varlen"),
        packed_dataset(),
        params=params,
        runtime=runtime,
        pad_id=PAD,
        max_length=ROW,
        attn="torch_varlen",
    )
    expected = sum(float(loss) for loss in reference_losses.values()) / sum(n - 1 for n in LENGTHS)
    assert dtypes and set(dtypes) == {torch.bfloat16}
    assert math.isclose(result.metrics["loss"], expected, rel_tol=BF16_MODEL_LOSS_REL)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_sdpa_varlen_equals_causal_attention_per_segment_with_its_gradients(kv_heads):
    """The CPU varlen kernel (length buckets, one causal SDPA call each): outputs and q/k/v gradients equal
    those of each segment's own causal attention, for segments of every length up to and past a bucket
    boundary."""
    from fastlm.engine.model.attention.kernels import sdpa_varlen_attention

    torch.manual_seed(0)
    lengths = [1, 7, 8, 9, 16, 17, 3, 40, 2, 33]
    bounds = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    tokens, heads, dim, scale = int(bounds[-1]), 4, 8, 0.3
    query = torch.randn(1, heads, tokens, dim, requires_grad=True)
    key, value = (torch.randn(1, kv_heads, tokens, dim, requires_grad=True) for _ in range(2))
    out, _ = sdpa_varlen_attention(
        None,
        query,
        key,
        value,
        None,
        scaling=scale,
        cu_seq_lens_q=bounds,
        cu_seq_lens_k=bounds,
        max_length_q=max(lengths),
        max_length_k=max(lengths),
    )
    assert out.shape == (1, tokens, heads, dim)
    weights = torch.randn_like(out)
    grads = torch.autograd.grad((out * weights).sum(), (query, key, value))
    groups = heads // kv_heads
    q, k, v = (x.detach().clone().requires_grad_() for x in (query, key, value))
    parts = []
    # written out: no SDPA in the reference
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        keys, values = (x[0, :, a:b].repeat_interleave(groups, dim=0) for x in (k, v))
        scores = q[0, :, a:b] @ keys.transpose(1, 2) * scale
        scores = scores.masked_fill(torch.ones(b - a, b - a, dtype=torch.bool).triu(1), -math.inf)
        parts.append((scores.softmax(-1) @ values).transpose(0, 1))
    expected = torch.cat(parts).unsqueeze(0)
    torch.testing.assert_close(out, expected, **OTHER_FP32_KERNEL)  # one attention op, another kernel
    expected_grads = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, **OTHER_FP32_KERNEL)  # its backward: one op deeper
