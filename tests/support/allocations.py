"""Counting the large tensors an operation allocates (no [tokens x vocab] buffer tests)."""

from __future__ import annotations

import torch


def full_size_allocations(function, numel: int) -> int:
    """How many ops run by ``function()`` return a NEW tensor of at least ``numel`` elements."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        found = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = {
                t.untyped_storage().data_ptr()
                for t in torch.utils._pytree.tree_leaves((args, kwargs))
                if isinstance(t, torch.Tensor)
            }
            for t in torch.utils._pytree.tree_leaves(out):
                if (
                    isinstance(t, torch.Tensor)
                    and t.numel() >= numel
                    and t.untyped_storage().data_ptr() not in inputs
                ):
                    Count.found += 1
            return out

    with Count():
        function()
    return Count.found
