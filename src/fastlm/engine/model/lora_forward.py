"""LoRA layers' forward without dtype round trips: the adapter's product added inside the base's matmul.

peft's ``lora.Linear.forward`` casts its input to the adapters' dtype before the adapter (``x.to(fp32)``: the
adapters are fp32), autocast casts it straight back to bf16 for the matmul, the adapter's output is scaled in
a pass of its own and added to the base output in another, and backward retraces each step. Per adapted
layer and micro-batch that is four activation-sized dtype copies (two where the input needs no gradient),
two scaling passes and two adds (the outputs forward, the input gradients backward), all memory-bound
(tests/engine/model/test_lora_forward.py counts them), and each adapted layer keeps its own bf16 re-cast
copy of its input for backward where one shared input would do (q, k and v read the same one). On the
Llama-3.2-3B shape (7 adapted projections per layer, 8,192 tokens per micro-batch) that is, estimated from
the sizes, about 250 GB of memory traffic per step and about 5 GB of activations; not yet measured on a GPU
(``benchmarks/gpu_speed.py --contenders fastlm_lora fastlm_lora_peft_forward``).

``FusedLoraLinear`` (peft's ``lora.Linear`` with this forward; ``fuse_lora_forward`` swaps the class of each
plain LoRA Linear in place) computes, in the compute dtype (autocast's: bf16 on a GPU run)::

    out = x @ W.T (+ bias)                  # the frozen base Linear's product
    xa = x @ A.T                            # [tokens x r], x not cast
    out += scaling * (xa @ B.T)             # one matmul accumulating into out (addmm_, alpha = scaling)

and backward (``_LinearWithAdapter``) likewise sums the adapter's share of the input gradient inside the
base's input-gradient matmul (``g @ W``, then ``addmm_(g @ B, A, alpha=scaling)``), where autograd would add
two activation-sized gradients in a pass of its own. The fp32 adapters are cast to the compute dtype as
autocast would (tiny: r rows) and their gradients flow back to fp32, so the optimizer still updates fp32
weights. Without autocast it is peft's computation in the same dtype (fp32 on a CPU run), the sums
reordered. With LoRA dropout active, or a base that is not a plain ``nn.Linear`` (float8's ``Float8Linear``,
GPT-2's ``Conv1D``), the base layer runs its own forward and only the forward sum is fused. Where it does not
apply at all it calls peft's forward: merged or disabled adapters, several active adapters, a variant other
than DoRA (below), a bias on B, extra arguments, or an input in another dtype than the adapters outside
autocast. ``train.model.lora.fused_forward: false`` keeps peft's forward everywhere.

**DoRA** (``train.model.lora.use_dora``; peft's ``DoraLinearVariant``): the output is ``m / ||W + s B A||``
per output feature (m trained, the norm detached from the gradient as peft and the DoRA paper treat it)
times ``x W^T + s (x A^T) B^T``, the base's bias added after. peft forms, in every forward of every adapted
layer, ``B A`` by passing an ``[in x in]`` identity through both adapters, then ``W + s B A`` (both
weight-sized: about 100 M elements per layer of the 3B shape), takes its row norms, and combines the base
output and the adapter's in three more activation-sized passes. ``_dora_forward`` gets the norms from
the row norms of W (in W's dtype, as peft's), ``W A^T`` (``[out x r]``: W read twice, no copy) and
``A A^T`` (``r x r``), summed in fp32 (``dora_weight_norm``), the product from the fused matmul above, and
scales it in one pass (``addcmul`` with the bias): nothing weight-sized is written
(tests/engine/model/test_lora_forward.py counts it). A 4-bit W is dequantized once for ``W A^T``, as its
backward does. With active LoRA dropout peft's DoRA adds ``(scale - 1) W d + scale s B A d`` to the base's
output on x (d the dropped-out input: one more base product, on both sides); the fused forward computes
that too, with the same norms, so again nothing weight-sized. A trained base keeps peft's forward; DoRA
layers are not grouped by shared input.

**Shared-input groups** (``group_shared_inputs``, ``train.model.lora.shared_input``, on by default): the
adapted projections of one attention block read one input (q, k and v), as do the MLP's gate and up. Each
on its own, every one multiplies that input by its A (n reads of an activation-sized tensor), and autograd
sums their n input gradients in n - 1 activation-sized adds of its own (on the H100's LoRA profile of
2026-11-27, 193 bf16 adds per step, 3.7 % of its kernel time: the residual stream's and these). In a group
(``_SharedInputLinears``) the first member called computes every member's output: x times all the A's in
one matmul, each base product and its adapter's share; backward, each base's input gradient accumulates
into one buffer (``addmm_``, beta = 1), the adapters' share with it in one more, and the A's gradients come
from one matmul reading x once. The other members take their output when their layer is called with the
same tensor. A cross-attention (BART's ``encoder_attn`` and the like: q reads the decoder's states, k and
v the encoder's) is not grouped; a member called with another tensor all the same turns its group off for
good, with a warning, and computes its own (the group's unused outputs get no gradient); outputs a
cut-short forward left are dropped by the next one. Frozen bases only, no active dropout (each member
draws its own mask), not while compiling (each layer's own forward then). By
count, on the 3B shape at 8,192 tokens per micro-batch: about 7.5 ms of memory traffic per step less (the
adds, x's extra reads for the A's and their gradients), about 2.5 % of the H100 step; not measured on a GPU
(``gpu_speed.py --contenders fastlm_lora fastlm_lora_own_inputs``). On this CPU, compute-bound, the step
time is unchanged (``adapter_activations.py``); the host's side (``lora_host_cost.py``: 28 layers, negligible
arithmetic) dispatches 3 % fewer ops but took 1.05-1.08x the host time, which a GPU step hides unless the
host falls behind its kernels.

A 4-bit base (QLoRA: peft's ``bnb.Linear4bit`` over bitsandbytes' ``Linear4bit``, NF4 weights) gets the
same forward as ``FusedLoraLinear4bit``: peft's 4-bit layer skips the input casts under autocast, but
clones the base output ("defensively"), scales the adapter's output in a pass of its own and adds the two,
and autograd adds the two input gradients in backward (about 90 GB of memory traffic per step on the 3B
shape, estimated). ``_LinearWithAdapter`` takes the packed weight and its quantization state: forward, the
base's product is bitsandbytes' ``matmul_4bit`` (its own kernel choice: a fused dequantizing kernel for a
few rows, dequantize + matmul for a training batch) with the adapter accumulated into it; backward,
the weight is dequantized again (as bitsandbytes' backward does: only the 4-bit weight is kept) and the
adapter's share of the input gradient accumulated into ``g @ W``. It applies under autocast in the base's
compute dtype; elsewhere (no autocast, another dtype, a CPU-inference packed weight) peft's forward runs.
"""

