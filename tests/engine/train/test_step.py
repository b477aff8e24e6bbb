"""One optimizer step: ``train_step``'s update equals AdamW's first step written out by hand on the
token-mean loss's gradients, and it reports the loss sum, the target count and the rate it used."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from fastlm.engine.train.schedule import AppliedStepsLR
from fastlm.engine.train.step import Optimization, train_step
from tests.support.tolerances import OTHER_FP32_KERNEL_GRAD, OTHER_FP32_MODEL, TRAINED_FP32_WEIGHTS
from tests.support.toy_training import VOCAB, toy_model

pytestmark = pytest.mark.kernels

LR, BETAS, EPS, DECAY = 1e-3, (0.9, 0.95), 1e-8, 0.1


def _batch(seed: int = 3) -> dict:
    input_ids = torch.randint(2, VOCAB, (2, 10), generator=torch.Generator().manual_seed(seed))
    labels = input_ids.clone()
    labels[0, :4] = -100  # a prompt left out of the loss
    return {"input_ids": input_ids, "labels": labels}


def _optimization(model) -> Optimization:
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=DECAY)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    return Optimization(model, optimizer, scheduler, torch.amp.GradScaler("cpu", enabled=False), math.inf)


def test_one_step_is_adamw_first_step_on_the_token_mean_gradient():
    """Two comparisons, each with the tolerance of its own computation: the gradients the optimizer saw
    against a plain backward of the token-mean loss, and the update against AdamW's first step written out on
    those same gradients (on the hand backward's gradients, an entry within ~eps of zero flips g / |g| from
    one CPU kernel set to another)."""
    model, batch = toy_model(), _batch()
    by_hand = copy.deepcopy(model)
    logits = by_hand(input_ids=batch["input_ids"]).logits
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), batch["labels"][:, 1:].reshape(-1))
    loss.backward()
    targets = int((batch["labels"][:, 1:] != -100).sum())
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", compile=False, num_threads=1))
    opt = _optimization(model)
    seen = {}
    opt.optimizer.register_step_pre_hook(
        lambda optimizer, args, kwargs: seen.update(
            {id(p): p.grad.clone() for group in optimizer.param_groups for p in group["params"]}
        )
    )

    result = train_step(model, [batch], opt, runtime=runtime)

    assert result.target_tokens == targets and result.lr == LR
    torch.testing.assert_close(result.loss_sum / targets, loss.detach(), **OTHER_FP32_MODEL)
    for (name, after), before in zip(model.named_parameters(), by_hand.parameters(), strict=True):
        grad = seen[id(after)]
        torch.testing.assert_close(grad, before.grad, **OTHER_FP32_KERNEL_GRAD, msg=name)
        # AdamW's first step: bias-corrected m / sqrt(v) is g / |g|, decoupled weight decay first
        expected = before.detach() * (1 - LR * DECAY) - LR * grad / (grad.abs() + EPS)
        torch.testing.assert_close(after.detach(), expected, **TRAINED_FP32_WEIGHTS, msg=name)
        assert after.grad is None  # gradients are zeroed (set to None) after the step


def test_the_fused_head_is_chosen_once_and_every_step_runs_that_one(monkeypatch):
    import fastlm.engine.train.step as step_module
    from fastlm.engine.config import parse_train_params
    from fastlm.engine.model.accumulation import FusedHead

    params = parse_train_params({"loss": {"fused_linear": True}, "runtime": {"float8": "off"}})
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", compile=False, num_threads=1))
    model = toy_model()
    opt = step_module.make_optimization(model, params, runtime, total_steps=3)
    assert isinstance(opt.fused_head, FusedHead)
    assert opt.fused_head.head is model.get_output_embeddings() and opt.fused_head.kernel == "fastlm"
    seen, accumulate = [], step_module.accumulate_gradients

    def recording(*args, **kwargs):
        seen.append(kwargs["fused_head"])
        return accumulate(*args, **kwargs)

    monkeypatch.setattr(step_module, "accumulate_gradients", recording)
    for _ in range(2):
        train_step(model, [_batch()], opt, runtime=runtime)
    assert len(seen) == 2 and all(head is opt.fused_head for head in seen)


class _GraphOutputLinear(torch.autograd.Function):
    """``x @ weight.T`` whose weight gradient is written into ``buffer`` and handed to autograd as a new
    tensor on it, as a CUDA graph hands out its outputs: each replay writes the same memory (torch's CUDA
    graph trees keep a backward's outputs in the graph's own pool). ``buffer`` None: a fresh tensor each
    time, the same arithmetic."""

    @staticmethod
    def forward(ctx, x, weight, buffer):
        ctx.save_for_backward(x, weight)
        ctx.buffer = buffer
        return x @ weight.t()

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        flat = grad.reshape(-1, grad.shape[-1])
        out = ctx.buffer if ctx.buffer is not None else torch.empty_like(weight)
        out.copy_(flat.t() @ x.reshape(-1, x.shape[-1]).to(grad.dtype))
        return grad @ weight.to(grad.dtype), out.view(out.shape), None


def _graph_output_layers(model, static: bool = True) -> dict[str, torch.Tensor]:
    """Every projection of the decoder layers through ``_GraphOutputLinear``: {weight name: its buffer}."""
    buffers = {}
    for name, module in model.model.layers.named_modules():
        if isinstance(module, torch.nn.Linear):
            buffer = buffers[name] = torch.empty_like(module.weight) if static else None
            module.forward = lambda x, module=module, buffer=buffer: _GraphOutputLinear.apply(
                x, module.weight, buffer
            )
    return buffers


def test_micro_batches_accumulate_where_each_layers_gradients_are_graph_outputs():
    """``compile_mode: reduce-overhead`` with several micro-batches a step and no fp32 masters to move each
    one's gradients out (``param_dtype: fp32`` here). Autograd makes a weight's first gradient its ``.grad``
    without a copy: the graph's memory, which the next micro-batch's replay overwrites (the first micro-batch
    lost, the last one counted twice). The step owns each gradient after every micro-batch but the last: its
    gradients equal those of a step over plain layers (another kernel: x @ W.T against F.linear)."""
    from fastlm.engine.config import parse_train_params
    from fastlm.engine.train.step import make_optimization

    shared = {"float8": "off", "param_dtype": "fp32"}
    graphs = {**shared, "device": "auto", "compile": True, "compile_scope": "layers"}
    other = {
        "batching": {"mode": "packed", "gradient_accumulation_steps": 3},
        "loss": {"fused_linear": False},
    }
    with_graphs = parse_train_params({"runtime": {**graphs, "compile_mode": "reduce-overhead"}, **other})
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", compile=False, num_threads=1))
    micro_batches = [_batch(seed) for seed in (3, 4, 5)]
    seen: dict[str, dict[str, torch.Tensor]] = {}
    buffers = {}
    for side, params in (
        ("graphs", with_graphs),
        ("plain", parse_train_params({"runtime": shared, **other})),
    ):
        model = toy_model()
        if side == "graphs":
            buffers = _graph_output_layers(model)
        opt = make_optimization(model, params, runtime, total_steps=2)
        assert opt.masters is None
        names = {id(param): name for name, param in model.named_parameters()}
        grads = seen[side] = {}
        opt.optimizer.register_step_pre_hook(
            lambda optimizer, args, kwargs, grads=grads, names=names: grads.update(
                {names[id(p)]: p.grad.clone() for group in optimizer.param_groups for p in group["params"]}
            )
        )
        result = train_step(model, micro_batches, opt, runtime=runtime)
        assert result.target_tokens == sum(int((b["labels"][:, 1:] != -100).sum()) for b in micro_batches)
        assert all(param.grad is None for param in model.parameters())

    assert len(buffers) == 2 * 7  # every projection of both layers gave its gradient as a graph output
    assert seen["graphs"].keys() == seen["plain"].keys()
    for name, grad in seen["plain"].items():
        torch.testing.assert_close(seen["graphs"][name], grad, **OTHER_FP32_KERNEL_GRAD, msg=name)


def test_a_module_kept_in_fp32_beside_bf16_masters_owns_its_graph_output_gradients():
    """bf16 weights with fp32 masters move each micro-batch's gradients out of the graphs' memory; a module
    ``_keep_in_fp32_modules`` names (T5's ``wo``) has no master and keeps its gradient on the weight: the step
    owns that one after each micro-batch. Against the same layers handing out fresh gradients (the same
    arithmetic): the same gradients, bit for bit."""
    from fastlm.engine.config import parse_train_params
    from fastlm.engine.train.step import make_optimization

    graphs = {"device": "auto", "compile": True, "compile_scope": "layers", "compile_mode": "reduce-overhead"}
    params = parse_train_params(
        {
            "runtime": {**graphs, "float8": "off", "param_dtype": "bf16", "precision": "bf16"},
            "batching": {"mode": "packed", "gradient_accumulation_steps": 3},
            "loss": {"fused_linear": False},
        }
    )
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="bf16", compile=False, num_threads=1))
    micro_batches = [_batch(seed) for seed in (3, 4, 5)]
    seen = {}
    for static in (True, False):
        model = toy_model()
        model._keep_in_fp32_modules = ["down_proj"]
        _graph_output_layers(model, static=static)
        opt = make_optimization(model, params, runtime, total_steps=2)
        kept = [p for p in model.parameters() if p.dtype == torch.float32 and p.requires_grad]
        assert opt.masters is not None and kept and all(opt.masters.master_of(p) is p for p in kept)
        grads = seen[static] = []
        opt.optimizer.register_step_pre_hook(
            lambda optimizer, args, kwargs, grads=grads: grads.extend(
                p.grad.clone() for group in optimizer.param_groups for p in group["params"]
            )
        )
        train_step(model, micro_batches, opt, runtime=runtime)
    assert len(seen[True]) == len(seen[False]) > 0
    for graphed, fresh in zip(seen[True], seen[False], strict=True):
        assert torch.equal(graphed, fresh)


def _fp16_steps(kernel: dict, steps: int, overflow_at: int, device: str = "cpu"):
    """``steps`` steps of the toy model under an enabled GradScaler, the gradients of step ``overflow_at``
    made infinite (the scaler skips that update); the optimizer, the scheduler, each step's rate."""
    from fastlm.engine.train.schedule import LRSchedule, make_lr_scheduler

    model = toy_model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, **kernel)
    schedule = LRSchedule(LR, total_steps=8, warmup_steps=4, decay="cosine")
    scaler = torch.amp.GradScaler(device)
    scheduler = make_lr_scheduler(optimizer, schedule, scaler=scaler)
    opt = Optimization(model, optimizer, scheduler, scaler, math.inf)
    runtime = setup_runtime(RuntimeConfig(device=device, precision="fp32", compile=False, num_threads=1))
    weight = model.get_input_embeddings().weight
    rates = []
    for step in range(1, steps + 1):
        hook = weight.register_hook(lambda grad: grad * math.inf) if step == overflow_at else None
        batch = {key: value.to(device) for key, value in _batch(step).items()}
        rates.append(float(train_step(model, [batch], opt, runtime=runtime).lr))
        if hook is not None:
            hook.remove()
    return schedule, scheduler, rates


