"""One optimizer step, the same for training (``loop.train``) and for the throughput autotune (``tune``).

``make_optimization`` builds what a step updates (AdamW or an 8-bit AdamW, the learning-rate schedule, the
fp16 grad scaler, the clipping threshold; float8 Linear layers where ``train.runtime.float8`` turns them on;
liger's kernels where ``train.model.liger`` patches them in; the fused LM head and its kernel, chosen once);
``train_step`` runs one step: the micro-batches' token-normalised forward/backward
(``accumulation.accumulate_gradients``), unscale, clip, optimizer and scheduler step, zeroed gradients. An
fp16 update the grad scaler skips (overflowed gradients) leaves the schedule where it was, as in the Trainer:
the schedule counts applied updates, the run's step count every step taken (``schedule``).
Nothing is read back on the host: the loss sum and the gradient norm stay on the device for
``metrics.StepMetrics``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from fastlm.engine.config import TrainParams
from fastlm.engine.distributed.parallel import gathered_dtype, is_sharded
from fastlm.engine.model.accumulation import FusedHead, accumulate_gradients
from fastlm.engine.model.liger import apply_liger, linear_ce_kernel_choice
from fastlm.engine.model.linear_loss import fused_head_choice, head_operands
from fastlm.engine.model.loss import router_loss_choice
from fastlm.engine.runtime.environment import Runtime
from fastlm.engine.runtime.float8 import apply_float8
from fastlm.engine.train.master_weights import BackwardUpdates, MasterWeights, choose_param_dtype
from fastlm.engine.train.optim import make_optimizer
from fastlm.engine.train.schedule import AppliedStepsLR, make_lr_scheduler, run_schedule
from fastlm.errors import ConfigError

__all__ = ["Optimization", "StepResult", "make_optimization", "owning_gradients", "train_step"]


@dataclass
class Optimization:
    """What an optimizer step updates: ``model`` is the unwrapped model whose gradients are clipped."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    clip: float  # math.inf: no clipping (the norm is still computed, for the metrics)
    label_smoothing: float = 0.0  # train.loss.label_smoothing: the loss the step optimises
    # train.loss.fused_linear: this head's matmul fused into the loss, run by the kernel that
    # train.loss.fused_linear_kernel chose (fastlm | liger); chosen once, used by every step
    fused_head: FusedHead | None = None
    fused_choice: str = ""  # why (or why not), for the log and the summary
    liger_choice: str = ""  # train.model.liger: whether liger's norm/rotary/MLP kernels are patched in, why
    float8_choice: str = ""  # train.runtime.float8: whether the Linear layers run float8 matmuls, and why
    # train.runtime.param_dtype: bf16 weights whose fp32 masters the optimizer updates (None: the weights
    # themselves, fp32 under autocast or as built)
    masters: MasterWeights | None = None
    param_dtype_choice: str = ""
    # train.optimizer.in_backward: the weights updated in the step's last backward (the masters', or FSDP2's
    # shards), None where the step updates them
    backward: BackwardUpdates | None = None
    # train.runtime.compile_mode reduce-overhead: the compiled layers' gradients are CUDA graph outputs, which
    # the next replay overwrites; a step of several micro-batches owns these weights' gradients after each one
    # (owning_gradients): the trained weights no fp32 master takes the gradients of (chosen once)
    graph_kept: tuple[torch.nn.Parameter, ...] = ()

    def full_precision(self) -> AbstractContextManager:
        """Inside, the model's parameters are the fp32 masters (checkpoints save and load them); a no-op
        without masters."""
        return self.masters.full_precision() if self.masters is not None else nullcontext()

    def release(self) -> None:
        """The model's weights become the fp32 masters for good (the end of a run); a no-op without."""
        if self.masters is not None:
            self.masters.release()
        if self.backward is not None:
            self.backward.release()