from __future__ import annotations

import logging

import torch
from peft.tuners.lora.layer import Linear as PeftLoraLinear
from peft.tuners.lora.variants import DoraLinearVariant
from torch.nn import functional

log = logging.getLogger(__name__)

try:  # peft defines its 4-bit LoRA layer only where bitsandbytes imports (imported once, not per call)
    import bitsandbytes
    from bitsandbytes import functional as bnb_functional
    from bitsandbytes.nn import modules as bnb_modules
    from peft.tuners.lora.bnb import Linear4bit as PeftLoraLinear4bit
except ImportError:
    PeftLoraLinear4bit = None


class FusedLoraLinear(PeftLoraLinear):
    """peft's ``lora.Linear`` whose forward adds the adapter inside one matmul (module docstring)."""

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        group = self.__dict__.get(GROUP_KEY)
        taken = group[0].take(group[1], x) if group is not None and not (args or kwargs) else None
        if taken is not None:  # computed with its group a moment ago, for this very input
            return taken
        adapter = _single_plain_adapter(self, x, args, kwargs)
        if adapter is None:
            dora = _single_dora_adapter(self, x, args, kwargs)
            if dora is not None and type(self.base_layer) is torch.nn.Linear:
                return _dora_forward(self, x, dora)
            return super().forward(x, *args, **kwargs)
        shared = None
        if group is not None and group[0].applies():
            shared = group[0].compute(group[1], x, _member_plan(self, x, adapter))
        return shared if shared is not None else _forward(self, x, adapter)


