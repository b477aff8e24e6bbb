"""Two gloo ranks on this machine running DDP over a one-weight model with bf16 weights and fp32 masters
(``MasterWeights.reduce_under``), for the tests of what each rank's master gradient becomes (every rank's
micro-batch gradients, accumulated and averaged in fp32) and of the masters' updates in the backward.

The model is ``y = w * x`` (``Linear(1, 1)`` without bias) and the loss ``y``: the gradient of a micro-batch
is its ``x``, exactly, in bf16 as in fp32 (powers of two), so what the masters receive shows at which
precision the gradients were added."""

from __future__ import annotations

import contextlib
import gc
import pathlib

import torch
import torch.distributed as dist

from tests.support import spawned_ranks

WORLD = 2


def run(
    folder: pathlib.Path, inputs: list[list[float]], initial: list[float], lr: float, steps: int = 2
) -> list[dict]:
    """Each rank's ``{"plain": ..., "in_backward": ...}``, two models trained one after the other in the
    same processes: ``plain`` leaves the masters' gradients for a step after the backward, ``in_backward``
    has an AdamW at ``lr`` (no weight decay) update the master in the last micro-batch's backward
    (``update_in_backward``). Each holds ``"initial"`` (its master after DDP's set-up), ``"grads"`` (its
    master gradient after each step; in_backward: the norm its update saw), ``"model_grads"`` (its bf16
    weight's gradient after each step) and ``"masters"`` (in_backward: its master after each step).
    ``inputs[rank]``: the ``x`` of its micro-batches (all but the last under ``no_sync``); ``initial[rank]``:
    its weight before DDP is set up."""
    args = (folder, inputs, initial, steps, lr)
    spawned_ranks.start(_rank, args, folder, WORLD)
    return [torch.load(folder / f"rank{rank}.pt") for rank in range(WORLD)]


def _rank(rank: int, folder: pathlib.Path, inputs, initial, steps: int, lr: float) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder / 'store'}", rank=rank, world_size=WORLD)
    try:
        seen = {
            name: _train(rank, inputs[rank], initial[rank], steps, lr if name == "in_backward" else None)
            for name in ("plain", "in_backward")
        }
        torch.save(seen, folder / f"rank{rank}.pt")
        # every DDP wrapper gone before the process group (the masters' comm hook and DDP referenced each
        # other: collected later, at exit, a DDP reducer over a destroyed group aborted the process, about
        # 1 run in 12), and both ranks done with their collectives
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _train(rank: int, inputs: list[float], initial: float, steps: int, lr: float | None) -> dict:
    from torch.nn.parallel import DistributedDataParallel

    from fastlm.engine.train.master_weights import MasterWeights

    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(initial)
    masters = MasterWeights(model)
    master = masters.master_of(model.weight)
    ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
    masters.reduce_under(ddp)
    syncs = lambda last: contextlib.nullcontext() if last else ddp.no_sync()  # noqa: E731
    if lr is not None:
        backward = masters.update_in_backward(torch.optim.AdamW([master], lr=lr, weight_decay=0.0))
        syncs = backward.updating(syncs)
    seen = {"initial": master.detach().clone(), "grads": [], "model_grads": [], "masters": []}
    for _ in range(steps):
        master.grad = None  # what the optimizer's zero_grad does at each step
        for index, x in enumerate(inputs):
            with syncs(index == len(inputs) - 1):
                ddp(torch.full((1, 1), x, dtype=torch.bfloat16)).sum().backward()
        if lr is None:
            seen["grads"].append(master.grad.detach().clone())
        else:
            assert master.grad is None, f"rank {rank}: the update in the backward did not free the gradient"
            seen["grads"].append(backward.take_norms()[0].reshape(1, 1))
        seen["masters"].append(master.detach().clone())
        weight_grad = model.weight.grad
        seen["model_grads"].append(None if weight_grad is None else weight_grad.detach().clone())
    masters.release()  # drops its reference to the DDP wrapper (``reduce_under``)
    return seen
