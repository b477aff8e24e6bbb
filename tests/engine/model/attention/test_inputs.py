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

import pytest
import torch

from fastlm.engine.evaluate.evaluation import evaluate
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from fastlm.engine.train.loop import train
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

pytestmark = [
    pytest.mark.kernels,  # compares two computations: run under other CPU kernel sets too
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
]

# --- reference kernels under the CUDA kernels' calling conventions ------------------------------------------


class FlashReference:
    """flash_attn's ``flash_attn_func`` and ``flash_attn_varlen_func`` in pure PyTorch, recording each
    call."""

    def __init__(self):
        self.calls: list[str] = []

    def dense(self, q, k, v, dropout_p=0.0, softmax_scale=None, causal=False):
        self.calls.append("dense")
        return torch.stack(
            [causal_attention(q[b], k[b], v[b], softmax_scale, causal) for b in range(q.shape[0])]
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
                causal_attention(q[a:b], k[a:b], v[a:b], softmax_scale, causal)
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
                    causal_attention(query[a:b], key[a:b], value[a:b], scale, True)
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
    model = packed_model(attn)
    recorder = Recorder(model)
    params = packed_params(tmp_path)
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))
    result = evaluate(
        model, packed_dataset(), params=params, runtime=runtime, pad_id=PAD, max_length=ROW, attn=attn
    )
    check_samples(recorder, reference_logits, len(SAMPLES))
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
    model = packed_model(attn)
    recorder = Recorder(model)
    params = packed_params(tmp_path, rows=3)
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))
    train(
        model, packed_dataset(), None, params=params, runtime=runtime, pad_id=PAD, max_length=ROW, attn=attn
    )
    assert len(recorder.seen) >= 3
    check_samples(recorder, reference_logits, len([key for key in recorder.seen if key in reference_logits]))
    assert kernels_fed(), f"{attn}: the kernel did not get the packed-sample inputs it needs"


@pytest.mark.parametrize("path_kernels", ["flash_attention_2", "torch_varlen", "sdpa_varlen"], indirect=True)
def test_padded_batches_on_varlen_paths_equal_each_sample_alone(path_kernels, reference, tmp_path):
    """Dynamic padding (one sample per row): the varlen view gets each row's sample and padding tail apart."""
    attn, kernels_fed = path_kernels
    _, reference_losses = reference
    params = packed_params(tmp_path, batching={"mode": "dynamic", "micro_batch_size": 4})
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))
    result = evaluate(
        packed_model(attn),
        packed_dataset(),
        params=params,
        runtime=runtime,
        pad_id=PAD,
        max_length=ROW,
        attn=attn,
    )
    expected = sum(float(loss) for loss in reference_losses.values()) / sum(n - 1 for n in LENGTHS)
    assert math.isclose(result.metrics["loss"], expected, rel_tol=MEAN_LOSS_RTOL) and kernels_fed()


# --- the varlen view without the rows' padding ------------------------------------------------------------


def _varlen_batches():
    """A packed batch whose rows end in padding, and a right-padded one (one sample per row), as the engine's
    collators make them."""
    from fastlm.engine.data import DynamicPaddingCollator, PackedCollator
    from fastlm.engine.data.packing import TokenBudget

    features = [{"input_ids": ids.tolist()} for ids in SAMPLES[:6]]  # 7, 13, 3, 20, 9, 2 tokens
    packed = PackedCollator(
        pad_id=PAD, budget=TokenBudget(row_length=ROW, rows_per_batch=4), attention_mask_format="none"
    )(features)
    padded = DynamicPaddingCollator(pad_id=PAD)(features)
    return {"packed": packed, "padded": padded}


