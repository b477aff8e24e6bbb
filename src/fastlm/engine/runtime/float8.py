"""FP8 matmuls for training through torchao (``train.runtime.float8``: off | on | auto).

``torchao.float8.convert_to_float8_training`` swaps chosen ``nn.Linear`` layers for ``Float8Linear``: the
weights stay as they are (fp32 or bf16 masters, same ``Parameter`` objects, so the optimizer and DDP see no
change) and each matmul casts its inputs to float8 with dynamic per-tensor scales, forward and backward.

``auto`` turns it on only where it pays:

* a CUDA device of compute capability 8.9 or more (Ada, Hopper, Blackwell): float8 tensor cores;
* torchao installed (it is not a dependency of the project);
* a model hidden size of 2048 or more. Each float8 matmul first reads its inputs to find their largest
  value and writes a float8 copy (memory-bound work proportional to M*K), while the matmul's saving is
  proportional to M*K*N: in torchao's measurements the casts eat the gain below dims of a couple of
  thousand, and small models train slower in float8 than in bf16.

Anything else is off, with the reason logged. ``on`` is refused in one line where the machine cannot do it
(``engine.config.RuntimeParams``). Which layers: ``module_filter``.

Where the rule passes, ``auto`` makes float8 a candidate, not a choice: the gain depends on the shapes, the
batch and the GPU together (the casts are memory-bound, the matmuls compute-bound), so the training run
measures it on its first micro-batch (``runtime.probe.probe_float8``) and keeps float8 only where it is
faster by a margin (one process; several processes follow the rule, each rank would measure its own). Its
timings are kept in the run's ``runtime_choices.json`` (``runtime.remembered``): the same command again
chooses alike, unmeasured.
``Float8Swap`` lets it measure both without converting twice or copying the model: it converts once and
then swaps the plain and the float8 layers in and out of the model (both hold the same weight
``Parameter`` objects), so a reverted model holds exactly its original modules again. The throughput
autotune (``tune``) keeps the rule: its trials are too short to measure another set-up inside each.

Under FSDP2 (``train.distributed.strategy: fsdp``) the layers are converted before ``fully_shard`` (as
torchao's FSDP2 recipe does: each sharded layer keeps the modules it was given, so none can be swapped in
later) and ``auto`` follows the rule. FSDP2 gathers the weights in bf16 or fp32 (its
``MixedPrecisionPolicy``); each Float8Linear casts the gathered weight to float8 in its forward, as under
DDP. torchao's float8 all-gather (``enable_fsdp_float8_all_gather``, half the gathered bytes, a scale
update after each optimizer step) is not wired: gloo cannot gather float8, so no CPU run could test it.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable

import torch
from torch import nn

log = logging.getLogger(__name__)

MIN_CAPABILITY = (8, 9)
MIN_HIDDEN_SIZE = 2048
ALIGNMENT = 16  # float8 GEMMs (cuBLASLt / torch._scaled_mm) need both matrix dims divisible by 16


def token_multiple(requested: str, device_type: str, *, row_length: int | None = None) -> int:
    """The multiple of which each micro-batch's token count must be where float8 layers may train: the
    count is the inner dimension of each float8 weight gradient (``grad_out.T @ input``), which CUDA's
    float8 GEMM takes only in multiples of ``ALIGNMENT`` (an H100 refused 4,088 tokens). ``on``, or ``auto``
    where the rule may pass before the model is known (a CUDA device of capability 8.9 or more, torchao
    installed; its probe may keep the layers): ``ALIGNMENT``; else 1, so no other run pads more. The
    collators pad to it (``BatchingParams.pad_multiple``); the varlen row's multiple is one
    (``attention.inputs``). ``row_length``: packed rows of a length the user set
    (``BatchingParams.fixed_row_length``); under ``auto`` one float8 cannot take leaves float8 off
    (``float8_decision``), so nothing is aligned."""
    if requested == "on":
        return ALIGNMENT
    if requested != "auto" or device_type != "cuda" or not torch.cuda.is_available():
        return 1
    if row_length is not None and row_length % ALIGNMENT:
        return 1
    if tuple(torch.cuda.get_device_capability()) < MIN_CAPABILITY or not torchao_installed():
        return 1
    return ALIGNMENT


def torchao_installed() -> bool:
    return importlib.util.find_spec("torchao") is not None


def load_converter() -> Callable:
    from torchao.float8 import convert_to_float8_training

    return convert_to_float8_training


def _hidden_size(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    for name in ("hidden_size", "d_model", "n_embd"):
        if isinstance(getattr(config, name, None), int):
            return getattr(config, name)
    return None


# a model with no layer float8 takes (e.g. a 4-bit base whose Linear layers are all bitsandbytes')
NO_LAYER = (
    f"float8 off ({{requested}}): no Linear layer can take it (plain Linear layers of in and out features "
    f"multiples of {ALIGNMENT}, not the head, not LoRA's adapters: a 4-bit base's quantized layers are not); "
    "the run trains as with train.runtime.float8: off"
)


def float8_decision(
    requested: str,
    model: nn.Module,
    device: torch.device,
    *,
    strategy: str = "ddp",
    row_length: int | None = None,
) -> tuple[bool, str]:
    """Whether to train ``model`` with float8 matmuls on ``device``, and why (see the module docstring).
    ``strategy``: ``train.distributed.strategy`` (FSDP2: ``auto`` follows the rule, module docstring).
    ``row_length``: packed rows of a length the user set (``BatchingParams.fixed_row_length``): ``auto`` is
    off where it is not a multiple of ``ALIGNMENT`` (``on`` has the batching refuse it)."""
    if requested == "off":
        return False, "float8 off (train.runtime.float8: off)"
    if requested == "on":  # the config checked the machine; a model with no layer to convert trains as off
        if not _has_float8_layer(model):
            return False, NO_LAYER.format(requested="on")
        return True, "float8 on (train.runtime.float8: on)"
    if device.type != "cuda" or not torch.cuda.is_available():
        return False, f"float8 off (auto): {device.type} is not a CUDA device"
    capability = torch.cuda.get_device_capability(device)
    if tuple(capability) < MIN_CAPABILITY:
        return False, (
            f"float8 off (auto): compute capability {capability[0]}.{capability[1]} < "
            f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} (no float8 tensor cores)"
        )
    hidden = _hidden_size(model)
    if hidden is None or hidden < MIN_HIDDEN_SIZE:
        return False, (
            f"float8 off (auto): hidden size {hidden} < {MIN_HIDDEN_SIZE} (the float8 casts "
            "cost more than the faster matmuls save)"
        )
    if row_length is not None and row_length % ALIGNMENT:
        return False, (
            f"float8 off (auto): train.batching.row_length {row_length} is not a multiple of {ALIGNMENT} "
            "(the token counts float8 GEMMs take; auto or a multiple of 16 lets float8 be measured)"
        )
    if not _has_float8_layer(model):
        return False, NO_LAYER.format(requested="auto")
    if not torchao_installed():  # last: the package named only where it is all that is missing
        return False, "float8 off (auto): torchao is not installed (`pip install torchao`)"
    why = f"compute capability {capability[0]}.{capability[1]}, torchao, hidden size {hidden}"
    why += f" >= {MIN_HIDDEN_SIZE}"
    if strategy == "fsdp":  # converted before sharding: nothing to swap in and out of sharded layers later
        why += "; under FSDP2 the rule decides (converted before sharding, not measured)"
    return True, f"float8 on (auto): {why}"


def _has_float8_layer(model: nn.Module) -> bool:
    """Whether ``model`` has a layer ``module_filter`` keeps."""
    keep = module_filter(model)
    return any(keep(module, name) for name, module in model.named_modules() if name)


def module_filter(model: nn.Module) -> Callable[[nn.Module, str], bool]:
    """``module_filter_fn(module, fqn)`` for torchao: plain ``nn.Linear`` layers whose in and out features are
    multiples of 16, except the output head. The head is left in bf16: its logits feed a softmax over the
    whole vocabulary, where float8's 3-bit mantissa shows in the loss, and the fused linear loss multiplies
    its weight itself; so is a trained copy of it (``lora.modules_to_save: [lm_head]``: peft's wrapper holds
    the frozen head and the copy, both plain Linear layers). Subclasses (bitsandbytes' 4-bit layers, peft's
    LoRA wrappers, an already converted Float8Linear) are left out: their forward is not a plain matmul of
    the weight. A LoRA layer's adapters (``lora_A`` / ``lora_B``) are too: rank-r matmuls, where the casts
    cost more than the matmul, and the fused LoRA forward (``model.lora_forward``) reads their weights
    itself; the frozen base Linear inside a LoRA layer is kept."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    left_out = {id(module) for module in head.modules()} if isinstance(head, nn.Module) else set()
    for module in model.modules():
        for name in ("lora_A", "lora_B"):
            adapters = getattr(module, name, None)
            if isinstance(adapters, nn.Module):
                left_out.update(id(adapter) for adapter in adapters.modules())

    def keep(module: nn.Module, fqn: str) -> bool:
        return (
            type(module) is nn.Linear
            and id(module) not in left_out
            and module.in_features % ALIGNMENT == 0
            and module.out_features % ALIGNMENT == 0
        )

    return keep