def _single_plain_adapter(layer, x: torch.Tensor, args, kwargs) -> str | None:
    """The one active adapter this forward can take, or None for peft's forward (module docstring)."""
    name = _single_adapter(layer, x, args, kwargs)
    if name is None or name in getattr(layer, "lora_variant", {}):
        return None
    return name


def _single_dora_adapter(layer, x: torch.Tensor, args, kwargs) -> str | None:
    """The one active DoRA adapter ``_dora_forward`` can take (over a frozen base), or None."""
    name = _single_adapter(layer, x, args, kwargs)
    if name is None or type(getattr(layer, "lora_variant", {}).get(name)) is not DoraLinearVariant:
        return None
    base = layer.get_base_layer()
    if base.weight.requires_grad or (base.bias is not None and base.bias.requires_grad):
        return None  # a trained base: its gradient is not computed here
    return name


def _single_adapter(layer, x: torch.Tensor, args, kwargs) -> str | None:
    """The one active adapter, where a fused forward may take it (no extra arguments, nothing merged or
    disabled, no bias on B, a number as scaling, the adapters' dtype outside autocast), or None."""
    if args or kwargs or layer.disable_adapters or layer.merged or len(layer.active_adapters) != 1:
        return None
    name = layer.active_adapters[0]
    if name not in layer.lora_A:
        return None
    if layer.lora_B[name].bias is not None or not isinstance(layer.scaling[name], (int, float)):
        return None  # a bias on B, or a scaling that is not a number (a matmul's alpha)
    if not torch.is_autocast_enabled(x.device.type) and x.dtype != layer.lora_A[name].weight.dtype:
        return None
    return name


if PeftLoraLinear4bit is not None:

    class FusedLoraLinear4bit(PeftLoraLinear4bit):
        """peft's 4-bit ``lora.Linear4bit`` with the fused forward (module docstring)."""

        def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            group = self.__dict__.get(GROUP_KEY)
            taken = group[0].take(group[1], x) if group is not None and not (args or kwargs) else None
            if taken is not None:  # computed with its group a moment ago, for this very input
                return taken
            adapter = _single_plain_adapter(self, x, args, kwargs)
            state = None if adapter is None else _quant_state(self.base_layer, x)
            if state is None:
                dora = _single_dora_adapter(self, x, args, kwargs) if adapter is None else None
                state = None if dora is None else _quant_state(self.base_layer, x)
                if state is not None:
                    return _dora_forward(self, x, dora, quant_state=state)
                return super().forward(x, *args, **kwargs)
            shared = None
            if group is not None and group[0].applies():
                shared = group[0].compute(group[1], x, _member_plan(self, x, adapter, state))
            return shared if shared is not None else _forward(self, x, adapter, quant_state=state)

else:
    FusedLoraLinear4bit = None


def _quant_state(base, x: torch.Tensor):
    """The 4-bit weight's quantization state where the fused forward can multiply it: under autocast in
    the base's compute dtype, with the weight in bitsandbytes' standard layout; else None."""
    device = x.device.type
    if not torch.is_autocast_enabled(device) or torch.get_autocast_dtype(device) != base.compute_dtype:
        return None
    bnb_modules.fix_4bit_weight_quant_state_from_module(base)  # a state lost to FSDP's flattening
    state = base.weight.quant_state
    return None if getattr(state, "packing_format_for_cpu", False) else state