@pytest.mark.parametrize("kernel", [{"fused": True}, {"foreach": True}], ids=["fused", "foreach"])
def test_an_fp16_step_the_scaler_skips_does_not_advance_the_schedule(kernel):
    """The Trainer's rule (``optimizer_step_was_skipped``): a skipped update leaves the schedule where it was.
    After 5 steps of which the 2nd overflowed, the next rate is the schedule's after 4 applied steps (the
    fused kernel skips on the device, the foreach path on the host); the saved scheduler state counts 4, so a
    resumed run continues from there. The fused path's rate is a float32 tensor (the type CUDA's kernel reads)
    against the host float64: rtol 1e-7."""
    schedule, scheduler, rates = _fp16_steps(kernel, steps=5, overflow_at=2)
    expected = [schedule.lr_at(k) for k in (0, 1, 1, 2, 3)]  # the skipped step's rate is used again
    torch.testing.assert_close(rates, expected, rtol=1e-7, atol=0.0)
    state = scheduler.state_dict()
    assert state["last_epoch"] == 4
    torch.testing.assert_close(float(state["_last_lr"][0]), schedule.lr_at(4), rtol=1e-7, atol=0.0)
    lrs = [float(group["lr"]) for group in scheduler.optimizer.param_groups]
    torch.testing.assert_close(lrs, [schedule.lr_at(4)], rtol=1e-7, atol=0.0)
    resumed = _fp16_steps(kernel, steps=0, overflow_at=0)[1]
    resumed.load_state_dict(state)  # the rate the resumed run's first update uses
    lrs = [float(lr) for lr in resumed.get_last_lr()]
    torch.testing.assert_close(lrs, [schedule.lr_at(4)], rtol=1e-7, atol=0.0)


