"""Packed batches keep samples apart on every attention path fastlm can choose.

For each implementation, the REAL engine path runs (``make_batching`` -> collator -> device transfer -> the
model call of ``evaluation.evaluate`` / ``loop.train``) with several rows per micro-batch, and every sample's
logits and the loss must equal those of the sample run alone. CUDA-only kernels are replaced, on CPU, by
pure-PyTorch references with the kernel's own calling convention (flash-attention: ``flash_attn_func`` /
``flash_attn_varlen_func`` behind transformers' real ``_flash_attention_forward`` dispatch; PyTorch varlen:
``varlen_attn``), so what is checked is what fastlm feeds the kernel. flex_attention runs its uncompiled
(reference) kernel: torch.compile of it takes ~30 s on CPU.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from fastlm.engine.config import parse_train_params
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.evaluate.evaluation import evaluate
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from fastlm.engine.train.loop import train
from tests.support.tolerances import BF16_MODEL_LOSS_REL, OTHER_FP32_KERNEL, OTHER_FP32_MODEL

VOCAB, PAD, EOS = 96, 0, 2
ROW = 24
LENGTHS = [7, 13, 3, 20, 9, 2, 16, 11, 5, 14, 8, 6]


def _samples() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    samples = [rng.integers(3, VOCAB, size=n) for n in LENGTHS]
    for ids in samples:
        ids[-1] = EOS
    return samples


SAMPLES = _samples()


def _dataset() -> TokenSequences:
    offsets = np.concatenate([[0], np.cumsum(LENGTHS)])
    return TokenSequences(np.concatenate(SAMPLES), offsets)


def _model(attn: str) -> LlamaForCausalLM:
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


def _params(tmp_path, rows: int = 4, **overrides):
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


@pytest.fixture(scope="module")
def reference():
    """Each sample alone (batch of one, no mask, no padding): its logits and summed loss."""
    model = _model("eager").eval()
    logits, losses = {}, {}
    with torch.no_grad():
        for ids in SAMPLES:
            out = model(input_ids=torch.as_tensor(ids)[None]).logits[0]
            logits[tuple(ids.tolist())] = out
            losses[tuple(ids.tolist())] = F.cross_entropy(out[:-1], torch.as_tensor(ids[1:]), reduction="sum")
    return logits, losses


class Recorder:
    """Forward hook: the logits of every sample the model saw, found from the restarting position ids."""

    def __init__(self, model):
        self.seen: dict[tuple, torch.Tensor] = {}
        self.shapes: list[tuple] = []
        self.handle = model.register_forward_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs, output):
        ids, positions = kwargs["input_ids"], kwargs["position_ids"].expand_as(kwargs["input_ids"])
        self.shapes.append(tuple(ids.shape))
        # a copy: the training loss writes its gradient over the logits (loss.accumulate_gradients)
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


def _check_samples(recorder: Recorder, reference_logits: dict, expected: int) -> None:
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


# --- reference kernels under the CUDA kernels' calling conventions ------------------------------------------


def _causal_attention(q, k, v, scale, causal):
    """q [L, H, D], k/v [L, Hkv, D] -> [L, H, D]."""
    groups = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(groups, dim=1) for x in (k, v))
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=causal, scale=scale
    )
    return out.transpose(0, 1)


class FlashReference:
    """flash_attn's ``flash_attn_func`` and ``flash_attn_varlen_func`` in pure PyTorch, recording each
    call."""

    def __init__(self):
        self.calls: list[str] = []

    def dense(self, q, k, v, dropout_p=0.0, softmax_scale=None, causal=False):
        self.calls.append("dense")
        return torch.stack(
            [_causal_attention(q[b], k[b], v[b], softmax_scale, causal) for b in range(q.shape[0])]
        )

    def varlen(
        self,
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
    ):
        self.calls.append("varlen")
        assert cu_seqlens_q.dtype == torch.int32 and torch.equal(cu_seqlens_q, cu_seqlens_k)
        bounds = cu_seqlens_q.tolist()
        assert bounds[-1] == q.shape[0]
        assert max(b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)) == int(max_seqlen_q)
        return torch.cat(
            [
                _causal_attention(q[a:b], k[a:b], v[a:b], softmax_scale, causal)
                for a, b in zip(bounds[:-1], bounds[1:], strict=True)
            ]
        )


@pytest.fixture
def flash_reference(monkeypatch):
    """transformers' real flash-attention dispatch, with the kernels it would import replaced by
    references."""
    from transformers import modeling_flash_attention_utils as fa_utils

    kernels = FlashReference()
    monkeypatch.setattr(
        fa_utils,
        "_lazy_imports",
        lambda *args, **kwargs: (
            kernels.dense,
            kernels.varlen,
            None,
            fa_utils._pad_input,
            fa_utils._unpad_input,
        ),
    )
    monkeypatch.setattr(fa_utils, "_loaded_implementation", None)
    return kernels


@pytest.fixture
def flex_reference(monkeypatch):
    """flex_attention's uncompiled kernel (same calling contract as the compiled one transformers wraps)."""
    from torch.nn.attention.flex_attention import flex_attention
    from transformers.integrations import flex_attention as hf_flex

    calls = []

    def uncompiled(query, key, value, training=False, **kwargs):
        calls.append(kwargs.get("block_mask"))
        return flex_attention(query, key, value, **kwargs)

    monkeypatch.setattr(hf_flex, "compile_friendly_flex_attention", uncompiled)
    return calls