def _forward(layer, x: torch.Tensor, name: str, *, quant_state=None) -> torch.Tensor:
    """The fused forward of ``layer``'s adapter ``name`` (``quant_state``: a 4-bit base's)."""
    dropout = layer.lora_dropout[name]
    no_dropout = isinstance(dropout, torch.nn.Identity) or not dropout.training or dropout.p == 0
    base = layer.base_layer
    if no_dropout and (quant_state is not None or type(base) is torch.nn.Linear):
        a, b, scaling = layer.lora_A[name], layer.lora_B[name], layer.scaling[name]
        return _linear_with_adapter(base, x, a, b, scaling, quant_state=quant_state)
    result = base(x)
    dtype = result.dtype
    a = layer.lora_A[name].weight.to(dtype)
    b, scaling = layer.lora_B[name].weight.to(dtype), layer.scaling[name]  # scaling: the matmul's alpha
    xa = functional.linear(dropout(x), a)  # autocast's dtype under it, else x's (= dtype)
    rows = xa.reshape(-1, xa.shape[-1])
    if type(layer.base_layer) is torch.nn.Linear and result.is_contiguous():
        # in place: a plain Linear keeps its input and weight for backward, not its output (a subclass, such
        # as float8's, may keep more)
        result.view(-1, result.shape[-1]).addmm_(rows, b.t(), alpha=scaling)
        return result
    return torch.addmm(result.reshape(-1, result.shape[-1]), rows, b.t(), alpha=scaling).view(result.shape)


def _linear_with_adapter(
    base, x: torch.Tensor, lora_a, lora_b, scaling: float, *, quant_state=None
) -> torch.Tensor:
    """``base(x) + scaling * lora_b(lora_a(x))`` for a plain ``nn.Linear`` base, or a 4-bit one given its
    ``quant_state``, in the compute dtype (the autocast dtype under autocast, else x's), through
    ``_LinearWithAdapter``: each operand cast once, as autocast would cast it (a no-op for a bf16 base under
    bf16 autocast; the fp32 adapters' casts are r rows and carry their gradients back to fp32; the packed
    4-bit weight is dequantized inside)."""
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    bias = None if base.bias is None else base.bias.to(dtype)
    weight = base.weight if quant_state is not None else base.weight.to(dtype)
    with torch.autocast(device, enabled=False):
        out = _LinearWithAdapter.apply(
            x.to(dtype),
            weight,
            bias,
            lora_a.weight.to(dtype),
            lora_b.weight.to(dtype),
            scaling,
            quant_state,
        )
    # shaped outside the function: a view made inside it may not be written in place (the loss writes its
    # gradient over an adapted head's logits)
    return out.view(*x.shape[:-1], out.shape[-1])


def _dora_forward(layer, x: torch.Tensor, name: str, *, quant_state=None) -> torch.Tensor:
    """DoRA's output for ``layer``'s adapter ``name`` (module docstring, "DoRA"): ``m / ||W + s B A||`` (per
    output feature; the norm detached) times the fused ``x W^T + s (x A^T) B^T``, the base's bias added
    after, unscaled, as peft adds it. With active dropout, peft's definition: the base's output on x, plus
    ``(scale - 1) W d + scale s B A d`` on the dropped-out input d (the norms computed as above)."""
    base = layer.get_base_layer()
    a, b, scaling = layer.lora_A[name].weight, layer.lora_B[name].weight, layer.scaling[name]
    magnitude = layer.lora_magnitude_vector[name].weight
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    weight = base.weight if quant_state is not None else base.weight.to(dtype)
    with torch.no_grad():
        norm = dora_weight_norm(base.weight, a, b, scaling, quant_state=quant_state, dtype=dtype)
    dropout = layer.lora_dropout[name]
    if not (isinstance(dropout, torch.nn.Identity) or not dropout.training or dropout.p == 0):
        result = layer.base_layer(x)  # the base's own forward on x, its bias included, before the mask
        dropped = dropout(x)
        with torch.autocast(device, enabled=False):
            rows = dropped.to(dtype).reshape(-1, x.shape[-1])
            if quant_state is not None:
                applied = bitsandbytes.matmul_4bit(rows, weight.t(), quant_state=quant_state)
            else:
                applied = rows @ weight.t()  # W on the dropped-out input: peft's "base_result" there
            adapter = (rows @ a.to(dtype).t()) @ b.to(dtype).t()
            scale = (magnitude / norm).to(dtype)
            extra = torch.addcmul(applied * (scale - 1), adapter, scale, value=scaling)
            return result + extra.view(*x.shape[:-1], extra.shape[-1])
    with torch.autocast(device, enabled=False):
        out = _LinearWithAdapter.apply(
            x.to(dtype), weight, None, a.to(dtype), b.to(dtype), scaling, quant_state
        )
        out = out.view(*x.shape[:-1], out.shape[-1])
        scale = (magnitude / norm).to(dtype)  # the magnitudes' gradient flows back through the cast
        if base.bias is None:
            return out * scale
        return torch.addcmul(base.bias.to(dtype), out, scale)