@dataclass
class StepResult:
    loss_sum: torch.Tensor  # summed loss over the step's target tokens, on the device
    target_tokens: int
    grad_norm: torch.Tensor  # before clipping, on the device (a DTensor under FSDP2)
    # the rate this update used: a host float, or a 0-d device tensor where the schedule counts the applied
    # fp16 updates on the device (schedule.AppliedStepsLR)
    lr: float | torch.Tensor


def make_optimization(
    model: torch.nn.Module,
    params: TrainParams,
    runtime: Runtime,
    total_steps: int,
    *,
    float8_measured_later: bool = False,
    float8_choice: str | None = None,
    world_size: int | None = None,
) -> Optimization:
    """The optimizer ``train.optimizer.name`` names (AdamW; 8-bit: ``optim.make_optimizer``) with the
    configured schedule over ``total_steps``, the runtime's grad scaler, the clip threshold.
    ``float8_measured_later``: float8 ``auto`` is left to the training run's probe
    (``probe.probe_float8``). ``float8_choice``: float8 settled already (FSDP2 converts before sharding),
    why. ``world_size``: the run's processes (default ``nproc_per_node``; under
    torchrun the process group's)."""
    settings = params.optimizer
    # liger's kernels patched onto the instance before float8 swaps its Linear layers and before compile
    liger_choice = apply_liger(
        model, params.model.liger, runtime.device, strategy=params.distributed.strategy
    )
    # Before compile (the probe compiles later) and before the optimizer: the converted layers keep their
    # Parameters, so the optimizer and DDP's buckets are unchanged. Idempotent: converted layers are skipped.
    if float8_choice is None:
        float8_choice = apply_float8(
            model,
            params.runtime.float8,
            runtime.device,
            strategy=params.distributed.strategy,
            measured_later=float8_measured_later,
            row_length=params.batching.fixed_row_length(),
        )
    # After liger and float8 (their layers keep the same Parameters), before the optimizer and compile
    dtype, param_dtype_choice = choose_param_dtype(
        params.runtime.param_dtype,
        model,
        autocast_dtype=runtime.autocast_dtype,
        world_size=world_size or params.distributed.nproc_per_node,
        device=runtime.device,
        strategy=params.distributed.strategy,
        adapters=params.model.lora.enabled,
    )
    # FSDP2 (wrap_model) gathers its fp32 shards in bf16 itself: they are the masters. LoRA's many small
    # adapters move their gradients once per micro-batch (batched); DDP and in_backward move them by hooks.
    batched = params.model.lora.enabled and (world_size or params.distributed.nproc_per_node) == 1
    batched = batched and not settings.in_backward
    masters = MasterWeights(model, dtype, batched) if dtype is not None and not is_sharded(model) else None
    if is_sharded(model):
        gathered = str(gathered_dtype(model) or "its shards' dtype").removeprefix("torch.")
        param_dtype_choice = f"{param_dtype_choice}; FSDP2 gathers the weights in {gathered}"
    lora = params.model.lora
    optimizer = make_optimizer(
        model,
        settings,
        substitute=masters.master_of if masters else None,
        lora_b_ratio=lora.loraplus_lr_ratio if lora.enabled else None,
    )
    backward = None
    if settings.in_backward and is_sharded(model):  # FSDP2's shards are the masters
        backward = BackwardUpdates.on_shards(optimizer)
        param_dtype_choice += "; each shard updated in the backward (train.optimizer.in_backward)"
    elif settings.in_backward:
        if masters is None:
            raise ConfigError(
                "train.optimizer.in_backward updates the fp32 masters of bf16 weights in the backward and "
                f"this run keeps {param_dtype_choice}.",
                fix="set train.runtime.param_dtype: bf16 (with precision bf16), or in_backward: false.",
            )
        backward = masters.update_in_backward(optimizer)
        param_dtype_choice += "; each master updated in the backward (train.optimizer.in_backward)"
    schedule = run_schedule(settings, total_steps)  # warmup_steps or warmup_ratio's
    clip = settings.grad_clip if settings.grad_clip is not None else math.inf
    head, why = fused_head_choice(model, params.loss.fused_linear)
    fused = None
    if head is not None:
        kernel, kernel_why = linear_ce_kernel_choice(params.loss.fused_linear_kernel, runtime.device)
        if kernel == "cce" and head_operands(head)[2] is not None:  # cce multiplies one weight, no more
            kernel = "fastlm"
            kernel_why = (
                "fastlm's chunked PyTorch kernel (cut-cross-entropy takes no LoRA adapter's columns beside "
                "the head's weight; train.loss.fused_linear_kernel: cce)"
            )
        fused, why = FusedHead(head, kernel), f"{why}, {kernel_why}"
    why += router_loss_choice(model)
    scaler = runtime.make_grad_scaler()
    return Optimization(
        model,
        optimizer,
        make_lr_scheduler(optimizer, schedule, scaler=scaler if backward is None else None),
        scaler,
        clip,
        label_smoothing=params.loss.label_smoothing,
        fused_head=fused,
        fused_choice=why,
        liger_choice=liger_choice,
        float8_choice=float8_choice,
        masters=masters,
        param_dtype_choice=param_dtype_choice,
        backward=backward,
        graph_kept=_gradients_kept(model, masters)
        if params.runtime.compile_mode == "reduce-overhead"
        else (),
    )


