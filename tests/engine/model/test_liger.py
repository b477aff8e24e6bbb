"""liger-kernel's calling contract, on CPU: the fused linear cross-entropy through liger gives our loss and
gradients (the sum over the targets, label smoothing, ignore_index, the bias, fp32 accumulation asked for),
``auto`` picks it on CUDA with liger and keeps ours elsewhere, and the model patch calls the family's
``apply_liger_kernel_to_<family>`` on the instance with liger's cross-entropy options off.

liger needs CUDA and Triton: a stand-in ``liger_kernel`` package (its cross-entropy kernel's arithmetic in
plain torch, one row per program as liger 0.8's Triton kernel documents it; the patch functions recording
their calls, with liger 0.8's signatures) and a patched ``torch.cuda.is_available`` stand in. The kernels
themselves run in ``benchmarks/gpu_speed.py`` on a GPU."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from fastlm.engine.config import parse_train_params
from fastlm.engine.model import liger
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
from tests.support.tolerances import (
    BF16_VS_FP32,
    OTHER_FP32_KERNEL,
    OTHER_FP32_KERNEL_GRAD,
    reordered_sum_rtol,
)

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too

VOCAB = 301
CUDA = torch.device("cuda")
# liger 0.8's liger_cross_entropy_kernel's parameters (liger_kernel/ops/cross_entropy.py)
LIGER_KERNEL_ARGS = (
    "X_ptr X_stride Y_ptr Y_stride weight_ptr loss_ptr z_loss_ptr loss_stride token_accuracy_ptr "
    "token_accuracy_stride predicted_tokens_ptr predicted_tokens_stride n_cols n_non_ignore "
    "sum_non_ignore_weight weight_sum ignore_index lse_square_scale label_smoothing reduction softcap "
    "RETURN_Z_LOSS RETURN_TOKEN_ACCURACY RETURN_PREDICTED_TOKENS BLOCK_SIZE HAS_WEIGHT HAS_SOFTCAPPING "
    "HAS_GRADIENTS"
).split()


@pytest.fixture
def fake_liger(monkeypatch):
    """``liger_kernel`` with ``transformers.functional.liger_fused_linear_cross_entropy`` in plain torch and
    ``transformers.apply_liger_kernel_to_{llama,gemma}`` recording their calls; CUDA "available"."""
    calls: list[tuple[str, dict]] = []

    def liger_fused_linear_cross_entropy(
        input,
        weight,
        target,
        bias=None,
        ce_weight=None,
        ignore_index=-100,
        lse_square_scale=0.0,
        label_smoothing=0.0,
        reduction="mean",
        softcap=None,
        return_z_loss=False,
        accum_dtype=None,
        use_token_scaling=False,
        return_token_accuracy=False,
        return_predicted_tokens=False,
    ):
        calls.append(
            (
                "flce",
                {
                    "bias": bias is not None,
                    "ignore_index": ignore_index,
                    "label_smoothing": label_smoothing,
                    "reduction": reduction,
                    "accum_dtype": accum_dtype,
                    "dtypes": (input.dtype, weight.dtype),
                },
            )
        )
        logits = input @ weight.T + (bias if bias is not None else 0)
        return F.cross_entropy(
            logits, target, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing
        )

    class CrossEntropyKernel:
        """liger 0.8's ``liger_cross_entropy_kernel[(rows,)](...)``: per row of ``X_ptr`` (a logits chunk,
        [rows, n_cols]), the row's loss into ``loss_ptr`` and, with ``HAS_GRADIENTS``, d(loss)/d(logits)
        in place in ``X_ptr``; a row whose target is ``ignore_index`` is zeroed and scores nothing. The
        arithmetic in fp32, as the Triton kernel's (eps = label_smoothing / n_cols; sum: no division)."""

        arg_names = LIGER_KERNEL_ARGS

        def __getitem__(self, grid):
            return lambda **kw: self.launch(grid, **kw)

        def launch(self, grid, **kw):
            calls.append(("ce_kernel", {"grid": grid, **kw, "dtype": kw["X_ptr"].dtype}))
            x, y, loss = kw["X_ptr"], kw["Y_ptr"], kw["loss_ptr"]
            assert grid == (x.size(0),) and x.is_contiguous() and kw["n_cols"] == x.size(1)
            assert kw["reduction"] == "sum" and not kw["HAS_WEIGHT"] and not kw["HAS_SOFTCAPPING"]
            keep = (y != kw["ignore_index"]).unsqueeze(1)
            logits, smoothing = x.float(), kw["label_smoothing"]
            lse = torch.logsumexp(logits, dim=-1, keepdim=True)
            picked = logits.gather(1, torch.where(keep.squeeze(1), y, 0).unsqueeze(1))
            row_loss = lse - picked
            if smoothing > 0:
                smooth = -(smoothing / x.size(1)) * logits.sum(-1, keepdim=True) + smoothing * lse
                row_loss = row_loss * (1 - smoothing) + smooth
            loss.copy_(torch.where(keep, row_loss, loss.unsqueeze(1)).squeeze(1))
            if kw["HAS_GRADIENTS"]:
                grad = torch.softmax(logits, dim=-1) - smoothing / x.size(1)
                grad.scatter_add_(1, torch.where(keep.squeeze(1), y, 0).unsqueeze(1), -(1 - smoothing) * keep)
                x.copy_(grad * keep)
            else:
                x.mul_(keep)

    def apply_liger_kernel_to_llama(
        rope=True,
        cross_entropy=False,
        fused_linear_cross_entropy=True,
        rms_norm=True,
        swiglu=True,
        model=None,
    ):
        calls.append(("llama", dict(locals())))

    def apply_liger_kernel_to_gemma(
        rope=True, cross_entropy=False, fused_linear_cross_entropy=True, rms_norm=True, geglu=True, model=None
    ):
        calls.append(("gemma", dict(locals())))

    root = types.ModuleType("liger_kernel")
    package = types.ModuleType("liger_kernel.transformers")
    functional = types.ModuleType("liger_kernel.transformers.functional")
    ops = types.ModuleType("liger_kernel.ops")
    cross_entropy = types.ModuleType("liger_kernel.ops.cross_entropy")
    functional.liger_fused_linear_cross_entropy = liger_fused_linear_cross_entropy
    cross_entropy.liger_cross_entropy_kernel = CrossEntropyKernel()
    cross_entropy.MAX_FUSED_SIZE = 65536 // 2
    package.apply_liger_kernel_to_llama = apply_liger_kernel_to_llama
    package.apply_liger_kernel_to_gemma = apply_liger_kernel_to_gemma
    package.functional, root.transformers = functional, package
    ops.cross_entropy, root.ops = cross_entropy, ops
    for name, module in (
        ("liger_kernel", root),
        ("liger_kernel.transformers", package),
        ("liger_kernel.transformers.functional", functional),
        ("liger_kernel.ops", ops),
        ("liger_kernel.ops.cross_entropy", cross_entropy),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    import peft.tuners.lora  # noqa: F401  # bitsandbytes loaded first: with CUDA "available" it reaches for CUDA

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return calls


@pytest.fixture
def no_liger(monkeypatch):
    """A CUDA machine without liger-kernel (``None`` in ``sys.modules``: the import fails)."""
    monkeypatch.setitem(sys.modules, "liger_kernel", None)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", None)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.functional", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


# --- the fused linear cross-entropy ------------------------------------------------------------------------


def test_auto_takes_liger_on_cuda_with_liger_and_ours_everywhere_else(fake_liger):
    assert liger.linear_ce_kernel_choice("auto", CUDA)[0] == "liger"
    assert liger.linear_ce_kernel_choice("liger", CUDA)[0] == "liger"
    assert liger.linear_ce_kernel_choice("fastlm", CUDA)[0] == "fastlm"
    kernel, why = liger.linear_ce_kernel_choice("auto", torch.device("cpu"))
    assert kernel == "fastlm" and "not on a CUDA device" in why
    with pytest.raises(ConfigError) as refused:
        liger.linear_ce_kernel_choice("liger", torch.device("cpu"))
    assert "train.loss.fused_linear_kernel" in str(refused.value) and "\n" not in str(refused.value)


def test_without_liger_auto_keeps_ours_and_liger_is_refused_in_one_line(no_liger):
    kernel, why = liger.linear_ce_kernel_choice("auto", CUDA)
    assert kernel == "fastlm" and "pip install liger-kernel" in why
    with pytest.raises(ConfigError, match="liger-kernel is not installed"):
        liger.linear_ce_kernel_choice("liger", CUDA)


def kernel_launches(calls):
    return [call for name, call in calls if name == "ce_kernel"]


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_liger_kernel_gives_our_loss_and_gradients_with_bias_and_ignored_rows(fake_liger, smoothing):
    """Our chunk loop over liger's Triton cross-entropy kernel (not liger's autograd function, which reads
    the target count back to the host and compares the incoming gradient with 1 on the host): chunks of
    liger's size (vocab / hidden tokens, a power of two), the sum reduction, every argument by name."""
    hidden, weight, bias, targets = inputs()
    ours, our_grads = loss_and_grads(
        linear_cross_entropy_sum, hidden, weight, bias, targets, label_smoothing=smoothing
    )
    got, grads = loss_and_grads(
        liger.liger_linear_cross_entropy_sum, hidden, weight, bias, targets, label_smoothing=smoothing
    )
    launches = kernel_launches(fake_liger)
    assert [name for name, _ in fake_liger] == ["ce_kernel"] * len(launches)  # not liger's function
    chunk = 2  # 37 tokens: next power of two of ceil(37 / ceil(301 / 16))
    assert [call["grid"] for call in launches] == [(chunk,)] * (len(targets) // chunk) + [(1,)]
    assert set(launches[0]) - {"grid", "dtype"} == {*LIGER_KERNEL_ARGS, "num_warps"}
    assert all(c["reduction"] == "sum" and c["label_smoothing"] == smoothing for c in launches)
    assert all(c["HAS_GRADIENTS"] and c["BLOCK_SIZE"] == 512 and c["ignore_index"] == -100 for c in launches)
    assert got.dtype == torch.float32
    # whole logits vs chunked: the same terms summed in another order
    torch.testing.assert_close(got, ours, rtol=reordered_sum_rtol(targets.numel() * weight.size(0)), atol=0)
    for grad, want in zip(grads, our_grads, strict=True):
        torch.testing.assert_close(grad, want, **OTHER_FP32_KERNEL_GRAD)
    assert grads[0][targets == -100].abs().sum() == 0


def test_the_liger_kernel_path_reads_nothing_back_to_the_host(fake_liger):
    """On the H100 (docs/gpu-runs/2026-11-27-h100-gpu_speed_lora.log) liger's function made 3 host syncs per
    micro-batch: ``.item()`` of the target count, ``torch.equal`` of the incoming gradient with 1. Our loop
    over its kernel makes none, in the forward or the backward (scaled by a gradient other than 1)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class HostReads(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.reads = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten._local_scalar_dense, torch.ops.aten.equal):
                self.reads.append(str(func))
            return func(*args, **(kwargs or {}))

    hidden, weight, bias, targets = inputs()
    leaves = [x.clone().requires_grad_() for x in (hidden, weight, bias)]
    with HostReads() as mode:
        loss = liger.liger_linear_cross_entropy_sum(leaves[0], leaves[1], targets, leaves[2])
        (loss / torch.tensor(7.0)).backward()
    assert kernel_launches(fake_liger) and all(leaf.grad is not None for leaf in leaves)
    assert mode.reads == []


def test_the_liger_kernel_multiplies_in_autocasts_dtype(fake_liger):
    """As our kernel and the plain head under autocast: bf16 products over fp32 weights in a bf16 run (liger's
    function multiplied in the weight's dtype, fp32 there), the weight's dtype without autocast."""
    hidden, weight, _, targets = inputs()
    liger.liger_linear_cross_entropy_sum(hidden, weight.to(torch.bfloat16), targets)
    assert {c["dtype"] for c in kernel_launches(fake_liger)} == {torch.bfloat16}
    fake_liger.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, grads = loss_and_grads(liger.liger_linear_cross_entropy_sum, hidden, weight, None, targets)
    assert {c["dtype"] for c in kernel_launches(fake_liger)} == {torch.bfloat16}
    assert loss.dtype == torch.float32 and grads[0].dtype == grads[1].dtype == torch.float32
    want, want_grads = loss_and_grads(linear_cross_entropy_sum, hidden, weight, None, targets)
    torch.testing.assert_close(loss, want, **BF16_VS_FP32)
    for grad, expected in zip(grads[:2], want_grads[:2], strict=True):
        scale = expected.abs().max()
        torch.testing.assert_close(grad / scale, expected / scale, **BF16_VS_FP32)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_a_training_step_through_liger_equals_ours(fake_liger, smoothing):
    """Two micro-batches of different target counts: liger's sums over the step's global target count give
    our step's loss and every gradient (a mean per micro-batch would not)."""
    model = tiny_llama()
    head, _ = fused_head_choice(model, True)
    batches = [packed_batch(VOCAB), packed_batch(VOCAB)]
    batches[1]["labels"][:, :12] = -100
    batches[1].pop("num_target_tokens", None)
    ours_loss, ours = step_loss_and_grads(model, batches, label_smoothing=smoothing, fused_head=head)
    assert not fake_liger
    got_loss, got = step_loss_and_grads(
        model, batches, label_smoothing=smoothing, fused_head=FusedHead(head, "liger")
    )
    launches = kernel_launches(fake_liger)
    assert len(launches) >= 2 and len(launches) == len(fake_liger)  # both micro-batches, by our loop
    assert all(c["reduction"] == "sum" and c["label_smoothing"] == smoothing for c in launches)
    assert got.keys() == ours.keys() and "lm_head.weight" in got
    torch.testing.assert_close(got_loss, ours_loss, **OTHER_FP32_KERNEL)
    for name, grad in got.items():
        torch.testing.assert_close(grad, ours[name], **OTHER_FP32_KERNEL_GRAD, msg=name)


def test_the_optimizer_step_on_cuda_with_liger_runs_liger_and_matches_ours(fake_liger):
    opt, got, want = cuda_step_against_ours("auto")  # auto: liger on CUDA with liger-kernel
    assert opt.fused_head.kernel == "liger" and "liger-kernel" in opt.fused_choice
    assert kernel_launches(fake_liger) and len(kernel_launches(fake_liger)) == len(fake_liger)
    torch.testing.assert_close(got.loss_sum, want.loss_sum, **OTHER_FP32_KERNEL)
    torch.testing.assert_close(got.grad_norm, want.grad_norm, **OTHER_FP32_KERNEL_GRAD)


# --- the model patch ---------------------------------------------------------------------------------------


def tiny_gemma():
    from transformers import GemmaConfig, GemmaForCausalLM

    config = GemmaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
    )
    return GemmaForCausalLM(config)


def test_auto_patches_the_family_on_the_instance_with_liger_cross_entropy_off(fake_liger):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_llama(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    why = liger.apply_liger(model, "auto", CUDA)
    ((name, call),) = fake_liger
    assert name == "llama" and call["model"] is model.get_base_model()  # the transformers model under peft
    assert call["rope"] and call["rms_norm"] and call["swiglu"]
    assert not call["cross_entropy"] and not call["fused_linear_cross_entropy"]  # our loss owns the head
    assert "rope, rms_norm, swiglu" in why
    gemma = tiny_gemma()
    liger.apply_liger(gemma, "on", CUDA)
    name, call = fake_liger[-1]
    assert (
        name == "gemma"
        and call["model"] is gemma
        and call["geglu"]
        and not call["fused_linear_cross_entropy"]
    )


def test_liger_is_off_where_it_cannot_run_and_on_is_refused_in_one_line(fake_liger, caplog):
    from transformers import GPT2Config, GPT2LMHeadModel

    with caplog.at_level("DEBUG", logger="fastlm.engine.model.liger"):
        assert "not on a CUDA device" in liger.apply_liger(tiny_llama(), "auto", torch.device("cpu"))
    assert "not on a CUDA device" in caplog.text  # the reason, logged
    assert "off (train.model.liger: off)" in liger.apply_liger(tiny_llama(), "off", CUDA)
    assert "FSDP2" in liger.apply_liger(tiny_llama(), "auto", CUDA, strategy="fsdp")
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=32))
    assert "gpt2 family" in liger.apply_liger(gpt2, "auto", CUDA)
    with pytest.raises(ConfigError) as refused:
        liger.apply_liger(gpt2, "on", CUDA)
    assert "train.model.liger" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match="not on a CUDA device"):
        liger.apply_liger(tiny_llama(), "on", torch.device("cpu"))
    assert not fake_liger  # nothing patched