def test_the_device_rate_given_to_the_fused_kernel_is_float32():
    """CUDA's fused AdamW reads a tensor rate as ``const float*`` (``lr.const_data_ptr<float>()``): a
    float64 rate fails there at the first step, though the CPU kernel (which reads it as a double) takes it.
    The rates the applied-steps schedule puts in the groups and reports are float32."""
    scheduler = _fp16_steps({"fused": True}, steps=2, overflow_at=0)[1]
    assert isinstance(scheduler, AppliedStepsLR)
    assert [group["lr"].dtype for group in scheduler.optimizer.param_groups] == [torch.float32]
    assert [lr.dtype for lr in scheduler.get_last_lr()] == [torch.float32]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_an_fp16_step_cuda_s_fused_kernel_skips_leaves_the_schedule_where_it_was():
    """On CUDA, where the fused kernel reads the device rate itself (as a float32) and skips an overflowed
    update on the device: the rates of 5 steps whose 2nd overflowed are the schedule's after 0, 1, 1, 2, 3
    applied updates, the saved state counts 4. float32 rate against the host float64: rtol 1e-7."""
    schedule, scheduler, rates = _fp16_steps({"fused": True}, steps=5, overflow_at=2, device="cuda")
    assert isinstance(scheduler, AppliedStepsLR)
    expected = [schedule.lr_at(k) for k in (0, 1, 1, 2, 3)]
    torch.testing.assert_close(rates, expected, rtol=1e-7, atol=0.0)
    assert scheduler.state_dict()["last_epoch"] == 4
