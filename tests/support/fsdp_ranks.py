"""Two gloo ranks on this machine running FSDP2 over a small two-layer model, for the test of the weights'
updates in the backward under FSDP2 (``BackwardUpdates.on_shards``): each rank trains the same model twice,
with the step's AdamW after the backward and with the updates in the backward, on its own inputs, two
micro-batches a step (the first without gradient synchronization)."""

from __future__ import annotations

import contextlib
import os
import pathlib

import torch
import torch.distributed as dist

from tests.support import spawned_ranks

WORLD = 2


def run(folder: pathlib.Path, steps: int = 3) -> list[dict]:
    """Each rank's ``{"after": ..., "during": ...}``: ``"weights"`` (the whole weights after each step),
    ``"norms"`` (the step's gradient norm); ``during`` also ``"updated_in_backward"`` (each step: the weights
    had changed and every shard's gradient was freed when the backward returned, before any step)."""
    spawned_ranks.start(_rank, (folder, steps), folder, WORLD)
    return [torch.load(folder / f"rank{rank}.pt") for rank in range(WORLD)]


def _rank(rank: int, folder: pathlib.Path, steps: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder / 'store'}", rank=rank, world_size=WORLD)
    try:
        seen = {name: _train(rank, steps, name == "during") for name in ("after", "during")}
        torch.save(seen, folder / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Done, the results saved: out without the interpreter's teardown, where a rank aborted once in a CI
    # rehearsal ("terminate called without an active exception", SIGABRT) after every step and save had run
    # (not reproduced in 11 runs since; FSDP2's device meshes may keep gloo groups referenced past
    # destroy_process_group until that teardown). A failing rank still raises above (spawn reports it).
    os._exit(0)


def _train(rank: int, steps: int, in_backward: bool) -> dict:
    from torch.distributed.fsdp import fully_shard

    from fastlm.engine.train.master_weights import BackwardUpdates

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    updates = BackwardUpdates.on_shards(optimizer) if in_backward else None
    generator = torch.Generator().manual_seed(1 + rank)  # each rank its own inputs
    seen = {"weights": [], "norms": [], "updated_in_backward": []}
    for _ in range(steps):
        before = [param.full_tensor().clone() for param in model.parameters()]
        for index in range(2):
            last = index == 1
            model.set_requires_gradient_sync(last)
            with updates.updating()(last) if updates is not None else contextlib.nullcontext():
                model(torch.randn(3, 6, generator=generator)).square().mean().backward()
        if updates is not None:
            changed = all(
                not torch.equal(param.full_tensor(), old)
                for param, old in zip(model.parameters(), before, strict=True)
            )
            seen["updated_in_backward"].append(changed and all(p.grad is None for p in model.parameters()))
            norm = updates.step_norm(updates.take_norms(), torch.zeros(()))
        else:
            norm = torch.nn.utils.clip_grad_norm_(list(model.parameters()), float("inf")).full_tensor()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seen["weights"].append([param.full_tensor().clone() for param in model.parameters()])
        seen["norms"].append(norm.detach().clone())
    if updates is not None:
        updates.release()
    return seen
