"""torchao's own float8 layers, on CPU (torch's CPU ``_scaled_mm``): the contract the float8 probe and the
optimizer rely on, checked against the library rather than a stand-in (test_float8_probe.py's)."""

from __future__ import annotations

import math

import pytest
import torch

from fastlm.engine.runtime import float8
from tests.support.tolerances import BF16_VS_FP32
from tests.support.toy_training import run_toy, toy_model, toy_params

torchao = pytest.importorskip("torchao")


@pytest.mark.kernels
def test_the_cpu_float8_matmul_runs_after_bf16_autocast_matmuls_under_any_kernel_set():
    # torch picks oneDNN's float8 matmul from the CPU itself (AMX), not from the kernel set: under a set
    # forced below this CPU's, a bf16 autocast matmul earlier in the process left oneDNN unable to build
    # the float8 one ("could not create a primitive descriptor for the matmul primitive"), and every CPU
    # float8 test after it failed. A CPU of that set takes torch's emulated float8 matmul, which the
    # forced sets take too (tests/conftest.py).
    generator = torch.Generator().manual_seed(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.nn.functional.linear(
            torch.randn(8, 64, generator=generator), torch.randn(32, 64, generator=generator)
        )
    a = torch.randn(32, 64, generator=generator).to(torch.float8_e4m3fn)
    b = torch.randn(48, 64, generator=generator).to(torch.float8_e4m3fn)
    scale_a, scale_b = torch.tensor(0.5), torch.tensor(2.0)
    out = torch._scaled_mm(a, b.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
    # float8 operands are exact in fp32: the fp32 product differs only by its order of sums and the one
    # rounding of the output to bf16
    reference = (a.float() * scale_a) @ (b.float() * scale_b).t()
    torch.testing.assert_close(out.float(), reference.to(torch.bfloat16).float(), **BF16_VS_FP32)


def test_the_probes_swap_keeps_the_parameters_the_optimizer_was_made_with():
    model = toy_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)  # made before the probe converts (build.py)
    before = {name: param for name, param in model.named_parameters()}
    plain = {name: module for name, module in model.named_modules()}
    swap = float8.Float8Swap(model)  # torchao's convert_to_float8_training
    assert len(swap) == float8.float8_layers(model) == 14  # 7 projections x 2 layers; not the head
    assert all(type(module).__name__ == "Float8Linear" for module in swap.float8.values())
    assert {name: param for name, param in model.named_parameters()} == before  # the same objects
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    weight = model.model.layers[0].self_attn.q_proj.weight
    start = weight.detach().clone()
    model(input_ids=ids, labels=ids).loss.backward()
    assert weight.grad is not None and weight.grad.abs().sum() > 0  # float8's backward reaches it
    optimizer.step()
    assert not torch.equal(weight.detach(), start)  # the optimizer made before trains the float8 layer
    swap.use(False)
    assert all(module is plain[name] for name, module in model.named_modules())
    assert float8.float8_layers(model) == 0


def cuda_scaled_mm(real):
    """torch's CUDA ``_scaled_mm`` refuses what its CPU version takes: a first operand whose trailing
    dimension (the inner one), or a second operand whose dimensions, are not multiples of 16
    (cuBLASLt's float8 GEMM). In a training backward torchao's weight gradient is ``grad_out.T @ input``:
    the micro-batch's token count is that inner dimension."""

    def checked(mat1, mat2, *args, **kwargs):
        checked.calls += 1
        if mat1.shape[1] % 16 or mat2.shape[0] % 16 or mat2.shape[1] % 16:
            raise RuntimeError(
                f"Expected trailing dimension of mat1 to be divisible by 16 but got mat1 shape: "
                f"({mat1.shape[0]}x{mat1.shape[1]})."
            )
        return real(mat1, mat2, *args, **kwargs)

    checked.calls = 0
    return checked


@pytest.mark.parametrize(
    ("attn", "mode"),
    [("sdpa_varlen", "packed"), ("sdpa", "packed"), ("sdpa_varlen", "dynamic"), ("sdpa", "dynamic")],
)  # the varlen row, the dense rows; packed rows, padded samples
def test_float8_training_gives_the_gpu_matmuls_token_counts_they_take(tmp_path, monkeypatch, attn, mode):
    # float8 on a 3B model's full fine-tune (an H100, 2026-11-28) crashed in the first backward: the varlen
    # row's 4,088 tokens were no multiple of 16. Rows of 48 tokens, 4 of them or 3 samples per micro-batch,
    # are left part empty by the toy's lengths: token counts of any value.
    scaled_mm = cuda_scaled_mm(torch._scaled_mm)
    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
    batching = {"mode": mode, "micro_batch_size": 3, "row_length": 48}
    params = toy_params(tmp_path, max_steps=6, eval_every=None, log_every=3, batching=batching)
    # float8 on asks for a float8 GPU: on a CPU torch's _scaled_mm runs torchao's layers all the same
    runtime = params.runtime.model_copy(update={"float8": "on", "precision": "fp32"})
    run = run_toy(params.model_copy(update={"runtime": runtime}), attn=attn)
    assert run.runtime.float8_choice.endswith("14 Linear layers in float8")
    assert scaled_mm.calls >= 6 * 14 * 3  # every step's float8 matmuls (3 a layer) went through the check
    assert all(math.isfinite(record["loss"]) for record in run.history)


def test_a_run_in_one_process_returns_plain_linear_layers_as_several_processes_do(tmp_path):
    # The launcher's model comes back plain (rebuilt in the parent); one process handed back torchao's
    # Float8Linear layers, whose forward (float8 matmuls) is not the model the run saves and predict loads.
    params = toy_params(tmp_path, max_steps=3, eval_every=None, log_every=3)
    runtime = params.runtime.model_copy(update={"float8": "on", "precision": "fp32"})
    model = toy_model()
    weight = model.model.layers[0].self_attn.q_proj.weight
    start = weight.detach().clone()
    run = run_toy(params.model_copy(update={"runtime": runtime}), model=model)
    assert run.runtime.float8_choice.endswith("14 Linear layers in float8")
    assert float8.float8_layers(run.model) == 0
    # the trained Parameter itself, in a plain layer
    assert run.model.model.layers[0].self_attn.q_proj.weight is weight and not torch.equal(weight, start)
    projections = [module for name, module in run.model.named_modules() if name.endswith("proj")]
    assert len(projections) == 14 and all(type(module) is torch.nn.Linear for module in projections)
    saved = toy_model(seed=1)  # other initial weights: the trained ones loaded into the same architecture
    saved.load_state_dict(run.model.state_dict())
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # the same computation (plain Linear layers, the same weights) run twice: exact
        assert torch.equal(run.model(input_ids=ids).logits, saved(input_ids=ids).logits)