def test_a_family_without_a_patch_is_off_for_its_family_not_for_the_package(no_liger):
    """The package is named only where it is all that is missing (the report's advice installs it)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=32))
    why = liger.apply_liger(gpt2, "auto", CUDA)
    assert "gpt2 family" in why and "pip install" not in why
    assert "pip install liger-kernel" in liger.apply_liger(tiny_llama(), "auto", CUDA)


# --- the parameters ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({"loss": {"fused_linear_kernel": "liger"}}, "train.loss.fused_linear_kernel"),
        ({"model": {"liger": "on"}}, "train.model.liger"),
        ({"model": {"liger": True}}, "train.model.liger"),  # YAML's unquoted on
    ],
)
def test_liger_asked_for_on_a_machine_without_cuda_or_liger_is_one_line(raw, says):
    with pytest.raises(ConfigError) as refused:
        parse_train_params(raw)
    message = str(refused.value)
    assert says in message and "\n" not in message and "auto" in message


def test_liger_asked_for_with_cuda_and_liger_passes_but_not_for_a_cpu_run(fake_liger):
    params = parse_train_params({"loss": {"fused_linear_kernel": "liger"}, "model": {"liger": True}})
    assert params.loss.fused_linear_kernel == "liger" and params.model.liger == "on"
    assert parse_train_params({"model": {"liger": False}}).model.liger == "off"
    for raw, says in (
        ({"loss": {"fused_linear_kernel": "liger"}}, "train.loss.fused_linear_kernel"),
        ({"model": {"liger": "on"}}, "train.model.liger"),
    ):
        with pytest.raises(ConfigError) as refused:
            parse_train_params({**raw, "runtime": {"device": "cpu"}})
        assert says in str(refused.value) and "\n" not in str(refused.value)


def test_a_trained_head_on_a_frozen_body_takes_the_liger_kernel_too(fake_liger):
    """liger's function computed the weight's gradient only with the hidden states' (such a head kept ours):
    our loop computes each gradient asked for."""
    hidden, weight, bias, targets = inputs()
    leaves = [weight.clone().requires_grad_(), bias.clone().requires_grad_()]
    want = [leaf.detach().clone().requires_grad_() for leaf in leaves]
    liger.fused_linear_cross_entropy_sum("liger", hidden, *leaves[:1], targets, leaves[1]).backward()
    assert kernel_launches(fake_liger) and all(c["HAS_GRADIENTS"] for c in kernel_launches(fake_liger))
    linear_cross_entropy_sum(hidden, want[0], targets, want[1]).backward()
    for got, expected in zip(leaves, want, strict=True):
        torch.testing.assert_close(got.grad, expected.grad, **OTHER_FP32_KERNEL_GRAD)


REAL_KERNEL_CHECK = """
import torch
from fastlm.engine.model import liger
from fastlm.engine.model.linear_loss import linear_cross_entropy_sum
from tests.support.linear_loss import inputs, loss_and_grads
hidden, weight, bias, targets = inputs()
for smoothing in (0.0, 0.1):
    want, want_grads = loss_and_grads(linear_cross_entropy_sum, hidden, weight, bias, targets,
                                      label_smoothing=smoothing)
    got, grads = loss_and_grads(liger.liger_linear_cross_entropy_sum, hidden, weight, bias, targets,
                                label_smoothing=smoothing)
    torch.testing.assert_close(got, want, rtol=RTOL, atol=0)
    for grad, expected in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(grad, expected, **GRAD)