def dora_weight_norm(
    weight: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scaling: float,
    *,
    quant_state=None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The row norms ``||W + s B A||`` (fp32, one per output feature) without forming anything of W's size:
    ``||W_i||^2 + 2 s (W A^T)_i . B_i + s^2 B_i (A A^T) B_i^T``. W is read twice: its row norms, taken in
    W's dtype (bf16 for a bf16 base, as peft's whole norm is: one rounding of each; torch's CPU reduction
    asked for an fp32 result from bf16 runs far slower, docs/benchmarks.md), and ``W A^T``; a 4-bit W is
    dequantized to ``dtype`` for them, as its backward does. Nothing is kept between calls: a frozen W
    written in place (a merge) cannot leave a stale norm."""
    dense = _dequantized(weight, quant_state, dtype or a.dtype) if quant_state is not None else weight
    squares = torch.linalg.vector_norm(dense, dim=1).float().square()
    a32, b32 = a.float(), b.float()
    wa = (dense @ a.to(dense.dtype).t()).float()  # [out x r]
    cross = (wa * b32).sum(1)
    own = ((b32 @ (a32 @ a32.t())) * b32).sum(1)
    return (squares + (2 * scaling) * cross + (scaling * scaling) * own).clamp_min(0).sqrt()


class _LinearWithAdapter(torch.autograd.Function):
    """``x @ W.T (+ bias) + scaling * (x @ A.T) @ B.T`` with each sum inside a matmul: forward, the
    adapter's product accumulates into the base output (``addmm_``); backward, the adapter's share of the
    input gradient accumulates into the base's (``g @ W`` then ``addmm_(g @ B, A)``), where autograd would
    sum two activation-sized gradients in a pass of its own. ``scaling`` is each of those matmuls' ``alpha``
    (applied to its fp32 accumulator), not a pass over B of its own forward and backward. Saved for backward:
    x (the one tensor both products read), x @ A.T (r columns) and the weights. With ``quant_state``,
    ``weight`` is a packed 4-bit weight (frozen): its product is bitsandbytes' ``matmul_4bit``, and backward
    dequantizes it again."""

    @staticmethod
    def forward(ctx, x, weight, bias, a, b, scaling, quant_state):
        rows = x.reshape(-1, x.shape[-1])
        if quant_state is not None:
            out = bitsandbytes.matmul_4bit(rows, weight.t(), quant_state=quant_state, bias=bias)
        else:
            out = rows @ weight.t() if bias is None else torch.addmm(bias, rows, weight.t())
        xa = rows @ a.t()
        out.addmm_(xa, b.t(), alpha=scaling)
        ctx.save_for_backward(rows, weight, a, b, xa)
        ctx.quant_state, ctx.scaling = quant_state, scaling
        ctx.x_shape = x.shape
        return out  # [tokens x out]: the caller shapes it (a view made here could not be written in place)

    @staticmethod
    def backward(ctx, grad):
        rows, weight, a, b, xa = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        needs, scaling = ctx.needs_input_grad, ctx.scaling
        nothing = g.new_empty(())  # addmm's ignored input at beta = 0: scaling as alpha, no pass of its own
        grad_xa = g @ b if needs[0] or needs[3] else None  # unscaled: each use below scales it
        grad_x = None
        if needs[0]:
            dense = weight if ctx.quant_state is None else _dequantized(weight, ctx.quant_state, g.dtype)
            grad_x = (g @ dense).addmm_(grad_xa, a, alpha=scaling).view(ctx.x_shape)
        grad_weight = g.t() @ rows if needs[1] else None
        grad_bias = g.sum(0) if needs[2] else None
        grad_a = torch.addmm(nothing, grad_xa.t(), rows, beta=0, alpha=scaling) if needs[3] else None
        grad_b = torch.addmm(nothing, g.t(), xa, beta=0, alpha=scaling) if needs[4] else None
        return grad_x, grad_weight, grad_bias, grad_a, grad_b, None, None


GROUP_KEY = "_fastlm_shared_input"  # a grouped layer's (group, index), in its __dict__ (not a submodule)
# Sibling projections that read the same input in the model families fastlm adapts (their module names)
SHARED_INPUT_NAMES = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("query", "key", "value"))


class _SharedInput:
    """Sibling LoRA layers that read one input (``group_shared_inputs``): the first of them called with an
    input computes every member's output in one ``_SharedInputLinears`` and keeps the others' until their
    layers ask for them with the same tensor."""

    def __init__(self, members: list) -> None:
        self.members = members
        self.pending: tuple | None = None  # (input, its version, {member index: output}) not yet taken
        self.enabled = True

    def take(self, index: int, x: torch.Tensor) -> torch.Tensor | None:
        """Member ``index``'s output computed with the group for this very ``x``, if one waits; else None
        (and never while compiling: the compiler sees each layer's own forward, no state kept between
        calls)."""
        pending = self.pending
        if pending is None or torch.compiler.is_compiling():
            return None
        source, version, outputs = pending
        if source is x and index in outputs and _version(x) == version:
            out = outputs.pop(index)
            if not outputs:
                self.pending = None
            return out
        self.pending = None
        # this member's output for another tensor was waiting: it reads its own input (a cross-attention's k
        # and v). Otherwise they are a cut-short forward's leftovers, dropped.
        if index in outputs:
            self.enabled = False
            log.warning(
                "LoRA layers %s do not read one input: each computes its own from now on",
                ", ".join(type(member).__name__ for member in self.members),
            )
        return None

    def applies(self) -> bool:
        """Whether ``compute`` can run now (the group on, not compiling): checked before a member's plan is
        built."""
        return self.enabled and not torch.compiler.is_compiling()

    def compute(self, index: int, x: torch.Tensor, own: dict | None) -> torch.Tensor | None:
        """Every member's output for ``x`` in one step; member ``index``'s returned (its plan ``own``,
        checked by its forward), the others' kept for ``take``. None where the group does not apply."""
        if own is None or not self.enabled or torch.compiler.is_compiling():
            return None
        plan = [
            own if other == index else _member_plan(member, x) for other, member in enumerate(self.members)
        ]
        if any(step is None for step in plan):
            return None
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        with torch.autocast(device, enabled=False):
            outputs = _SharedInputLinears.apply(
                x.to(dtype),
                tuple(step["scaling"] for step in plan),
                tuple(step["quant_state"] for step in plan),
                *(
                    step["weight"] if step["quant_state"] is not None else step["weight"].to(dtype)
                    for step in plan
                ),
                *(None if step["bias"] is None else step["bias"].to(dtype) for step in plan),
                *(step["a"].to(dtype) for step in plan),
                *(step["b"].to(dtype) for step in plan),
            )
        rest = {other: out for other, out in enumerate(outputs) if other != index}
        self.pending = (x, _version(x), rest)
        return outputs[index]


