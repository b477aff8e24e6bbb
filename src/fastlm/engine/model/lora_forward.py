"""LoRA layers' forward without dtype round trips: the adapter's product added inside the base's matmul.

peft's ``lora.Linear.forward`` casts its input to the adapters' dtype before the adapter (``x.to(fp32)``: the
adapters are fp32), autocast casts it straight back to bf16 for the matmul, the adapter's output is scaled in
a pass of its own and added to the base output in another, and backward retraces each step. Per adapted
layer and micro-batch that is four activation-sized dtype copies (two where the input needs no gradient),
two scaling passes and an add, all memory-bound (tests/engine/model/test_lora_forward.py counts them), and
each adapted layer keeps its own bf16 re-cast copy of its input for backward where one shared input would
do (q, k and v read the same one). On the Llama-3.2-3B shape (7 adapted projections per layer, 8,192 tokens
per micro-batch) that is, estimated from the sizes, about 220 GB of memory traffic per step and about 5 GB
of activations; not yet measured on a GPU (``benchmarks/gpu_speed.py --contenders fastlm_lora
fastlm_lora_peft_forward``).

``FusedLoraLinear`` (peft's ``lora.Linear`` with this forward; ``fuse_lora_forward`` swaps the class of each
plain LoRA Linear in place) computes, in the base output's dtype (autocast's: bf16 on a GPU run)::

    out = base(x)                           # the frozen base layer, unchanged
    xa = dropout(x) @ A.T                   # [tokens x r], x not cast
    out += xa @ (scaling * B).T             # one matmul accumulating into out (addmm_, beta = 1)

with the fp32 adapters cast to the compute dtype as autocast would (tiny: r rows), so the optimizer still
updates fp32 weights. Without autocast it is the same computation as peft's in the same dtype (fp32 on a
CPU run), the sum reordered. Where it does not apply it calls peft's forward: merged or disabled adapters,
several active adapters, a variant (DoRA and the like), a bias on B, extra arguments, or an input in another
dtype than the adapters outside autocast. ``train.model.lora.fused_forward: false`` keeps peft's forward
everywhere; a 4-bit base (QLoRA, peft's ``bnb.Linear4bit``) keeps peft's forward, which skips the casts
under autocast already.
"""

from __future__ import annotations

import torch
from peft.tuners.lora.layer import Linear as PeftLoraLinear
from torch.nn import functional


class FusedLoraLinear(PeftLoraLinear):
    """peft's ``lora.Linear`` whose forward adds the adapter inside one matmul (module docstring)."""

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        adapter = _single_plain_adapter(self, x, args, kwargs)
        if adapter is None:
            return super().forward(x, *args, **kwargs)
        return _forward(self, x, adapter)


def _single_plain_adapter(layer, x: torch.Tensor, args, kwargs) -> str | None:
    """The one active adapter this forward can take, or None for peft's forward (module docstring)."""
    if args or kwargs or layer.disable_adapters or layer.merged or len(layer.active_adapters) != 1:
        return None
    name = layer.active_adapters[0]
    if name not in layer.lora_A or name in getattr(layer, "lora_variant", {}):
        return None
    if layer.lora_B[name].bias is not None:
        return None
    if not torch.is_autocast_enabled(x.device.type) and x.dtype != layer.lora_A[name].weight.dtype:
        return None
    return name


def _forward(layer, x: torch.Tensor, name: str) -> torch.Tensor:
    result = layer.base_layer(x)
    dtype = result.dtype
    a = layer.lora_A[name].weight.to(dtype)
    b = layer.lora_B[name].weight.to(dtype) * layer.scaling[name]  # [out x r]: the scaling on r columns
    xa = functional.linear(layer.lora_dropout[name](x), a)  # autocast's dtype under it, else x's (= dtype)
    rows = xa.reshape(-1, xa.shape[-1])
    if isinstance(layer.base_layer, torch.nn.Linear) and result.is_contiguous():
        # in place: a Linear keeps its input and weight for backward, not its output
        result.view(-1, result.shape[-1]).addmm_(rows, b.t())
        return result
    return torch.addmm(result.reshape(-1, result.shape[-1]), rows, b.t()).view(result.shape)


def fuse_lora_forward(model) -> int:
    """Each plain LoRA Linear of ``model`` (exactly peft's ``lora.Linear``) becomes a ``FusedLoraLinear`` in
    place; returns how many."""
    return _swap_class(model, PeftLoraLinear, FusedLoraLinear)


def use_peft_forward(model) -> int:
    """The reverse of ``fuse_lora_forward``: peft's own forward on every layer (the A/B's other side)."""
    return _swap_class(model, FusedLoraLinear, PeftLoraLinear)


def _swap_class(model, before: type, after: type) -> int:
    count = 0
    for module in model.modules():
        if type(module) is before:
            module.__class__ = after
            count += 1
    return count