def owning_gradients(
    trained: Sequence[torch.nn.Parameter],
    gradient_sync: Callable[[bool], AbstractContextManager] | None = None,
) -> Callable[[bool], AbstractContextManager]:
    """``sync(last)`` for ``accumulate_gradients`` where the layers are CUDA graphs and the ``trained``
    weights keep their gradients (no fp32 master moves them out after each micro-batch: ``param_dtype``
    fp32, precision fp32/fp16, ``auto`` keeping fp32 weights, a module kept in fp32): ``gradient_sync``'s
    context (if any), then after each micro-batch but the last a copy of every gradient the step does not own
    yet. Autograd makes a weight's first gradient its ``.grad`` without a copy, here a graph's output, which
    the next micro-batch's replay overwrites (the first micro-batch's gradient lost, the last one's counted
    twice); later micro-batches add into the step's own copy in place. The last micro-batch's stay where
    they are: nothing replays before the optimizer reads them."""
    owned: dict[torch.nn.Parameter, torch.Tensor] = {}

    @contextlib.contextmanager
    def sync(last: bool) -> Iterator[None]:
        with gradient_sync(last) if gradient_sync is not None else nullcontext():
            yield
        if last:
            return
        with torch.no_grad():
            for param in trained:
                if param.grad is not None and owned.get(param) is not param.grad:
                    param.grad = owned[param] = param.grad.clone()

    return sync


def _gradients_kept(model: torch.nn.Module, masters: MasterWeights | None) -> tuple[torch.nn.Parameter, ...]:
    """The trained weights whose gradients stay on them (no fp32 master moves them out)."""
    return tuple(
        param
        for param in model.parameters()
        if param.requires_grad and (masters is None or masters.master_of(param) is param)
    )


