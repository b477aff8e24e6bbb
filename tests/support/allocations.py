"""Counting the large tensors an operation allocates (no [tokens x vocab] buffer tests), and recording the
matrix products it runs (their operands' shapes and dtypes)."""

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


_PRODUCTS = ("mm", "addmm", "addmm_", "bmm", "baddbmm")


def matrix_products(function) -> list[tuple[str, tuple, tuple]]:
    """The matrix products ``function()`` runs, after autocast's casts: (aten op, the two factors' shapes,
    their dtypes) each, in order."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            if name in _PRODUCTS:
                a, b = [t for t in args if isinstance(t, torch.Tensor)][-2:]
                seen.append((name, (tuple(a.shape), tuple(b.shape)), (a.dtype, b.dtype)))
            return func(*args, **(kwargs or {}))

    with Record():
        function()
    return seen
