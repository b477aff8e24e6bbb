"""cut-cross-entropy's calling contract, on CPU: ``train.loss.fused_linear_kernel: cce`` runs the fused LM
head + loss through ``cut_cross_entropy.linear_cross_entropy`` with the summed loss over the already shifted
targets, and gives our loss and gradients; it is refused in one line where it cannot run (no CUDA, not
installed) or cannot compute what was asked (label smoothing); a head with a bias keeps ours.

cut-cross-entropy needs CUDA and Triton: a stand-in ``cut_cross_entropy`` module (plain
``F.cross_entropy`` on ``e @ c.T``, with 25.1's signature, recording its calls) and a patched
``torch.cuda.is_available`` stand in. The kernel itself runs in ``benchmarks/gpu_levers.py`` on a GPU."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from fastlm.engine.config import parse_train_params
from fastlm.engine.model import cce, liger
from fastlm.engine.model.accumulation import FusedHead
from fastlm.engine.model.linear_loss import fused_head_choice, linear_cross_entropy_sum
from fastlm.errors import ConfigError
from tests.support.linear_loss import (
    cuda_step_against_ours,
    inputs,
    loss_and_grads,
    packed_batch,
    step_loss_and_grads,
    tiny_llama,
)
from tests.support.tolerances import BF16_MODEL_LOSS_REL, BF16_VS_FP32

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too

VOCAB = 301
CUDA = torch.device("cuda")


class _HalfBackward(torch.autograd.Function):
    """Plain cross-entropy of ``e @ c.T`` whose backward, like cut-cross-entropy 25.1's
    (``cce_backward_kernel``), accepts bf16 or fp16 operands only."""

    @staticmethod
    def forward(ctx, e, c, targets, ignore_index, reduction):
        ctx.save_for_backward(e, c, targets)
        ctx.ignore_index, ctx.reduction = ignore_index, reduction
        with torch.enable_grad():
            return F.cross_entropy(
                e.detach().float() @ c.detach().float().T,
                targets,
                ignore_index=ignore_index,
                reduction=reduction,
            )

    @staticmethod
    def backward(ctx, grad):
        e, c, targets = ctx.saved_tensors
        assert e.dtype in (torch.float16, torch.bfloat16), "Backwards requires embeddings to be bf16 or fp16"
        assert c.dtype in (torch.float16, torch.bfloat16), "Backwards requires classifier to be bf16 or fp16"
        e32, c32 = e.detach().float().requires_grad_(), c.detach().float().requires_grad_()
        with torch.enable_grad():
            loss = F.cross_entropy(
                e32 @ c32.T, targets, ignore_index=ctx.ignore_index, reduction=ctx.reduction
            )
        de, dc = torch.autograd.grad(loss, (e32, c32), grad.float())
        return de.to(e.dtype), dc.to(c.dtype), None, None, None


@pytest.fixture
def fake_cce(monkeypatch):
    """``cut_cross_entropy.linear_cross_entropy`` in plain torch, recording its arguments; CUDA
    "available"."""
    calls: list[dict] = []

    def linear_cross_entropy(
        e,
        c,
        targets,
        ignore_index=-100,
        softcap=None,
        reduction="mean",
        shift=False,
        filter_eps="high",
        impl="cce",
    ):
        calls.append(
            {
                "ignore_index": ignore_index,
                "softcap": softcap,
                "reduction": reduction,
                "shift": shift,
                "impl": impl,
                "dtypes": (e.dtype, c.dtype),
                "contiguous": e.is_contiguous() and targets.is_contiguous(),
            }
        )
        if e.dtype != c.dtype:  # 25.1's Triton kernels multiply two operands of one dtype
            raise AssertionError("e and c must have the same dtype")
        return _HalfBackward.apply(e, c, targets, ignore_index, reduction)

    module = types.ModuleType("cut_cross_entropy")
    module.linear_cross_entropy = linear_cross_entropy
    monkeypatch.setitem(sys.modules, "cut_cross_entropy", module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return calls


@pytest.fixture
def no_cce(monkeypatch):
    """A CUDA machine without cut-cross-entropy (``None`` in ``sys.modules``: the import fails)."""
    monkeypatch.setitem(sys.modules, "cut_cross_entropy", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_cce_is_chosen_only_when_asked_and_refused_in_one_line_where_it_cannot_run(fake_cce, monkeypatch):
    kernel, why = liger.linear_ce_kernel_choice("cce", CUDA)
    assert kernel == "cce" and "cut-cross-entropy" in why
    assert liger.linear_ce_kernel_choice("auto", CUDA)[0] != "cce"  # auto: not measured against liger yet
    with pytest.raises(ConfigError) as refused:
        liger.linear_ce_kernel_choice("cce", torch.device("cpu"))
    assert "train.loss.fused_linear_kernel" in str(refused.value) and "\n" not in str(refused.value)
    monkeypatch.setitem(sys.modules, "cut_cross_entropy", None)
    with pytest.raises(ConfigError, match="cut-cross-entropy is not installed"):
        liger.linear_ce_kernel_choice("cce", CUDA)


def test_the_parameters_refuse_cce_without_the_package(no_cce):
    with pytest.raises(ConfigError) as refused:
        parse_train_params({"loss": {"fused_linear_kernel": "cce"}})
    assert "cut-cross-entropy is not installed" in str(refused.value) and "\n" not in str(refused.value)


def test_the_parameters_refuse_what_cce_cannot_compute(fake_cce):
    with pytest.raises(ConfigError) as refused:
        parse_train_params({"loss": {"fused_linear_kernel": "cce", "label_smoothing": 0.1}})
    assert "label smoothing" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match="on CPU"):
        parse_train_params({"loss": {"fused_linear_kernel": "cce"}, "runtime": {"device": "cpu"}})
    assert parse_train_params({"loss": {"fused_linear_kernel": "cce"}}).loss.fused_linear_kernel == "cce"


def _bf16_close(got, want, what):
    """bf16 operands (cce's) against fp32 ones (ours): each logit rounded once (2 eps_bf16 relative), entries
    near zero judged against the largest one."""
    atol = BF16_VS_FP32["atol"] * float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=BF16_VS_FP32["rtol"], atol=atol, msg=what)


def test_the_cce_call_under_bf16_autocast_gives_our_loss_and_gradients_with_ignored_rows(fake_cce):
    """fp32 master weights under bf16 autocast (the runs' set-up, and the GPU levers run's): cce's kernels
    multiply bf16 operands and backpropagate only bf16/fp16 ones, so both reach it in the autocast dtype, and
    the gradients come back to the fp32 leaves in fp32."""
    hidden, weight, _, targets = inputs(bias=False)
    ours, our_grads = loss_and_grads(linear_cross_entropy_sum, hidden, weight, None, targets)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, grads = loss_and_grads(
            lambda h, w, t, b: cce.cce_linear_cross_entropy_sum(h, w, t), hidden, weight, None, targets
        )
    (call,) = fake_cce
    assert call["reduction"] == "sum" and call["shift"] is False and call["ignore_index"] == -100
    assert call["softcap"] is None and call["contiguous"] and got.dtype == torch.float32
    assert call["dtypes"] == (torch.bfloat16, torch.bfloat16)
    assert grads[0].dtype == grads[1].dtype == torch.float32
    _bf16_close(got, ours, "loss")
    for grad, want, name in zip(grads[:2], our_grads[:2], ("hidden", "weight"), strict=True):
        _bf16_close(grad, want, name)
    assert grads[0][targets == -100].abs().sum() == 0


def test_bf16_weights_reach_cce_as_they_are(fake_cce):
    hidden, weight, _, targets = inputs(bias=False)
    cce.cce_linear_cross_entropy_sum(hidden, weight.to(torch.bfloat16), targets)
    assert fake_cce[0]["dtypes"] == (torch.bfloat16, torch.bfloat16)


def test_fp32_operands_outside_autocast_are_refused_in_one_line(fake_cce):
    """cce has no fp32 backward: an fp32 run must not reach it (the parameters refuse the pair first)."""
    hidden, weight, _, targets = inputs(bias=False)
    with pytest.raises(ConfigError) as refused:
        cce.cce_linear_cross_entropy_sum(hidden, weight, targets)
    assert "train.runtime.precision" in str(refused.value) and "\n" not in str(refused.value)
    assert not fake_cce


def test_the_parameters_refuse_cce_with_fp32_precision(fake_cce):
    with pytest.raises(ConfigError) as refused:
        parse_train_params({"loss": {"fused_linear_kernel": "cce"}, "runtime": {"precision": "fp32"}})
    assert "bf16 or fp16" in str(refused.value) and "\n" not in str(refused.value)
    assert (
        parse_train_params(
            {"loss": {"fused_linear_kernel": "cce"}, "runtime": {"precision": "bf16"}}
        ).runtime.precision
        == "bf16"
    )


def test_a_head_with_a_bias_keeps_ours(fake_cce):
    hidden, weight, bias, targets = inputs()
    got = liger.fused_linear_cross_entropy_sum("cce", hidden, weight, targets, bias)
    assert not fake_cce
    torch.testing.assert_close(got, linear_cross_entropy_sum(hidden, weight, targets, bias))


def test_a_training_step_through_cce_equals_ours(fake_cce):
    """Two micro-batches of different target counts under bf16 autocast: cce's sums over the step's global
    target count give our step's loss and every gradient, within bf16 rounding."""
    model = tiny_llama()
    head, _ = fused_head_choice(model, True)
    batches = [packed_batch(VOCAB), packed_batch(VOCAB)]
    batches[1]["labels"][:, :12] = -100
    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    ours_loss, ours = step_loss_and_grads(model, batches, fused_head=head, autocast=bf16)
    assert not fake_cce
    got_loss, got = step_loss_and_grads(model, batches, fused_head=FusedHead(head, "cce"), autocast=bf16)
    assert len(fake_cce) == 2 and all(call["reduction"] == "sum" for call in fake_cce)
    assert got.keys() == ours.keys() and "lm_head.weight" in got
    torch.testing.assert_close(got_loss, ours_loss, rtol=BF16_MODEL_LOSS_REL, atol=0)
    for name, grad in got.items():
        assert grad.dtype == torch.float32, name
        _bf16_close(grad, ours[name], name)


def test_the_optimizer_step_on_cuda_with_cce_runs_cce_and_matches_ours(fake_cce):
    opt, got, want = cuda_step_against_ours("cce", precision="bf16")
    assert opt.fused_head.kernel == "cce" and "cut-cross-entropy" in opt.fused_choice
    assert len(fake_cce) == 1 and fake_cce[0]["dtypes"] == (torch.bfloat16, torch.bfloat16)
    torch.testing.assert_close(got.loss_sum, want.loss_sum, rtol=BF16_MODEL_LOSS_REL, atol=0)
    torch.testing.assert_close(got.grad_norm, want.grad_norm, rtol=BF16_MODEL_LOSS_REL, atol=0)


def test_a_lora_adapted_head_keeps_ours_and_says_so(fake_cce):
    """cut-cross-entropy multiplies one weight: a LoRA head's B (the weight's columns kept apart) is not
    among its operands, so the adapted head runs ours, and the run's fused-head choice names ours."""
    import dataclasses
    from unittest import mock

    from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
    from fastlm.engine.train.step import make_optimization
    from tests.support.linear_loss import RANK, lora_head_model

    hidden, weight, _, targets = inputs()
    up = torch.randn(weight.size(0), RANK)
    wide = torch.cat([hidden, torch.randn(hidden.size(0), RANK)], 1)
    got = liger.fused_linear_cross_entropy_sum("cce", wide, weight, targets, up=up)
    assert not fake_cce
    torch.testing.assert_close(got, linear_cross_entropy_sum(wide, weight, targets, up=up))
    raw = {
        "loss": {"fused_linear": True, "fused_linear_kernel": "cce"},
        "model": {"liger": "off"},
        "runtime": {"float8": "off", "compile": False, "precision": "bf16"},
    }
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="bf16", compile=False))
    cuda = dataclasses.replace(runtime, device=CUDA)
    with mock.patch.object(torch.cuda, "is_available", lambda: False):  # peft asks for a CUDA stream
        model = lora_head_model()
    opt = make_optimization(model, parse_train_params(raw), cuda, total_steps=2)
    assert opt.fused_head is not None and opt.fused_head.kernel == "fastlm", opt.fused_choice
    assert "cut-cross-entropy takes no LoRA adapter" in opt.fused_choice