@pytest.mark.parametrize("layout", ["packed", "padded"])
@pytest.mark.parametrize("attn", ["torch_varlen", "flash_attention_2", "sdpa_varlen"])
def test_varlen_paths_get_the_real_tokens_in_one_row_without_the_rows_padding(layout, attn):
    """The varlen kernels need no rectangle: the rows' padding tails (1.6 % of the H100's LoRA micro-batches,
    docs/gpu-runs/2026-11-27-h100-gpu_speed_lora.log; the Trainer's flattening computes none) are left out of
    the model's row, which keeps each sample's tokens, labels and positions in order, padded at its end to a
    multiple of 16 only (float8's weight gradients take no other token count)."""
    from fastlm.engine.data.schema import MODEL_INPUTS
    from fastlm.engine.model.attention.inputs import VARLEN_ROW_MULTIPLE, to_device

    assert VARLEN_ROW_MULTIPLE == 16
    batch = _varlen_batches()[layout]
    real = int(batch["num_real_tokens"])
    assert batch["input_ids"].numel() - real >= 16  # the rows' padding: more than the round-up
    out = to_device(batch, torch.device("cpu"), attn)
    inputs = out[MODEL_INPUTS]
    width = -(-real // 16) * 16
    assert inputs["input_ids"].shape == (1, width) and out["labels"].shape == (1, width)
    flat_ids = torch.cat([torch.as_tensor(ids) for ids in SAMPLES[:6]])
    assert torch.equal(inputs["input_ids"][0, :real], flat_ids)  # the samples, in the collator's order
    assert bool((inputs["input_ids"][0, real:] == PAD).all()) and bool(
        (out["labels"][0, real:] == -100).all()
    )
    starts = [0, *torch.cumsum(torch.tensor(LENGTHS[:6]), 0).tolist()]
    assert inputs["cu_seq_lens_q"].tolist() == starts + ([width] if width > real else [])
    assert inputs["max_length_q"] == max(max(LENGTHS[:6]), width - real)
    positions = torch.cat([torch.arange(n) for n in LENGTHS[:6]] + [torch.arange(width - real)])
    assert torch.equal(inputs["position_ids"][0], positions)
    # the labels: each sample's own but its first token (no position of it predicts that one: its row's start
    # in a right-padded batch, the packed collator's -100)
    assert torch.equal(
        out["labels"][out["labels"] != -100], torch.cat([torch.as_tensor(i[1:]) for i in SAMPLES[:6]])
    )
    assert int(out["num_target_tokens"]) == sum(n - 1 for n in LENGTHS[:6])
    assert int(out["num_computed_tokens"]) == width and int(out["num_real_tokens"]) == real
    dense = to_device(_varlen_batches()[layout], torch.device("cpu"), "sdpa")  # a dense mask keeps the rows
    assert dense[MODEL_INPUTS]["input_ids"].shape == batch["input_ids"].shape


def test_the_varlen_row_is_pinned_where_the_loader_pinned_the_rows(monkeypatch):
    """On CUDA the loader pins each batch (``pin_memory`` auto) so its transfers are asynchronous; the row
    built on the host is pinned too (a pageable source may make the copy wait). Pinning needs CUDA: stood in
    for by patched ``is_pinned`` / ``pin_memory``. The mask of the row's real tokens (its padding tail left
    out of the router loss) too."""
    from fastlm.engine.data.schema import VARLEN_REAL_TOKENS
    from fastlm.engine.model.attention.inputs import without_padding

    batch = _varlen_batches()["packed"]
    pinned = []
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pinned.append(self.shape) or self.clone())
    out = without_padding(batch)
    keys = ("input_ids", "labels", "position_ids", "cu_seq_lens", VARLEN_REAL_TOKENS)
    assert pinned == [out[key].shape for key in keys]
    from fastlm.engine.model.loss import positions_to_keep

    pinned.clear()
    keep = positions_to_keep(out["labels"], torch.device("cpu"), flattened=True)  # the kept positions too
    assert pinned == [keep.shape]


# --- one shape per micro-batch: train.runtime.compile_mode reduce-overhead (CUDA graphs) -------------------


def _fixed_shape_batches():
    """Packed micro-batches of one budget (4 rows of ROW) filled to different depths, as the engine's
    collator makes them where every micro-batch must have one shape (``fixed_shape``)."""
    from fastlm.engine.data import PackedCollator
    from fastlm.engine.data.packing import TokenBudget

    collate = PackedCollator(
        pad_id=PAD,
        budget=TokenBudget(row_length=ROW, rows_per_batch=4),
        attention_mask_format="none",
        fixed_shape=True,
    )
    picks = (range(6), range(2), range(6, 12), (3, 6, 9, 10), range(1))  # 54, 20, 60, 58, 7 tokens of 96
    return [collate([{"input_ids": SAMPLES[i].tolist()} for i in pick]) for pick in picks], picks


