"""bf16 weights for forward and backward, fp32 masters in the optimizer (``train.runtime.param_dtype``).

A mixed-precision full fine-tune under bf16 autocast over fp32 weights (what the Trainer's ``bf16=True`` does
with a model loaded in fp32) runs its matmuls in bf16 but keeps everything autocast does not touch in fp32:
the embedding's output, so the whole residual stream, the norms' outputs and every add. Each projection then
casts its fp32 input to bf16 (q, k and v each cast the same input; gate and up too), and backward casts each
bf16 input gradient back to fp32 and sums them in fp32: per Llama layer and micro-batch 7 activation-sized
fp32 -> bf16 copies, 5 bf16 -> fp32 copies and 5 fp32 adds, all memory-bound
(tests/engine/train/test_master_weights.py measures the bytes such passes write and keep). On an H100, a 3B
full fine-tune's profile (docs/gpu-runs/2026-11-26-h100-c-gpu_speed_lora.log, eager) spent 33 % of its
kernel time in those three kernels.

``MasterWeights`` keeps the model itself in bf16 (every activation bf16, as in a bf16 model: the norms still
compute in fp32 inside) and an fp32 copy of each trainable weight, which is what the optimizer updates:

- backward: each weight's bf16 gradient is added into its master's fp32 gradient as soon as autograd has it
  (``register_post_accumulate_grad_hook``) and dropped, so micro-batches accumulate in fp32 and no bf16
  gradient outlives its layer's backward;
- the step: clipping and AdamW on the masters (fp32 moments, fp32 updates: an update below bf16's resolution
  still accumulates), then ``publish`` copies the masters into the bf16 weights (one cast per weight and
  step, where autocast cast each weight in every micro-batch's forward);
- ``full_precision()``: the model's parameters point at the masters for as long as it lasts, so a checkpoint
  saves fp32 weights and a checkpoint loads into the masters (resume, early stopping's best step); on exit
  the bf16 weights are refreshed from them. ``release()`` does it for good: the model the run returns is
  fp32, its trained weights the masters.

The weights of ``model._keep_in_fp32_modules`` (transformers' list, e.g. T5's ``wo``) stay fp32 and train as
they are. Under DDP (``reduce_under``) the bf16 gradients of the last micro-batch stay in DDP's buckets and
its reduction (a comm hook) adds them to the masters' local fp32 sums and all-reduces those in fp32: DDP's
own reduction would add the ranks' gradients in the weights' dtype. Under FSDP2 (``strategy: fsdp``) the
same is FSDP2's ``MixedPrecisionPolicy`` (``distributed.wrap_model``): its fp32 shards are the masters,
gathered in bf16, gradients reduce-scattered in fp32. The choice (``choose_param_dtype``): ``auto`` takes
bf16 weights for a full fine-tune on a GPU whose precision is bf16 from the start, else fp32 weights under
autocast (on a CPU ``param_dtype: bf16`` asks for them); a CPU run at precision ``auto`` only learns its
precision from its first micro-batch.

LoRA (its base frozen, in bf16 already) takes the same choice for its adapters, for another reason: they
are a fraction of a percent of the weights, but autocast casts each of them in every micro-batch's forward
and autograd casts each gradient back: 392 casts each way for the 7 projections of a 28-layer model, host
work on a step whose GPU waited for the host (an H200's LoRA profile, 2026-11-27). Their bf16 gradients are
moved after each micro-batch's backward (``batched``: one foreach op for all of them) instead of by a hook
per weight, which would add a Python call per adapter back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from fastlm.errors import ConfigError

__all__ = ["BackwardUpdates", "MasterWeights", "choose_param_dtype"]


class MasterWeights:
    """fp32 masters of ``model``'s trainable fp32 weights, the model cast to ``dtype`` (module docstring)."""

    def __init__(
        self, model: torch.nn.Module, dtype: torch.dtype = torch.bfloat16, batched: bool = False
    ) -> None:
        """``batched``: the bf16 gradients move into the masters after each micro-batch's backward
        (``collecting``, one foreach op), not by a hook per weight as autograd produces each (many small
        weights: LoRA's adapters)."""
        self.dtype = dtype
        self.batched = batched
        self._views: dict[str, dict[torch.nn.Parameter, torch.Tensor]] | None = None  # ``_gradient_views``
        kept = _kept_in_fp32(model)
        self.pairs: list[tuple[torch.nn.Parameter, torch.nn.Parameter]] = []
        self._master: dict[torch.nn.Parameter, torch.nn.Parameter] = {}
        self._hooks = []
        self._ddp = None  # the DDP wrapper whose reduction adds into the masters (``reduce_under``)
        self._model = model
        self.backward: BackwardUpdates | None = None  # train.optimizer.in_backward (``update_in_backward``)
        for name, param in model.named_parameters():  # each shared (tied) tensor once
            if param.dtype != torch.float32 or not param.requires_grad or _kept(name, kept):
                continue
            master = torch.nn.Parameter(param.detach().clone())
            self.pairs.append((param, master))
            self._master[param] = master
            if not batched:
                self._hooks.append(param.register_post_accumulate_grad_hook(self._move_gradient))
            param.data = param.data.to(dtype)

    def master_of(self, param: torch.nn.Parameter) -> torch.nn.Parameter:
        """What the optimizer updates in place of ``param``: its master, or ``param`` itself (kept fp32)."""
        return self._master.get(param, param)

    def _move_gradient(self, param: torch.nn.Parameter) -> None:
        if self._ddp is not None and self._ddp.require_backward_grad_sync:
            return  # DDP's reduction (outside ``no_sync``) moves it: ``_reduce_bucket``
        grad, param.grad = param.grad, None
        master = self._master[param]
        if master.grad is None:
            master.grad = grad.to(torch.float32)
        else:
            master.grad.add_(grad)
        if self.backward is not None:
            self.backward.offer(master)

    def update_in_backward(self, optimizer: torch.optim.Optimizer) -> BackwardUpdates:
        """``train.optimizer.in_backward`` over the masters (``BackwardUpdates``): each is updated in the
        step's last backward as soon as its gradient is complete; the weights kept in fp32 are left to the
        step."""
        if self.batched:
            raise ValueError("updates in the backward need a gradient hook per weight (batched=False)")
        self.backward = BackwardUpdates(optimizer, [master for _, master in self.pairs])
        return self.backward

    def collecting(self, gradient_sync=None):
        """``sync(last)`` for ``accumulate_gradients`` in ``batched`` mode: ``gradient_sync``'s context (if
        any), and after each micro-batch's backward its bf16 gradients added into the masters' fp32 sums."""

        @contextlib.contextmanager
        def sync(last: bool) -> Iterator[None]:
            with gradient_sync(last) if gradient_sync is not None else contextlib.nullcontext():
                yield
            self.collect()

        return sync

    @torch.no_grad()
    def collect(self) -> None:
        """``batched`` mode: the weights' bf16 gradients into their masters' fp32 sums, then dropped. The
        first micro-batch of a step copies them into views of one fp32 buffer kept for the run (made once:
        no allocation or view per weight and step), which become the masters' gradients; a later one copies
        them into fp32 in a second such buffer and adds that (two fused foreach ops, each over one dtype).
        Under DDP's synchronizing backward its reduction moved them already (``_reduce_bucket``)."""
        if self._ddp is not None and self._ddp.require_backward_grad_sync:
            return
        moved = [(param, master) for param, master in self.pairs if param.grad is not None]
        if not moved:
            return
        fresh = [(param, master) for param, master in moved if master.grad is None]
        summed = [(param, master) for param, master in moved if master.grad is not None]
        if fresh:
            views = self._gradient_views()
            targets = [views[master] for _, master in fresh]
            torch._foreach_copy_(targets, [param.grad for param, _ in fresh])
            for (_, master), view in zip(fresh, targets, strict=True):
                master.grad = view
        if summed:  # fp32 + fp32: a foreach op over two dtypes leaves its fused CUDA kernel per tensor
            scratch = self._gradient_views(scratch=True)
            converted = [scratch[master] for _, master in summed]
            torch._foreach_copy_(converted, [param.grad for param, _ in summed])
            torch._foreach_add_([master.grad for _, master in summed], converted)
        for param, _ in moved:
            param.grad = None

    def _gradient_views(self, scratch: bool = False) -> dict[torch.nn.Parameter, torch.Tensor]:
        """Each master's gradient slot, a view of one fp32 buffer (``collect``), made on the first call;
        ``scratch``: another such buffer, where a later micro-batch's bf16 gradients become fp32 (made when
        a step first accumulates)."""
        key = "scratch" if scratch else "gradients"
        if self._views is None:
            self._views = {}
        if key not in self._views:
            masters = [master for _, master in self.pairs]
            flat = torch.empty(
                sum(master.numel() for master in masters), dtype=torch.float32, device=masters[0].device
            )
            pieces = flat.split([master.numel() for master in masters])
            self._views[key] = {
                master: piece.view_as(master) for master, piece in zip(masters, pieces, strict=True)
            }
        return self._views[key]

    def drop_weight_gradients(self) -> None:
        """The bf16 weights' gradients a backward outside a step left (a probe's), in ``batched`` mode."""
        if self.batched:
            for param, _ in self.pairs:
                param.grad = None

    def reduce_under(self, ddp: torch.nn.Module) -> None:
        """DDP over the bf16 model: gradients reduced in fp32, straight into the masters.

        On the micro-batches under ``no_sync`` each gradient moves into its master as in one process. On the
        last one the bf16 gradients stay in DDP's buckets, and DDP's reduction of each bucket (a comm hook,
        ``_reduce_bucket``) adds each to its master's local fp32 sum, all-reduces those fp32 sums and
        averages them as DDP does, and leaves the bucket zeroed (the bf16 weights keep no gradient). With
        ``update_in_backward`` each master of the bucket is updated there, from its reduced gradient. The
        masters are broadcast from rank 0 first, as DDP broadcast the weights."""
        group = ddp.process_group
        with torch.no_grad():
            for _, master in self.pairs:
                torch.distributed.broadcast(master.data, src=0, group=group)
        self.publish()
        self._ddp = ddp
        ddp.register_comm_hook(group, self._reduce_bucket)

    def _reduce_bucket(self, group, bucket):  # no annotations: DDP compares them with its own types
        """DDP's comm hook (``reduce_under``): the fp32 average over the ranks of master sum + bucket
        gradient, into the masters' gradients (a weight kept in fp32 has no master: its reduced gradient goes
        back to the bucket, as DDP's own hook would do)."""
        params, grads = bucket.parameters(), bucket.gradients()
        flat = torch.empty(sum(g.numel() for g in grads), dtype=torch.float32, device=bucket.buffer().device)
        pieces = [
            piece.view_as(g) for piece, g in zip(flat.split([g.numel() for g in grads]), grads, strict=True)
        ]
        for param, grad, piece in zip(params, grads, pieces, strict=True):
            master = self._master.get(param)
            if master is not None and master.grad is not None:  # the micro-batches under no_sync
                torch.add(master.grad, grad, out=piece)
            else:
                piece.copy_(grad)
        flat.div_(torch.distributed.get_world_size(group))  # DDP averages over the ranks
        reduced = torch.distributed.all_reduce(flat, group=group, async_op=True).get_future()

        def into_masters(done):
            for param, grad, piece in zip(params, grads, pieces, strict=True):
                master = self._master.get(param)
                if master is None:
                    grad.copy_(piece)
                    continue
                if master.grad is None:
                    master.grad = piece  # a view of the reduced bucket: no copy
                else:
                    master.grad.copy_(piece)
                if self.backward is not None:  # train.optimizer.in_backward
                    self.backward.offer(master)
            buffer = bucket.buffer()
            if all(param in self._master for param in params):
                buffer.zero_()  # the bf16 weights keep no gradient for the next step to add to
            return buffer

        return reduced.then(into_masters)

    @torch.no_grad()
    def publish(self) -> None:
        """The masters into the bf16 weights (after each optimizer step)."""
        if self.pairs:
            torch._foreach_copy_([param for param, _ in self.pairs], [master for _, master in self.pairs])

    @contextlib.contextmanager
    def full_precision(self) -> Iterator[None]:
        """The model's parameters are the fp32 masters inside (saves and loads see fp32 weights); the bf16
        weights are refreshed from the masters on exit.

        The masters take the bf16 weights' places in their modules for as long as it lasts: the bf16
        weights themselves are not touched. A tensor whose dtype changed (``param.data = ...``) would get a
        new gradient accumulator, and DDP's reduction, hooked onto the old one, would stop."""
        slots = [
            (module, name, param)
            for module in self._model.modules()
            for name, param in module._parameters.items()
            if param is not None and param in self._master
        ]
        for module, name, param in slots:
            module._parameters[name] = self._master[param]
        try:
            yield
        finally:
            for module, name, param in slots:
                module._parameters[name] = param
            self.publish()

    def release(self) -> None:
        """For good: the model's parameters become the fp32 masters, the gradient hooks go. Idempotent."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        for param, master in self.pairs:
            param.data = master.data
        self.pairs, self._master, self._ddp, self._views = [], {}, None, None
        self.backward = None


class BackwardUpdates:
    """``train.optimizer.in_backward``: in the last micro-batch of a step (``updating``), each weight the
    optimizer updates is updated as soon as its gradient is complete (``offer``) and the gradient is freed, so
    no step holds every gradient at once (4 bytes per weight less at the peak). Each weight gets an optimizer
    of its own with its group's settings and the run's optimizer's state: the same update, the same
    checkpoints. Both are read from the run's optimizer at each update: its scheduler sets the rate, and
    loading a checkpoint replaces its state and groups. The gradients' norms are kept for the step's
    (``step_norm``).

    Who offers the gradients: ``MasterWeights`` (bf16 weights, one process or DDP) once it has moved a
    gradient into its master, or, under FSDP2, FSDP2 itself (``on_shards``): it calls each sharded
    parameter's post-accumulate-grad hooks once its reduce-scatter is done, on the synchronizing micro-batch
    only. A shard's norm is local, the step's norm one all-reduce of their squares."""

    def __init__(self, optimizer: torch.optim.Optimizer, targets: list[torch.nn.Parameter] | None = None):
        """``targets``: the weights to update in the backward (default: all the optimizer's)."""
        self._optimizer = optimizer
        chosen = None if targets is None else {id(target) for target in targets}
        self._updaters: dict[torch.nn.Parameter, tuple[torch.optim.Optimizer, int]] = {}
        for index, group in enumerate(optimizer.param_groups):
            for target in group["params"]:
                if chosen is None or id(target) in chosen:
                    self._updaters[target] = (type(optimizer)([target], lr=group["lr"]), index)
        self._armed = False
        self._norms: list[torch.Tensor] = []
        self._hooks = []
        self._group = None  # the process group of sharded weights (``on_shards``): their norms are local

    @classmethod
    def on_shards(cls, optimizer: torch.optim.Optimizer) -> BackwardUpdates:
        """FSDP2: every weight of ``optimizer`` (its sharded parameters) updated from FSDP2's post-reduce call
        of its post-accumulate-grad hooks."""
        updates = cls(optimizer)
        for param in updates._updaters:
            updates._hooks.append(param.register_post_accumulate_grad_hook(updates.offer))
            updates._group = param.device_mesh.get_group()
        return updates

    def offer(self, param: torch.nn.Parameter) -> None:
        """``param``'s gradient is complete: updated now where the step's last backward is running."""
        if not self._armed or param not in self._updaters:
            return
        own, index = self._updaters[param]
        group = self._optimizer.param_groups[index]
        own.param_groups[0].update({key: value for key, value in group.items() if key != "params"})
        own.state = self._optimizer.state
        grad = param.grad.to_local() if self._group is not None else param.grad
        self._norms.append(torch.linalg.vector_norm(grad))  # for the step's gradient norm
        own.step()
        param.grad = None

    def updating(self, gradient_sync=None):
        """``sync(last)`` for ``accumulate_gradients``: ``gradient_sync``'s context (if any), and on the last
        micro-batch the updates in its backward."""

        @contextlib.contextmanager
        def sync(last: bool) -> Iterator[None]:
            with gradient_sync(last) if gradient_sync is not None else contextlib.nullcontext():
                self._armed = last
                try:
                    yield
                finally:
                    self._armed = False

        return sync

    def take_norms(self) -> list[torch.Tensor]:
        """The norms of the gradients updated in the backward since the last call (device scalars)."""
        norms, self._norms = self._norms, []
        return norms

    def step_norm(self, norms: list[torch.Tensor], rest: torch.Tensor) -> torch.Tensor:
        """The step's gradient norm from ``norms`` (``take_norms``) and ``rest``, the norm of the gradients
        the step itself updates; over the shards of every rank for sharded weights (one all-reduce)."""
        rest = rest.full_tensor() if hasattr(rest, "full_tensor") else rest
        if self._group is None:
            return torch.linalg.vector_norm(torch.stack([*norms, rest.to(norms[0].device)]))
        squares = torch.stack(norms).square().sum()
        torch.distributed.all_reduce(squares, group=self._group)
        return (squares + rest.to(squares.device).square()).sqrt()

    def release(self) -> None:
        """The hooks ``on_shards`` put on the weights go."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


def choose_param_dtype(
    request: str,
    model: torch.nn.Module,
    *,
    autocast_dtype: torch.dtype | None,
    world_size: int,
    device: torch.device | str,
    strategy: str = "ddp",
    adapters: bool = False,
) -> tuple[torch.dtype | None, str]:
    """(bf16 or None for fp32 weights, why) for ``train.runtime.param_dtype`` ``request``. ``adapters``: the
    trainable weights are LoRA's (its base frozen): bf16 adapters with fp32 masters. An explicit ``bf16`` that
    cannot apply raises ``ConfigError`` with the fix (``engine.config`` refuses what it can see earlier: a
    precision other than bf16)."""
    if request == "fp32":
        return None, "fp32 weights under autocast (train.runtime.param_dtype: fp32)"
    frozen = any(param.is_floating_point() and not param.requires_grad for param in model.parameters())
    trained = [param for param in model.parameters() if param.requires_grad]
    problem = None
    if autocast_dtype != torch.bfloat16:
        problem = "the run's precision is not bf16 from its start (a CPU at precision auto measures it later)"
    elif frozen and not adapters:
        problem = "some weights are frozen"
    elif not any(param.dtype == torch.float32 for param in trained):
        problem = "the model has no trainable fp32 weights"
    elif adapters and world_size > 1 and strategy == "fsdp":
        problem = "FSDP2 shards LoRA's adapters in their own dtype"
    if problem is None and request == "auto" and torch.device(device).type != "cuda":
        problem = (
            "on a CPU the default stays autocast over fp32 weights; param_dtype: bf16 asks for bf16 ones"
        )
    if problem is None and adapters:
        where = " under DDP, gradients all-reduced in fp32 into them" if world_size > 1 else ""
        why = f"bf16 adapters, fp32 masters in the optimizer{where}: no cast of each adapter per micro-batch"
        return torch.bfloat16, f"{why} (param_dtype {request})"
    if problem is None and world_size > 1 and strategy == "fsdp":
        why = "bf16 weights under FSDP2: its fp32 shards are the masters, gradients reduced in fp32"
        return torch.bfloat16, f"{why} (param_dtype {request})"
    if problem is None and world_size > 1:
        why = "bf16 weights under DDP: fp32 masters, gradients all-reduced in fp32 into them"
        return torch.bfloat16, f"{why} (param_dtype {request})"
    if problem is None:
        return torch.bfloat16, f"bf16 weights, fp32 masters in the optimizer (param_dtype {request})"
    if request == "bf16":
        raise ConfigError(
            f"train.runtime.param_dtype: bf16 cannot apply to this run: {problem}.",
            fix="set train.runtime.param_dtype to auto or fp32 (or precision to bf16 where it is not).",
        )
    return None, f"fp32 weights under autocast (param_dtype auto: {problem})"


def _kept_in_fp32(model: torch.nn.Module) -> tuple[str, ...]:
    names: set[str] = set()
    for module in model.modules():
        for attribute in ("_keep_in_fp32_modules", "_keep_in_fp32_modules_strict"):
            names.update(getattr(module, attribute, None) or ())
    return tuple(names)


def _kept(name: str, kept: tuple[str, ...]) -> bool:
    parts = name.split(".")
    return any(module in parts for module in kept)
