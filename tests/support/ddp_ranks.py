"""Two gloo ranks on this machine running DDP over a one-weight model with bf16 weights and fp32 masters
(``MasterWeights.reduce_under``), for the test of what each rank's master gradient becomes: every rank's
micro-batch gradients, accumulated and averaged in fp32.

The model is ``y = w * x`` (``Linear(1, 1)`` without bias) and the loss ``y``: the gradient of a micro-batch
is its ``x``, exactly, in bf16 as in fp32 (powers of two), so what the masters receive shows at which
precision the gradients were added."""

from __future__ import annotations

import contextlib
import pathlib

import torch
import torch.distributed as dist

WORLD = 2


def run(folder: pathlib.Path, inputs: list[list[float]], initial: list[float], steps: int = 2) -> list[dict]:
    """Each rank's ``{"initial": its master after DDP's set-up, "grads": [its master gradient after each
    step], "model_grads": [its bf16 weight's gradient after each step]}``. ``inputs[rank]``: the ``x`` of its
    micro-batches (all but the last under ``no_sync``); ``initial[rank]``: its weight before DDP is set up."""
    torch.multiprocessing.spawn(_rank, args=(folder, inputs, initial, steps), nprocs=WORLD, join=True)
    return [torch.load(folder / f"rank{rank}.pt") for rank in range(WORLD)]


def _rank(rank: int, folder: pathlib.Path, inputs, initial, steps: int) -> None:
    from torch.nn.parallel import DistributedDataParallel

    from fastlm.engine.train.master_weights import MasterWeights

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder / 'store'}", rank=rank, world_size=WORLD)
    try:
        model = torch.nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            model.weight.fill_(initial[rank])
        masters = MasterWeights(model)
        master = masters.master_of(model.weight)
        ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
        masters.reduce_under(ddp)
        seen = {"initial": master.detach().clone(), "grads": [], "model_grads": []}
        for _ in range(steps):
            master.grad = None  # what the optimizer's zero_grad does at each step
            last = len(inputs[rank]) - 1
            for index, x in enumerate(inputs[rank]):
                sync = contextlib.nullcontext() if index == last else ddp.no_sync()
                with sync:
                    ddp(torch.full((1, 1), x, dtype=torch.bfloat16)).sum().backward()
            seen["grads"].append(master.grad.detach().clone())
            weight_grad = model.weight.grad
            seen["model_grads"].append(None if weight_grad is None else weight_grad.detach().clone())
        torch.save(seen, folder / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
