"""``torch.nn.attention.varlen.varlen_attn``'s calling contract on CPU as a custom op, as torch registers the
real one (``torch_attn::_varlen_attn``): opaque to dynamo (a fake kernel gives its output's shape), its
backward another op. Causal attention per segment in plain PyTorch; each call's ``max_q`` recorded, so a test
sees what the kernel was handed, compiled or eager."""

from __future__ import annotations

import torch
import torch.nn.functional as F

MAX_Q_SEEN: list[int] = []


def _segments(q, k, v, cu):
    out = torch.zeros_like(q)
    bounds = cu.tolist()
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        if end > start:
            attended = F.scaled_dot_product_attention(
                *(x[start:end].transpose(0, 1) for x in (q, k, v)), is_causal=True
            )
            out = out.index_copy(0, torch.arange(start, end), attended.transpose(0, 1))
    return out


@torch.library.custom_op("fastlm_test::varlen", mutates_args={})
def varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_q: int) -> torch.Tensor:
    MAX_Q_SEEN.append(max_q)
    return _segments(q, k, v, cu)


@varlen.register_fake
def _(q, k, v, cu, max_q):
    return torch.empty_like(q)


@torch.library.custom_op("fastlm_test::varlen_backward", mutates_args={})
def varlen_backward(
    grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of causal softmax attention per segment, written out (autograd does not run inside an
    op's kernel)."""
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    bounds = cu.tolist()
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        if end <= start:
            continue
        qs, ks, vs, gs = (x[start:end].transpose(0, 1).float() for x in (q, k, v, grad))
        scale = qs.shape[-1] ** -0.5
        scores = (qs @ ks.transpose(-1, -2) * scale).masked_fill(
            torch.ones(end - start, end - start, dtype=torch.bool).triu(1), float("-inf")
        )
        probs = scores.softmax(-1)
        dprobs = gs @ vs.transpose(-1, -2)
        dscores = probs * (dprobs - (dprobs * probs).sum(-1, keepdim=True))
        rows = torch.arange(start, end)
        dq = dq.index_copy(0, rows, (dscores @ ks * scale).transpose(0, 1).to(q.dtype))
        dk = dk.index_copy(0, rows, (dscores.transpose(-1, -2) @ qs * scale).transpose(0, 1).to(k.dtype))
        dv = dv.index_copy(0, rows, (probs.transpose(-1, -2) @ gs).transpose(0, 1).to(v.dtype))
    return dq, dk, dv


@varlen_backward.register_fake
def _(grad, q, k, v, cu):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx, inputs, output):
    q, k, v, cu, _ = inputs
    ctx.save_for_backward(q, k, v, cu)


def _backward(ctx, grad):
    return (*varlen_backward(grad, *ctx.saved_tensors), None, None)


varlen.register_autograd(_backward, setup_context=_setup)


def varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size=(-1, 0), scale=None, enable_gqa=False):
    """``varlen_attn`` with torch 2.13's keywords (causal, no GQA in the tests' models)."""
    assert window_size == (-1, 0) and cu_k is cu_q and k.shape[1] == q.shape[1]
    return varlen(q, k, v, cu_q, max_q)


def install(monkeypatch) -> list[int]:
    """``attention.kernels`` calls the stand-in; returns the list of each call's ``max_q``, emptied."""
    from fastlm.engine.model.attention import kernels

    monkeypatch.setattr(kernels, "varlen_attn", varlen_attn)
    kernels.varlen_parameters(varlen_attn)  # read once here, as the real one is at import
    MAX_Q_SEEN.clear()
    return MAX_Q_SEEN