def _stepping(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> torch.Tensor | list | None:
    """Whether the coming ``scaler.step`` applies the update, as far as it is known without a host read:
    None without loss scaling (bf16, fp32: it always does); for an optimizer that skips on the device (fused
    AdamW) the scaler's ``found_inf`` tensor of the unscaled gradients (nonzero: skipped); else a list that
    the optimizer's step appends to (``GradScaler.step`` calls it only where no gradient overflowed, after
    reading ``found_inf`` on the host itself) after the hook's handle, which the caller removes."""
    if not scaler.is_enabled():
        return None
    if getattr(optimizer, "_step_supports_amp_scaling", False):
        found = scaler._found_inf_per_device(optimizer).values()
        return torch.stack([flag.to(scaler._scale.device) for flag in found]).sum()
    stepped: list = []
    stepped.append(optimizer.register_step_post_hook(lambda *_: stepped.append(True)))
    return stepped


def train_step(
    model: torch.nn.Module,
    micro_batches: Sequence[Mapping],
    opt: Optimization,
    *,
    runtime: Runtime,
    total_targets: int | None = None,
    world_size: int = 1,
    gradient_sync: Callable[[bool], AbstractContextManager] | None = None,
) -> StepResult:
    """One optimizer step over ``micro_batches`` (already on the device) with the wrapped/compiled ``model``.

    Out of memory during the forward/backward: the gradients are dropped and the error re-raised (the step's
    update never happened, so the caller may redo it smaller).
    """
    scaler = opt.scaler
    backward = opt.backward  # train.optimizer.in_backward: the weights updated in the last backward
    if opt.masters is not None:  # gradients a probe's backward left (model.zero_grad does not reach masters)
        opt.optimizer.zero_grad(set_to_none=True)
        opt.masters.drop_weight_gradients()
    if backward is not None:
        backward.take_norms()
        gradient_sync = backward.updating(gradient_sync)
    elif opt.masters is not None and opt.masters.batched:  # each micro-batch's gradients into the masters
        gradient_sync = opt.masters.collecting(gradient_sync)
    if opt.graph_kept and len(micro_batches) > 1:  # what no master moved out after each micro-batch
        gradient_sync = owning_gradients(opt.graph_kept, gradient_sync)
    try:
        loss_sum, n_targets = accumulate_gradients(
            model,
            micro_batches,
            autocast=runtime.autocast_context,
            grad_scaler=scaler if scaler.is_enabled() else None,
            total_targets=total_targets,
            world_size=world_size,
            gradient_sync=gradient_sync,
            label_smoothing=opt.label_smoothing,
            fused_head=opt.fused_head,
        )
    except torch.OutOfMemoryError as error:
        opt.optimizer.zero_grad(set_to_none=True)
        if opt.masters is not None:  # the bf16 gradients a cut-short backward left
            opt.model.zero_grad(set_to_none=True)
        if backward is not None and backward.take_norms():  # some weights updated already: no step to redo
            raise RuntimeError(
                "out of memory in the backward of a step whose first weights were already updated "
                "(train.optimizer.in_backward): resume from the last checkpoint with a smaller "
                "train.batching.micro_batch_size, or in_backward false"
            ) from error
        raise
    with torch.profiler.record_function("fastlm.optimizer"):
        if scaler.is_enabled():
            scaler.unscale_(opt.optimizer)
        # with masters, their fp32 gradients (the bf16 weights' were moved there during backward)
        trained = (
            [p for group in opt.optimizer.param_groups for p in group["params"]]
            if opt.masters is not None
            else opt.model.parameters()
        )
        grad_norm = torch.nn.utils.clip_grad_norm_(trained, opt.clip)
        norms = backward.take_norms() if backward is not None else []
        if norms:  # with the norms of the gradients the backward updated and freed (clip is inf there)
            grad_norm = backward.step_norm(norms, grad_norm)
        # the rate this update uses: a host float, or AppliedStepsLR's device tensor (no sync either way)
        lr = opt.scheduler.get_last_lr()[0]
        applied = _stepping(scaler, opt.optimizer)
        scaler.step(opt.optimizer)
        scaler.update()
        if isinstance(applied, list):  # the hook's handle, then True where the optimizer stepped
            applied.pop(0).remove()
            applied = bool(applied)
        if opt.masters is not None:
            opt.masters.publish()
        if isinstance(opt.scheduler, AppliedStepsLR):  # fp16, fused: the skip counted on the device
            opt.scheduler.advance(applied)
        elif applied is None or applied:  # a skipped fp16 update leaves the schedule where it was
            opt.scheduler.step()
        opt.optimizer.zero_grad(set_to_none=True)
    return StepResult(loss_sum, n_targets, grad_norm, lr)
