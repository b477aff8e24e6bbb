"""What ``torch.compile`` compiles: ``train.runtime.compile_scope`` = ``model`` (the whole model, one graph)
or ``layers`` (regional compilation: each transformer layer compiled in place).

Whole-model compilation traces and optimises every layer as one graph, so its cold start grows with the
depth: a 0.73 B Llama (24 layers) did not finish compiling its first steps within 137 s on an H100
(docs/gpu-runs/2026-11-26-*), and a 24-layer toy Llama takes 3.7x longer to its first step than with
``layers`` on a CPU, which runs 0.83x as fast once compiled (``benchmarks/compile_scope.py``;
docs/benchmarks.md, "Compile scope"). The layers of a transformer run one code: each compiled in place
(``nn.Module.compile``), dynamo traces the first and reuses its graph for the others (their parameters are
graph inputs, not constants), so the cold start is about one layer's at any depth. What stays eager with
``layers``: the embedding, the final norm, the LM head and the loss (the fused head has its own kernels), and
no fusion crosses a layer boundary.

The layers are transformers' own (``GradientCheckpointingLayer``: every decoder and encoder layer of the
families fastlm trains); checkpointing, LoRA, liger's patches and DDP/FSDP2 wrap around them unchanged, and
the state dict keeps its names (nothing is wrapped).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from fastlm.errors import ConfigError

__all__ = [
    "COMPILE_SCOPES",
    "compile_in_scope",
    "compiled_layers",
    "eager_stance",
    "repeated_layers",
    "uncompile_layers",
]

COMPILE_SCOPES = ("model", "layers")
PARAM = "train.runtime.compile_scope"


def repeated_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's transformer layers (transformers' ``GradientCheckpointingLayer`` instances), in order."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]


def compile_in_scope(model: torch.nn.Module, scope: str) -> torch.nn.Module:
    """``model`` compiled in ``scope``: ``torch.compile(model)`` (a wrapper) for ``model``; for ``layers``
    each transformer layer compiled in place and ``model`` itself returned. A model without such layers
    cannot be compiled by layers: one ``ConfigError`` line."""
    if scope == "model":
        return torch.compile(model)
    if scope != "layers":
        raise ConfigError(f"{PARAM} is {scope!r}.", fix=f"set {PARAM}: one of {', '.join(COMPILE_SCOPES)}.")
    layers = repeated_layers(model)
    if not layers:
        raise ConfigError(
            f"{PARAM} is layers, but this model ({type(model).__name__}) has no transformers layers to "
            "compile one by one.",
            fix=f"set {PARAM}: model.",
        )
    for layer in layers:
        layer.compile()
    return model


def compiled_layers(model: torch.nn.Module) -> int:
    """How many of the model's transformer layers are compiled in place (``compile_in_scope``, layers)."""
    # nn.Module.compile keeps the compiled call here; None is the module's own eager state
    return sum(layer._compiled_call_impl is not None for layer in repeated_layers(model))


def uncompile_layers(model: torch.nn.Module) -> None:
    """Undo ``compile_in_scope(model, "layers")``: every layer runs eagerly again (the probe's choice)."""
    for layer in repeated_layers(model):
        layer._compiled_call_impl = None  # the module's own eager state (compiled_layers)


@contextlib.contextmanager
def eager_stance() -> Iterator[None]:
    """Everything compiled runs eagerly inside (layers compiled in place included): the probe's eager
    measurement of a model whose layers are already compiled."""
    with torch.compiler.set_stance("force_eager"):
        yield