def apply_float8(
    model: nn.Module,
    requested: str,
    device: torch.device,
    *,
    strategy: str = "ddp",
    measured_later: bool = False,
    row_length: int | None = None,
) -> str:
    """Convert ``model``'s eligible Linear layers in place where ``float8_decision`` says so; why, logged.
    ``measured_later``: an ``auto`` the rule allows is left unconverted, for the run's first micro-batch to
    measure (``runtime.probe.probe_float8``). ``row_length``: as ``float8_decision``'s."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    on, why = float8_decision(requested, base, device, strategy=strategy, row_length=row_length)
    if on and measured_later and requested == "auto":
        why = f"{why}: a candidate, measured on the first micro-batch"
        log.debug("%s", why)
        return why
    if not on and why == NO_LAYER.format(requested="on"):  # e.g. a 4-bit base (QLoRA): bitsandbytes' layers
        log.warning("%s", why)
        return why
    if on:
        keep = module_filter(model)
        chosen = sum(1 for name, module in model.named_modules() if name and keep(module, name))
        load_converter()(model, module_filter_fn=keep)
        why = f"{why}: {chosen} Linear layers in float8"
    log.log(logging.INFO if device.type == "cuda" else logging.DEBUG, "%s", why)  # CPU: nothing to say
    return why


def float8_layers(model: nn.Module) -> int:
    """How many of ``model``'s layers are torchao's float8 Linear layers (converted by ``apply_float8``)."""
    return sum(1 for module in model.modules() if type(module).__name__ == "Float8Linear")


def plain_layers(model: nn.Module) -> int:
    """``model``'s float8 Linear layers (``apply_float8``, a kept ``Float8Swap``) replaced, in place, by plain
    ``nn.Linear`` layers holding the same weight and bias ``Parameter`` objects: the model a finished run
    hands back computes as the one it saves and predict loads. Not for sharded layers (FSDP2 hands back a
    model rebuilt from the gathered weights). How many were replaced."""
    converted = [
        (name, module) for name, module in model.named_modules() if type(module).__name__ == "Float8Linear"
    ]
    for name, module in converted:
        bias = module.bias is not None
        plain = nn.Linear(module.in_features, module.out_features, bias=bias, device="meta")
        plain.weight = module.weight
        if bias:
            plain.bias = module.bias
        plain.train(module.training)
        model.set_submodule(name, plain)
    return len(converted)


class Float8Swap:
    """``model``'s eligible Linear layers converted once (torchao, or ``converter``), then swapped in and out.

    The converted layers keep the originals' weight ``Parameter`` objects (torchao's ``Float8Linear`` does),
    so the optimizer built before, DDP's buckets and the gradients are the same either way; swapping is a
    ``setattr`` per layer, so the probe can alternate its timed passes between the two. Created converted.
    """

    def __init__(self, model: nn.Module, converter: Callable | None = None) -> None:
        keep = module_filter(model)
        self.model = model
        self.plain = {name: module for name, module in model.named_modules() if name and keep(module, name)}
        (converter or load_converter())(model, module_filter_fn=keep)
        self.float8 = {name: model.get_submodule(name) for name in self.plain}
        self.converted = True

    def use(self, float8: bool) -> None:
        """The float8 layers in the model (True) or the original plain ones (False)."""
        for name, module in (self.float8 if float8 else self.plain).items():
            self.model.set_submodule(name, module)
        self.converted = float8

    def __len__(self) -> int:
        return len(self.plain)
