"""Counting the large tensors an operation allocates (no [tokens x vocab] buffer tests), and recording the
matrix products it runs (their operands' shapes and dtypes)."""

from __future__ import annotations

import torch


def new_tensor_shapes(function) -> list[torch.Size]:
    """The shapes of the tensors the ops run by ``function()`` return in NEW storage (not one of their
    inputs'), in order (shapes only: the tensors themselves are freed as the function frees them)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    made: list[torch.Size] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = {
                t.untyped_storage().data_ptr()
                for t in torch.utils._pytree.tree_leaves((args, kwargs))
                if isinstance(t, torch.Tensor)
            }
            made.extend(
                t.shape
                for t in torch.utils._pytree.tree_leaves(out)
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs
            )
            return out

    with Record():
        function()
    return made


def full_size_allocations(function, numel: int) -> int:
    """How many ops run by ``function()`` return a NEW tensor of at least ``numel`` elements."""
    return sum(shape.numel() >= numel for shape in new_tensor_shapes(function))


def vocab_wide_rows(function, vocab: int) -> int:
    """The most rows (elements / ``vocab``) of a NEW tensor ending in a ``vocab``-wide dimension that
    ``function()`` makes: logits, or a chunk of them."""
    shapes = new_tensor_shapes(function)
    return max((shape.numel() // vocab for shape in shapes if len(shape) and shape[-1] == vocab), default=0)


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