pytestmark = [
    pytest.mark.kernels,  # compares two computations: run under other CPU kernel sets too
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
]
PATHS = [
    "sdpa",
    "eager",
    "flex_attention",
    "flash_attention_2",
    "flash_attention_3",
    "torch_varlen",
    "sdpa_varlen",
]


@pytest.fixture
def path_kernels(request, monkeypatch):
    """Reference kernels for the path under test; returns a check of what the kernels were fed."""
    attn = request.param
    if attn.startswith("flash_attention"):
        kernels = request.getfixturevalue("flash_reference")
        return attn, lambda: kernels.calls and set(kernels.calls) == {"varlen"}
    if attn == "flex_attention":
        calls = request.getfixturevalue("flex_reference")
        from torch.nn.attention.flex_attention import BlockMask

        return attn, lambda: calls and all(isinstance(mask, BlockMask) for mask in calls)
    if attn == "torch_varlen":
        from fastlm.engine.model.attention import kernels as attention_kernels

        calls = []

        def reference_varlen_attn(
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
            calls.append(window_size)
            assert enable_gqa or query.shape[1] == key.shape[1]
            bounds = cu_seq_q.tolist()
            assert window_size == (-1, 0) and bounds[-1] == query.shape[0]
            return torch.cat(
                [
                    _causal_attention(query[a:b], key[a:b], value[a:b], scale, True)
                    for a, b in zip(bounds[:-1], bounds[1:], strict=True)
                ]
            )

        monkeypatch.setattr(attention_kernels, "varlen_attn", reference_varlen_attn)
        return attn, lambda: bool(calls)
    return attn, lambda: True


@pytest.mark.parametrize("path_kernels", PATHS, indirect=True)
def test_packed_evaluation_equals_each_sample_alone(path_kernels, reference, tmp_path):
    attn, kernels_fed = path_kernels
    reference_logits, reference_losses = reference
    model = _model(attn)
    recorder = Recorder(model)
    params = _params(tmp_path)
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))
    result = evaluate(
        model, _dataset(), params=params, runtime=runtime, pad_id=PAD, max_length=ROW, attn=attn
    )
    _check_samples(recorder, reference_logits, len(SAMPLES))
    assert max(shape[0] for shape in recorder.shapes) > 1 or attn in (
        "flash_attention_2",
        "flash_attention_3",
        "torch_varlen",
        "sdpa_varlen",
    ), "one row per batch"
    expected = sum(float(loss) for loss in reference_losses.values()) / sum(n - 1 for n in LENGTHS)
    assert math.isclose(result.metrics["loss"], expected, rel_tol=MEAN_LOSS_RTOL)
    assert kernels_fed(), f"{attn}: the kernel did not get the packed-sample inputs it needs"


@pytest.mark.parametrize("path_kernels", [p for p in PATHS if p != "flex_attention"], indirect=True)
def test_packed_training_step_sees_each_sample_alone(path_kernels, reference, tmp_path):
    """The training loop's own model call (flex_attention has no CPU backward: it cannot train here)."""
    attn, kernels_fed = path_kernels
    reference_logits, _ = reference
    model = _model(attn)
    recorder = Recorder(model)
    params = _params(tmp_path, rows=3)
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))
    train(model, _dataset(), None, params=params, runtime=runtime, pad_id=PAD, max_length=ROW, attn=attn)
    assert len(recorder.seen) >= 3
    _check_samples(recorder, reference_logits, len([key for key in recorder.seen if key in reference_logits]))
    assert kernels_fed(), f"{attn}: the kernel did not get the packed-sample inputs it needs"