print("same loss and gradients")
"""


def test_the_real_liger_kernel_under_the_triton_interpreter_gives_our_loss_and_gradients():
    """liger's own Triton kernel, run on CPU by Triton's interpreter (``TRITON_INTERPRET=1``), where Triton
    and liger-kernel are installed (not by the dev install: ``pip install triton liger-kernel`` beside it;
    both passed on 2026-11-27 with triton 3.9.0 and liger-kernel 0.8.0)."""
    pytest.importorskip("triton")
    pytest.importorskip("liger_kernel.ops.cross_entropy")
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    paths = [str(root), str(root / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    tolerances = f"RTOL = {reordered_sum_rtol(37 * VOCAB)}\nGRAD = {OTHER_FP32_KERNEL_GRAD}\n"
    done = subprocess.run(
        [sys.executable, "-c", tolerances + REAL_KERNEL_CHECK],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
        env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(paths)},
    )
    assert done.returncode == 0 and "same loss and gradients" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize(("hip", "warps"), [(None, 32), ("6.2.41133", 16)])
def test_the_kernel_is_launched_with_the_warps_the_gpu_takes(fake_liger, monkeypatch, hip, warps):
    """An AMD GPU (ROCm's torch: ``torch.version.hip``, its device type ``cuda``) runs 64-thread wavefronts:
    32 warps are 2,048 threads, more than a block takes, and the launch fails in the first step. liger's own
    launches take 16 there, 32 on NVIDIA's GPUs: so do fastlm's."""
    monkeypatch.setattr(torch.version, "hip", hip)
    hidden, weight, bias, targets = inputs()
    liger.fused_linear_cross_entropy_sum("liger", hidden, weight.requires_grad_(), targets, bias).backward()
    launches = kernel_launches(fake_liger)
    assert launches and {launch["num_warps"] for launch in launches} == {warps}


@pytest.mark.parametrize("trained_weight", [False, True])
def test_the_liger_kernel_takes_a_lora_heads_columns_kept_apart_as_ours(fake_liger, trained_weight):
    """A LoRA head's B (``up``, the weight's last r columns kept apart): its product added into each chunk's
    logits before liger's kernel, the gradients of the hidden states' r columns and of B from the kernel's
    d(loss)/d(logits); a trained weight's by vocabulary blocks over the same logits. Ours', within the
    reordered sums."""
    from tests.support.linear_loss import RANK

    hidden, weight, bias, targets = inputs()
    generator = torch.Generator().manual_seed(1)
    wide = torch.cat([hidden, torch.randn(hidden.size(0), RANK, generator=generator)], 1)
    up = torch.randn(weight.size(0), RANK, generator=generator) / RANK**0.5
    results = []
    for function in (linear_cross_entropy_sum, liger.liger_linear_cross_entropy_sum):
        leaves = [x.clone().requires_grad_() for x in (wide, weight, bias, up)]
        leaves[1].requires_grad_(trained_weight)
        loss = function(leaves[0], leaves[1], targets, leaves[2], up=leaves[3])
        (loss / 5).backward()
        results.append((loss.detach(), [leaf.grad for leaf in leaves]))
    (ours, our_grads), (got, grads) = results
    assert kernel_launches(fake_liger)
    torch.testing.assert_close(got, ours, rtol=reordered_sum_rtol(targets.numel() * weight.size(0)), atol=0)
    for grad, want in zip(grads, our_grads, strict=True):
        if want is None:
            assert grad is None
            continue
        torch.testing.assert_close(grad, want, **OTHER_FP32_KERNEL_GRAD)


def test_a_training_step_with_a_lora_head_through_liger_equals_the_plain_head(fake_liger):
    """LoRA on the head (dropout on: the same mask) through liger's kernel: the plain peft step's loss and
    every adapter's gradient."""
    from tests.support.linear_loss import lora_head_model, seeded_step

    model = lora_head_model("fastlm", dropout=0.2)
    head, why = fused_head_choice(model, True)
    assert head is model.get_output_embeddings() and "LoRA" in why
    batches = [packed_batch(VOCAB), packed_batch(VOCAB)]
    plain_loss, plain = seeded_step(model, batches)
    got_loss, got = seeded_step(model, batches, fused_head=FusedHead(head, "liger"))
    assert len(kernel_launches(fake_liger)) >= 2
    assert got.keys() == plain.keys() and any("lm_head.lora_B" in name for name in got)
    torch.testing.assert_close(got_loss, plain_loss, **OTHER_FP32_KERNEL)
    for name, grad in got.items():
        torch.testing.assert_close(grad, plain[name], **OTHER_FP32_KERNEL_GRAD, msg=name)
