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
from tests.support.tolerances import OTHER_FP32_KERNEL, OTHER_FP32_KERNEL_GRAD, reordered_sum_rtol

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too

VOCAB = 301
CUDA = torch.device("cuda")


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
        return F.cross_entropy(e @ c.T, targets, ignore_index=ignore_index, reduction=reduction)

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


def test_the_cce_call_gives_our_loss_and_gradients_with_ignored_rows(fake_cce):
    hidden, weight, _, targets = inputs(bias=False)
    ours, our_grads = loss_and_grads(linear_cross_entropy_sum, hidden, weight, None, targets)
    got, grads = loss_and_grads(
        lambda h, w, t, b: cce.cce_linear_cross_entropy_sum(h, w, t), hidden, weight, None, targets
    )
    (call,) = fake_cce
    assert call["reduction"] == "sum" and call["shift"] is False and call["ignore_index"] == -100
    assert call["softcap"] is None and call["contiguous"] and got.dtype == torch.float32
    torch.testing.assert_close(got, ours, rtol=reordered_sum_rtol(targets.numel() * weight.size(0)), atol=0)
    for grad, want in zip(grads[:2], our_grads[:2], strict=True):
        torch.testing.assert_close(grad, want, **OTHER_FP32_KERNEL_GRAD)
    assert grads[0][targets == -100].abs().sum() == 0


def test_the_hidden_states_reach_cce_in_the_weights_dtype(fake_cce):
    hidden, weight, _, targets = inputs(bias=False)
    cce.cce_linear_cross_entropy_sum(hidden, weight.to(torch.bfloat16), targets)
    assert fake_cce[0]["dtypes"] == (torch.bfloat16, torch.bfloat16)


def test_a_head_with_a_bias_keeps_ours(fake_cce):
    hidden, weight, bias, targets = inputs()
    got = liger.fused_linear_cross_entropy_sum("cce", hidden, weight, targets, bias)
    assert not fake_cce
    torch.testing.assert_close(got, linear_cross_entropy_sum(hidden, weight, targets, bias))


def test_a_training_step_through_cce_equals_ours(fake_cce):
    """Two micro-batches of different target counts: cce's sums over the step's global target count give our
    step's loss and every gradient."""
    model = tiny_llama()
    head, _ = fused_head_choice(model, True)
    batches = [packed_batch(VOCAB), packed_batch(VOCAB)]
    batches[1]["labels"][:, :12] = -100
    ours_loss, ours = step_loss_and_grads(model, batches, fused_head=head)
    assert not fake_cce
    got_loss, got = step_loss_and_grads(model, batches, fused_head=FusedHead(head, "cce"))
    assert len(fake_cce) == 2 and all(call["reduction"] == "sum" for call in fake_cce)
    assert got.keys() == ours.keys() and "lm_head.weight" in got
    torch.testing.assert_close(got_loss, ours_loss, **OTHER_FP32_KERNEL)
    for name, grad in got.items():
        torch.testing.assert_close(grad, ours[name], **OTHER_FP32_KERNEL_GRAD, msg=name)


def test_the_optimizer_step_on_cuda_with_cce_runs_cce_and_matches_ours(fake_cce):
    opt, got, want = cuda_step_against_ours("cce")
    assert opt.fused_head.kernel == "cce" and "cut-cross-entropy" in opt.fused_choice
    assert len(fake_cce) == 1
    torch.testing.assert_close(got.loss_sum, want.loss_sum, **OTHER_FP32_KERNEL)
    torch.testing.assert_close(got.grad_norm, want.grad_norm, **OTHER_FP32_KERNEL_GRAD)