@pytest.mark.parametrize("path_kernels", ["flash_attention_2", "torch_varlen", "sdpa_varlen"], indirect=True)
def test_padded_batches_on_varlen_paths_equal_each_sample_alone(path_kernels, reference, tmp_path):
    """Dynamic padding (one sample per row): the varlen view gets each row's sample and padding tail apart."""
    attn, kernels_fed = path_kernels
    _, reference_losses = reference
    params = _params(tmp_path, batching={"mode": "dynamic", "micro_batch_size": 4})
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))
    result = evaluate(
        _model(attn), _dataset(), params=params, runtime=runtime, pad_id=PAD, max_length=ROW, attn=attn
    )
    expected = sum(float(loss) for loss in reference_losses.values()) / sum(n - 1 for n in LENGTHS)
    assert math.isclose(result.metrics["loss"], expected, rel_tol=MEAN_LOSS_RTOL) and kernels_fed()


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
                _causal_attention(query[a:b], key[a:b], value[a:b], scale, True)
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
    params = _params(tmp_path)
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))
    model = _model("torch_varlen")
    recorder = Recorder(model)
    result = evaluate(
        model, _dataset(), params=params, runtime=runtime, pad_id=PAD, max_length=ROW, attn="torch_varlen"
    )
    _check_samples(recorder, reference_logits, len(SAMPLES))
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
                _causal_attention(query[a:b], key[a:b], value[a:b], scale, True)
                for a, b in zip(bounds[:-1], bounds[1:], strict=True)
            ]
        )

    monkeypatch.setattr(kernels, "varlen_attn", half_only_varlen_attn)
    _, reference_losses = reference
    params = _params(tmp_path)
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="bf16", num_threads=1))
    result = evaluate(
        _model("torch_varlen"),
        _dataset(),
        params=params,
        runtime=runtime,
        pad_id=PAD,
        max_length=ROW,
        attn="torch_varlen",
    )
    expected = sum(float(loss) for loss in reference_losses.values()) / sum(n - 1 for n in LENGTHS)
    assert dtypes and set(dtypes) == {torch.bfloat16}
    assert math.isclose(result.metrics["loss"], expected, rel_tol=BF16_MODEL_LOSS_REL)


@pytest.mark.parametrize("attn", ["torch_varlen", "flash_attention_2"])
def test_half_precision_kernels_are_refused_in_fp32_on_cuda_with_a_clear_message(attn):
    from fastlm.engine.model.attention.choice import choose_attention
    from fastlm.errors import ConfigError

    with pytest.raises(ConfigError, match=f"{attn} runs in bf16 or fp16 only.*runtime.precision") as refused:
        choose_attention(attn, torch.device("cuda"), "fp32")
    assert "\n" not in str(refused.value)
    assert choose_attention(attn, torch.device("cuda"), "bf16") == attn


def test_generation_on_a_torch_varlen_model_uses_sdpa_and_puts_it_back():
    """Generation (KV cache, left padding) cannot use the packed-only varlen path: it runs on SDPA
    meanwhile."""
    from fastlm.engine.evaluate.generation import generate_continuations

    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))
    prompts = [SAMPLES[0][:4].tolist(), SAMPLES[3][:7].tolist()]
    outputs = {}
    for attn in ("sdpa", "torch_varlen", "sdpa_varlen"):
        model = _model(attn)
        outputs[attn] = generate_continuations(
            model, prompts, pad_id=PAD, eos_id=EOS, runtime=runtime, max_new_tokens=4
        ).continuations
        assert model.config._attn_implementation == attn
    assert outputs["torch_varlen"] == outputs["sdpa"] == outputs["sdpa_varlen"]


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


def test_auto_prefers_varlen_then_flex_then_dense_and_logs_why(monkeypatch, caplog):
    import importlib.util
    import logging

    from fastlm.engine.model.attention import choice

    installed: set[str] = set()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name in installed else None)
    monkeypatch.setattr(choice, "torch_varlen_available", lambda device: "torch" in installed)
    cuda = torch.device("cuda")
    with caplog.at_level(logging.INFO, logger="fastlm.engine.model.attention.choice"):
        installed.update({"flash_attn", "torch"})
        assert choice.choose_attention("auto", cuda, "bf16") == "flash_attention_2"
        installed.discard("flash_attn")
        assert choice.choose_attention("auto", cuda, "bf16") == "torch_varlen"
        installed.clear()
        assert choice.choose_attention("auto", cuda, "bf16") == "flex_attention"
        installed.update({"flash_attn", "torch"})
        assert choice.choose_attention("auto", cuda, "fp32") == "flex_attention"  # varlen kernels: half only
        assert choice.choose_attention("auto", torch.device("cpu")) == "sdpa"
        assert choice.choose_attention("eager", cuda) == "eager"
    assert sum("attention auto ->" in message for message in caplog.messages) == 5