def _version(x: torch.Tensor) -> int:
    """``x``'s version counter (changed by each in-place write); -1 for an inference tensor
    (``torch.inference_mode``: generation), which keeps none."""
    return -1 if x.is_inference() else x._version


def _member_plan(layer, x: torch.Tensor, name: str | None = None, state=None) -> dict | None:
    """What ``_SharedInputLinears`` needs of ``layer`` for input ``x``, or None where it does not apply
    (peft's forward, active dropout, a base that is not a plain or 4-bit Linear, a trained base). ``name``
    and ``state``: the adapter and 4-bit quantization state the layer's own forward found already."""
    name = name or _single_plain_adapter(layer, x, (), {})
    if name is None:
        return None
    dropout = layer.lora_dropout[name]
    if not (isinstance(dropout, torch.nn.Identity) or not dropout.training or dropout.p == 0):
        return None
    base = layer.base_layer
    if state is None and FusedLoraLinear4bit is not None and type(layer) is FusedLoraLinear4bit:
        state = _quant_state(base, x)
    if state is None and type(base) is not torch.nn.Linear:
        return None
    if base.weight.requires_grad or (base.bias is not None and base.bias.requires_grad):
        return None
    return {
        "weight": base.weight,
        "bias": base.bias,
        "quant_state": state,
        "a": layer.lora_A[name].weight,
        "b": layer.lora_B[name].weight,
        "scaling": layer.scaling[name],
    }