@pytest.mark.parametrize("attn", ["torch_varlen", "flash_attention_2", "sdpa_varlen"])
def test_fixed_shape_varlen_batches_keep_one_shape_whatever_their_fill(attn):
    """A CUDA graph replays one shape: the varlen row is padded to the micro-batch's capacity (its padding
    in segments of at most the row length: the kernel's longest-segment bound under compile, which a longer
    one would break) and the boundaries to a power-of-two count by repeating the last one (empty segments,
    which the kernels skip), so micro-batches of any fill have the same token count and one of few boundary
    counts; the samples, labels and positions are those of the row without that padding."""
    from fastlm.engine.data.schema import MODEL_INPUTS
    from fastlm.engine.model.attention.inputs import to_device

    batches, picks = _fixed_shape_batches()
    capacity = 4 * ROW
    counts = set()
    for batch, pick in zip(batches, picks, strict=True):
        lengths = [LENGTHS[i] for i in pick]
        real = sum(lengths)
        out = to_device(batch, torch.device("cpu"), attn)
        inputs = out[MODEL_INPUTS]
        assert inputs["input_ids"].shape == (1, capacity) and out["labels"].shape == (1, capacity)
        assert int(out["num_computed_tokens"]) == capacity and int(out["num_real_tokens"]) == real
        flat_ids = torch.cat([torch.as_tensor(SAMPLES[i]) for i in pick])
        assert torch.equal(inputs["input_ids"][0, :real], flat_ids)
        assert bool((out["labels"][0, real:] == -100).all())
        assert torch.equal(
            out["varlen_real_tokens"], (torch.arange(capacity) < real)[None]
        )  # router loss mask
        pad = capacity - real
        padding = [ROW] * (pad // ROW) + ([pad % ROW] if pad % ROW else [])  # segments of at most ROW
        bounds = inputs["cu_seq_lens_q"].tolist()
        segments = len(bounds) - 1
        assert segments & (segments - 1) == 0 and segments >= len(lengths) + len(padding)  # a power of two
        ends = torch.cumsum(torch.tensor(lengths + padding), 0).tolist()
        assert bounds == [0, *ends] + [capacity] * (segments - len(ends))  # then empty segments
        assert inputs["max_length_q"] == max(lengths + padding) <= ROW
        positions = torch.cat([torch.arange(n) for n in lengths + padding])
        assert torch.equal(inputs["position_ids"][0], positions)
        counts.add(segments)
    assert counts == {8}  # 5 to 8 segments with the padding's: one shape for all five


@pytest.mark.parametrize("path_kernels", ["flash_attention_2", "torch_varlen", "sdpa_varlen"], indirect=True)
def test_fixed_shape_batches_train_as_the_rows_without_that_padding(path_kernels, tmp_path):
    """The padding up to the capacity is computed and predicts nothing: one step's mean loss and every
    gradient equal those of the same micro-batches without it (the same sums over the real tokens; the
    matmuls see more rows, which may reorder their blocks)."""
    from fastlm.engine.data import PackedCollator
    from fastlm.engine.data.packing import TokenBudget
    from fastlm.engine.model.attention.inputs import to_device
    from tests.support.linear_loss import step_loss_and_grads
    from tests.support.tolerances import OTHER_FP32_MODEL

    attn, kernels_fed = path_kernels
    batches, picks = _fixed_shape_batches()
    loose = PackedCollator(
        pad_id=PAD, budget=TokenBudget(row_length=ROW, rows_per_batch=4), attention_mask_format="none"
    )
    unfixed = [loose([{"input_ids": SAMPLES[i].tolist()} for i in pick]) for pick in picks]
    device = torch.device("cpu")
    model = packed_model(attn)
    got_loss, got = step_loss_and_grads(model, [to_device(batch, device, attn) for batch in batches])
    want_loss, want = step_loss_and_grads(model, [to_device(batch, device, attn) for batch in unfixed])
    torch.testing.assert_close(got_loss, want_loss, **OTHER_FP32_MODEL)
    assert got.keys() == want.keys()
    for name, grad in got.items():
        torch.testing.assert_close(grad, want[name], rtol=OTHER_FP32_MODEL["rtol"], atol=1e-5, msg=name)
    assert kernels_fed()