def group_shared_inputs(model) -> int:
    """Each set of fused LoRA siblings that read one input (``SHARED_INPUT_NAMES``: q/k/v, gate/up; not in a
    cross-attention) becomes a shared-input group; returns how many groups."""
    groups = 0
    for path, parent in model.named_modules():
        if _cross_attention(path, parent):
            continue
        for names in SHARED_INPUT_NAMES:
            members = [getattr(parent, name, None) for name in names]
            members = [
                member
                for member in members
                if member is not None and is_fused(member) and not getattr(member, "lora_variant", None)
            ]  # DoRA layers compute their own (_dora_forward)
            if len(members) < 2:
                continue
            group = _SharedInput(members)
            for index, member in enumerate(members):
                member.__dict__[GROUP_KEY] = (group, index)  # not a submodule: no state
            groups += 1
    return groups


def shares_input(module) -> bool:
    """Whether ``module`` is a LoRA layer in a shared-input group (``group_shared_inputs``)."""
    return GROUP_KEY in module.__dict__


def _cross_attention(path: str, module) -> bool:
    """Whether ``module`` (at ``path``) is a cross-attention, whose q reads other states than its k and v:
    BART-family and Whisper ``encoder_attn``, BERT-style ``crossattention``, ``cross_attn``, T5's
    ``EncDecAttention``, or a module that says so (``is_cross_attention``)."""
    name = path.rsplit(".", 1)[-1].lower()
    return (
        "cross" in name
        or name in ("encoder_attn", "encdecattention")
        or bool(getattr(module, "is_cross_attention", False))
    )


def ungroup_shared_inputs(model) -> int:
    """The reverse of ``group_shared_inputs``: each layer computes its own output; returns how many layers."""
    count = 0
    for module in model.modules():
        if module.__dict__.pop(GROUP_KEY, None) is not None:
            count += 1
    return count


class _SharedInputLinears(torch.autograd.Function):
    """``out_i = x @ W_i.T (+ b_i) + s_i * (x @ A_i.T) @ B_i.T`` for the n members of a shared-input group,
    in one step (module docstring): forward, x is multiplied by every adapter's A in one matmul (read once,
    not n times); backward, the input gradient ``sum_i g_i @ W_i + (s_i g_i @ B_i) @ A_i`` accumulates
    inside the matmuls (``addmm_``), where autograd would sum n activation-sized gradients in n - 1 passes
    of their own, and the adapters' A gradients come from one matmul that reads x once. Frozen bases only
    (LoRA's); a member's 4-bit weight (``quant_states``) multiplies through bitsandbytes as in
    ``_LinearWithAdapter``."""

    @staticmethod
    def forward(ctx, x, scalings, quant_states, *tensors):
        n = len(scalings)
        weights, biases, lora_a, lora_b = (tensors[i * n : (i + 1) * n] for i in range(4))
        rows = x.reshape(-1, x.shape[-1])
        a_all = torch.cat(lora_a)  # [sum of ranks x in]: r rows each
        xa = rows @ a_all.t()  # x read once for every adapter
        outputs, start = [], 0
        for weight, bias, a, b, scaling, state in zip(
            weights, biases, lora_a, lora_b, scalings, quant_states, strict=True
        ):
            if state is not None:
                out = bitsandbytes.matmul_4bit(rows, weight.t(), quant_state=state, bias=bias)
            else:
                out = rows @ weight.t() if bias is None else torch.addmm(bias, rows, weight.t())
            out.addmm_(xa[:, start : start + a.shape[0]], b.t(), alpha=scaling)
            start += a.shape[0]
            outputs.append(out.view(*x.shape[:-1], out.shape[-1]))
        ctx.save_for_backward(rows, a_all, xa, *weights, *lora_b)
        ctx.scalings, ctx.quant_states, ctx.x_shape = scalings, quant_states, x.shape
        ctx.ranks = [a.shape[0] for a in lora_a]
        ctx.set_materialize_grads(False)  # a member whose output went unused gives no gradient
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        rows, a_all, xa, *rest = ctx.saved_tensors
        n = len(ctx.scalings)
        weights, lora_b = rest[:n], rest[n:]
        needs = ctx.needs_input_grad
        need_bias, need_a, need_b = (needs[3 + i * n : 3 + (i + 1) * n] for i in (1, 2, 3))
        gs = [None if g is None else g.reshape(-1, g.shape[-1]) for g in grads]
        nothing = rows.new_empty(())  # addmm's ignored input at beta = 0: scaling as alpha
        # each adapter's gradient at x @ A.T, scaled: [tokens x r] each, side by side as xa is
        grad_xa = torch.cat(
            [
                rows.new_zeros(rows.shape[0], rank)
                if g is None
                else torch.addmm(nothing, g, b, beta=0, alpha=scaling)
                for g, b, rank, scaling in zip(gs, lora_b, ctx.ranks, ctx.scalings, strict=True)
            ],
            dim=1,
        )
        grad_x = None
        if needs[0]:
            for g, weight, state in zip(gs, weights, ctx.quant_states, strict=True):
                if g is None:
                    continue
                dense = weight if state is None else _dequantized(weight, state, g.dtype)
                grad_x = g @ dense if grad_x is None else grad_x.addmm_(g, dense)
            grad_x = grad_xa @ a_all if grad_x is None else grad_x.addmm_(grad_xa, a_all)
            grad_x = grad_x.view(ctx.x_shape)
        grad_a_all = grad_xa.t() @ rows if any(need_a) else None
        grad_a, grad_b, grad_bias, start = [], [], [], 0
        for i, (g, rank, scaling) in enumerate(zip(gs, ctx.ranks, ctx.scalings, strict=True)):
            grad_a.append(grad_a_all[start : start + rank] if need_a[i] else None)
            xa_i = xa[:, start : start + rank]
            start += rank
            grad_b.append(
                torch.addmm(nothing, g.t(), xa_i, beta=0, alpha=scaling)
                if need_b[i] and g is not None
                else None
            )
            grad_bias.append(g.sum(0) if need_bias[i] and g is not None else None)
        return (grad_x, None, None, *([None] * n), *grad_bias, *grad_a, *grad_b)


def _dequantized(weight: torch.Tensor, quant_state, dtype: torch.dtype) -> torch.Tensor:
    """A packed 4-bit weight as a dense ``[out x in]`` matrix in ``dtype``."""
    return bnb_functional.dequantize_4bit(weight, quant_state).to(dtype)


def _pairs() -> dict[type, type]:
    """peft's LoRA layer classes and their fused versions."""
    pairs = {PeftLoraLinear: FusedLoraLinear}
    if PeftLoraLinear4bit is not None:
        pairs[PeftLoraLinear4bit] = FusedLoraLinear4bit
    return pairs


def fuse_lora_forward(model) -> int:
    """Each plain or 4-bit LoRA Linear of ``model`` (exactly peft's ``lora.Linear`` or
    ``lora.Linear4bit``) becomes a ``FusedLoraLinear`` or ``FusedLoraLinear4bit`` in place; returns how
    many."""
    return _swap_classes(model, _pairs())


def use_peft_forward(model) -> int:
    """The reverse of ``fuse_lora_forward``: peft's own forward on every layer (the A/B's other side)."""
    return _swap_classes(model, {fused: peft for peft, fused in _pairs().items()})


def is_fused(module) -> bool:
    """Whether ``module`` is a LoRA layer with the fused forward."""
    return type(module) in _pairs().values()


def _swap_classes(model, swaps: dict[type, type]) -> int:
    count = 0
    for module in model.modules():
        after = swaps.get(type(module))
        if after is not None:
            module.__class__ = after
            count += 1
    return count
