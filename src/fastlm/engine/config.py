"""Training parameters (``params:train``), validated once into typed objects with one-line errors."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from fastlm.errors import ConfigError
from fastlm.validation import Params, parse_params

# ``python -m fastlm merge-adapter --dtype``: the merged weights' dtype; auto: the base folder's saved dtype
# (``model.adapter_folder.saved_dtype``). Here, not in the adapter folder module, so that the command line
# parses without torch.
MERGE_DTYPES = ("auto", "float32", "bfloat16", "float16")

SOURCE = "conf/base/parameters_train.yml"
# LoRA inits that leave the base weights alone (the others, PiSSA's and OLoRA's, move part of them into the
# adapters)
BASE_KEEPING_INITS = ("default", "gaussian")


class LoraParams(Params):
    """LoRA adapters through peft (``fastlm.engine.model.lora``): only the adapters train, the base stays
    frozen."""

    enabled: bool = False
    r: int = Field(16, ge=1)
    alpha: float = Field(32, gt=0)
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="LoRA dropout on each adapter's input; 0 (peft's own default) keeps the fused forward "
        "whole and the shared-input groups on (above 0 each layer draws its own mask: no groups, only the "
        "forward sum fused)",
    )
    use_rslora: bool = Field(
        False,
        description="rank-stabilized LoRA: scaling alpha / sqrt(r) instead of alpha / r (peft's use_rslora), "
        "so a higher rank keeps learning; the fused forward takes it as its matmuls' alpha",
    )
    use_dora: bool = Field(
        False,
        description="weight-decomposed LoRA (DoRA, peft's use_dora): a trained magnitude per output feature "
        "over the adapted weight's direction; with fused_forward its norms come from W A^T and r x r "
        "products, nothing weight-sized formed (engine/model/lora_forward.py), slower than plain LoRA all "
        "the same; no shared-input groups",
    )
    loraplus_lr_ratio: float | None = Field(
        None,
        gt=0,
        description="LoRA+: the B matrices (and the 1-D trainable parameters: biases, DoRA's magnitudes, as "
        "peft's create_loraplus_optimizer groups them) learn this many times faster than the A matrices "
        "(optimizer groups of their own, the same schedule; the LoRA+ paper suggests 16); an adapted "
        "embedding's B too, its A at the base rate (peft: both at its absolute loraplus_lr_embedding, "
        "engine/train/optim.py); null: one rate",
    )
    target_modules: list[str] | Literal["auto", "all-linear"] = Field(
        "auto", description="auto: per-architecture defaults (fastlm.engine.model.lora.DEFAULT_TARGETS)"
    )
    bias: Literal["none", "all", "lora_only"] = "none"
    modules_to_save: list[str] | None = None
    base_dtype: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        "auto",
        description="frozen base weights (QLoRA: what the 4-bit weights are multiplied in); auto: bf16 on "
        "GPUs that have it, else fp32 (QLoRA: bf16, or fp16 on a GPU without native bf16)",
    )
    load_in_4bit: bool = Field(
        False, description="QLoRA: 4-bit NF4 base weights (bitsandbytes; CUDA, or CPU from bitsandbytes 0.50)"
    )
    fused_forward: bool = Field(
        True,
        description="the adapter's product added inside the base output's matmul in the compute dtype, no "
        "activation-sized dtype copies (engine/model/lora_forward.py); false: peft's own forward",
    )
    shared_input: bool = Field(
        True,
        description="with fused_forward, the adapted projections that read one input (q/k/v, gate/up) "
        "computed in one step: the input and its adapters read once, their input gradients summed inside the "
        "matmuls (engine/model/lora_forward.py); false: each layer on its own",
    )
    init: str = Field(  # after load_in_4bit and use_dora: its check reads them
        "default",
        description="the adapters' initial weights (peft's init_lora_weights): default (A random, "
        "B zero), gaussian (A normal), pissa (A and B the top r singular directions of each adapted "
        "weight, the base keeping the rest: PiSSA, a full SVD of each weight at build), pissa_niter_<n> "
        "(PiSSA through a seeded randomized SVD of n iterations: quick on large weights), olora (a QR "
        "decomposition: OLoRA). PiSSA and OLoRA train over a changed base; the adapter saved is converted "
        "into a plain LoRA of rank 2 r for the unchanged base (peft's conversion)",
    )

    @field_validator("init")
    @classmethod
    def _known_init(cls, value: str, info: ValidationInfo) -> str:
        if not re.fullmatch(r"default|gaussian|pissa|olora|pissa_niter_[1-9][0-9]*", value):
            raise ValueError("must be default, gaussian, pissa, pissa_niter_<n> (n >= 1) or olora")
        if value in BASE_KEEPING_INITS:
            return value
        if info.data.get("load_in_4bit"):
            raise ValueError(
                f"{value} moves part of each weight into the adapters, and a 4-bit base rounds what is left "
                "again: the adapter saved for the unchanged base would not give the trained model; use "
                "default or gaussian with load_in_4bit, or this init on a 16- or 32-bit base"
            )
        if info.data.get("use_dora"):
            raise ValueError(
                f"{value} with use_dora: peft's conversion into an adapter for the unchanged base keeps no "
                "DoRA magnitudes; use default or gaussian with DoRA"
            )
        return value

    @model_validator(mode="after")
    def _loraplus_needs_lora(self):
        if self.loraplus_lr_ratio is not None and not self.enabled:
            raise ValueError(
                "loraplus_lr_ratio sets the LoRA B matrices' learning rate and LoRA is off; set "
                "train.model.lora.enabled: true, or loraplus_lr_ratio: null"
            )
        if self.load_in_4bit and not self.enabled:  # else a full fine-tune of every weight in fp32
            raise ValueError(
                "load_in_4bit quantizes the frozen base of LoRA (QLoRA) and LoRA is off; set "
                "train.model.lora.enabled: true for QLoRA, or load_in_4bit: false for a full fine-tune"
            )
        return self


class ModelParams(Params):
    name_or_path: str | None = Field(
        None, min_length=1, description="local directory or hub id; null = from scratch"
    )
    lora: LoraParams = LoraParams()
    trust_remote_code: bool = False
    allow_download: bool = False
    allow_new_weights: bool = Field(
        False,
        description="load weights the checkpoint lacks as new (e.g. a new "
        "head), logged; false: any missing or unused weight is an error",
    )
    resize_embeddings: bool = Field(
        False,
        description="grow the embedding to the tokenizer's size (logged) "
        "when the model's own tokenizer is larger than it",
    )
    attn_implementation: Literal[
        "auto",
        "sdpa",
        "eager",
        "flex_attention",
        "flash_attention_2",
        "flash_attention_3",
        "torch_varlen",
        "sdpa_varlen",
    ] = "auto"
    gradient_checkpointing: Literal["off", "selective", "full", "auto"] = Field(
        "off",
        description="activation recompute (engine/model/recompute.py): off, selective (every "
        "other decoder layer), full (every layer), auto (off unless the tune pipeline chose one); "
        "true/false = full/off",
    )
    neftune_noise_alpha: float = Field(
        0.0,
        ge=0,
        description="NEFTune: while training, uniform noise of at most alpha / sqrt(sample length x hidden "
        "size) on each input embedding, the token's own sample's length whatever the batching or attention "
        "path (engine/model/noise.py; the Trainer's and TRL's neftune_noise_alpha; the paper's runs used 5); "
        "0: off",
    )
    liger: Literal["auto", "on", "off"] = Field(
        "auto",
        description="liger-kernel's fused RMSNorm, rotary and SwiGLU/GeGLU patched onto the model "
        "(engine/model/liger.py); auto: on a CUDA run with liger-kernel installed and a family it patches, "
        "else off (the reason is logged)",
    )
    # From-scratch Llama-architecture config (ignored with name_or_path).
    hidden_size: int = Field(128, ge=8)
    intermediate_size: int = Field(344, ge=8)
    num_hidden_layers: int = Field(2, ge=1)
    num_attention_heads: int = Field(4, ge=1)
    num_key_value_heads: int | None = Field(None, ge=1)
    tie_word_embeddings: bool = True

    @field_validator("gradient_checkpointing", mode="before")
    @classmethod
    def _boolean_is_full_or_off(cls, value):
        """Configs written before the policies said true/false."""
        return {True: "full", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("liger", mode="before")
    @classmethod
    def _liger_yaml_on_off(cls, value):
        """YAML 1.1 reads an unquoted on/off as true/false."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("liger")
    @classmethod
    def _liger_this_machine_has(cls, value: str) -> str:
        problem = liger_missing() if value == "on" else None
        if problem:
            raise ValueError(f"on patches liger-kernel's GPU kernels and {problem}; use 'auto' or 'off'")
        return value

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> ModelParams:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} must be a multiple of num_attention_heads "
                f"{self.num_attention_heads}"
            )
        return self


class BatchingParams(Params):
    mode: Literal["packed", "length_grouped", "dynamic"] = "packed"
    micro_batch_size: int = Field(32, ge=1, description="samples per micro-batch; packed: rows of max_length")
    gradient_accumulation_steps: int = Field(1, ge=1)
    row_length: int | Literal["auto"] = Field(
        "auto",
        description="packed: tokens per row; the micro-batch keeps micro_batch_size * max_length tokens "
        "(more, shorter rows). auto: the shortest multiple of 64 that holds the longest sample and packs as "
        "tightly as rows of max_length (packing.choose_row_length)",
    )
    pad_to_multiple_of: int | Literal["auto"] = Field(
        "auto",
        description="round padded lengths up to a multiple of this; auto: 8 on CUDA (tensor-core "
        "alignment), 1 on CPU (rounding ~10-token samples up to 8 pads a quarter of the tokens for nothing); "
        "where float8 matmuls may run (runtime.float8 on, or auto on a CUDA GPU of compute capability 8.9 "
        "or more with torchao), rounded up to a multiple of 16, the token counts their GEMMs take",
    )
    oom_backoff: bool = Field(
        False, description="on CUDA out of memory: halve micro-batch, double accumulation"
    )

    @field_validator("pad_to_multiple_of", "row_length")
    @classmethod
    def _positive_or_auto(cls, value: int | str) -> int | str:
        if value != "auto" and value < 1:
            raise ValueError("must be 'auto' or an integer >= 1")
        return value

    def fixed_row_length(self) -> int | None:
        """The packed rows' length where the user set it (None: not packed, or ``row_length: auto``): float8
        ``auto`` stays off for a length its GEMMs cannot take (``runtime.float8.float8_decision``)."""
        return self.row_length if self.mode == "packed" and self.row_length != "auto" else None

    def longest_row(self, max_length: int) -> int:
        """The longest row a micro-batch of this run can have: a packed run's ``row_length`` where set, else
        ``max_length`` (``row_length: auto`` never exceeds it; padded rows are at most that long)."""
        return self.fixed_row_length() or max_length

    def pad_multiple(self, device_type: str, align: int = 1) -> int:
        """``pad_to_multiple_of`` for a run on ``device_type`` ("cuda", "cpu", ...), ``auto`` resolved, and
        rounded up to a multiple of ``align``: the token count the model's matmuls need (float8's 16,
        ``engine.runtime.float8.token_multiple``)."""
        if self.pad_to_multiple_of == "auto":
            return math.lcm(8 if device_type == "cuda" else 1, align)
        return math.lcm(int(self.pad_to_multiple_of), align)


def liger_missing() -> str | None:
    """What liger-kernel (Triton kernels, ``engine/model/liger.py``) lacks on this machine: a CUDA GPU, the
    package (None: neither)."""
    return package_missing("liger_kernel", "liger-kernel")


def package_missing(module: str, package: str) -> str | None:
    """What a GPU kernel package (Triton kernels) lacks on this machine: a CUDA GPU, the package (None:
    neither)."""
    import importlib.util
    import sys

    import torch

    if not torch.cuda.is_available():
        return "this machine has no CUDA GPU"
    if module in sys.modules:  # a stand-in, or None: an import that is known to fail
        installed = sys.modules[module] is not None
    else:
        installed = importlib.util.find_spec(module) is not None
    if not installed:
        return f"{package} is not installed (`pip install {package}`)"
    return None


def bitsandbytes_missing() -> str | None:
    """What a bitsandbytes feature (QLoRA's 4-bit weights, 8-bit AdamW) lacks on this machine, or None: the
    package, on CUDA any version, on CPU 0.50 or later (its CPU backend; the version tested)."""
    import importlib.metadata
    import importlib.util
    import sys

    import torch

    if "bitsandbytes" not in sys.modules and importlib.util.find_spec("bitsandbytes") is None:
        return "the bitsandbytes package is missing"
    if torch.cuda.is_available():
        return None
    from packaging.version import Version

    version = importlib.metadata.version("bitsandbytes")
    if Version(version).release[:2] < (0, 50):
        return f"bitsandbytes {version} has no CPU backend for it and there is no CUDA GPU"
    return None


class OptimizerParams(Params):
    name: Literal["adamw", "adamw_8bit", "paged_adamw_8bit"] = Field(
        "adamw",
        description="adamw: torch (fused on CUDA); adamw_8bit / paged_adamw_8bit: bitsandbytes' "
        "8-bit states (2 bytes per trainable parameter instead of 8; paged: spilled to host memory under "
        "pressure)",
    )
    lr: float = Field(2e-3, gt=0)
    weight_decay: float = Field(0.1, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0)
    grad_clip: float | None = Field(1.0, gt=0)
    warmup_steps: int = Field(20, ge=0)
    warmup_ratio: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="the Trainer's warmup_ratio: the warmup is ceil(warmup_ratio x the run's planned "
        "optimizer steps) (max_steps, or every epoch's), in place of warmup_steps, left at its default",
    )
    decay: Literal["cosine", "linear", "constant"] = "cosine"
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    in_backward: bool = Field(
        False,
        description="each weight's update as soon as its gradient is complete, in the last micro-batch's "
        "backward, the gradient then freed (engine/train/master_weights.py): 4 bytes per trainable weight "
        "less at the peak of a step of one micro-batch (with accumulation the sums so far are held until "
        "each update); needs bf16 weights (train.runtime.param_dtype) or FSDP2's shards, adamw, grad_clip "
        "null",
    )

    @field_validator("in_backward")
    @classmethod
    def _in_backward_needs_every_update_alone(cls, value: bool, info: ValidationInfo) -> bool:
        if not value:
            return value
        if info.data.get("name", "adamw") != "adamw":
            raise ValueError(
                f"in_backward updates each weight with torch's AdamW and name is {info.data.get('name')!r}; "
                "use name adamw, or in_backward false"
            )
        if info.data.get("grad_clip") is not None:
            raise ValueError(
                "in_backward updates each weight before the next gradient exists and grad_clip scales every "
                "gradient by their global norm first; set grad_clip: null, or in_backward false"
            )
        return value

    @model_validator(mode="after")
    def _one_warmup(self):
        default = type(self).model_fields["warmup_steps"].default
        if self.warmup_ratio is not None and self.warmup_steps != default:
            raise ValueError(
                f"warmup_steps {self.warmup_steps} and warmup_ratio {self.warmup_ratio:g} both set the "
                f"warmup; keep one: warmup_ratio with warmup_steps at its default {default}, or "
                "warmup_ratio: null"
            )
        return self

    @field_validator("name")
    @classmethod
    def _bitsandbytes_this_machine_has(cls, value: str) -> str:
        if value == "adamw":
            return value
        import torch  # here: validating the default would import torch wherever the parameters are read

        missing = bitsandbytes_missing()
        if missing:
            raise ValueError(
                f"{value!r} keeps 8-bit optimizer states through bitsandbytes and {missing}; use 'adamw', "
                "or `pip install 'bitsandbytes>=0.50'`"
            )
        if value.startswith("paged_") and not torch.cuda.is_available():
            raise ValueError(
                f"{value!r} pages its states between a CUDA GPU's memory and the host's and this machine has "
                "no CUDA GPU; use 'adamw_8bit' (8-bit states on CPU too) or 'adamw'"
            )
        return value


class LossParams(Params):
    label_smoothing: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="share of each target's probability spread over "
        "the vocabulary (F.cross_entropy's label_smoothing); training only: validation "
        "and test losses stay the plain cross-entropy",
    )
    fused_linear: bool | Literal["auto"] = Field(
        "auto",
        description="the LM head's matmul and the loss fused chunk by chunk (engine/model/linear_loss.py): "
        "no [tokens x vocab] logits; auto: for vocabularies of 65,536 and more",
    )
    fused_linear_kernel: Literal["auto", "fastlm", "liger", "cce"] = Field(
        "auto",
        description="whose kernel runs the fused head + loss (engine/model/liger.py, cce.py): fastlm "
        "(chunked PyTorch, any device), liger (liger-kernel's Triton kernel, CUDA) or cce "
        "(cut-cross-entropy's, CUDA: no logits in memory at all; no label smoothing); auto: liger on a "
        "CUDA run with liger-kernel installed, else fastlm",
    )

    @field_validator("fused_linear_kernel")
    @classmethod
    def _kernel_this_machine_has(cls, value: str) -> str:
        if value == "liger" and (problem := liger_missing()):
            raise ValueError(f"liger runs liger-kernel's GPU kernel and {problem}; use 'auto' or 'fastlm'")
        if value == "cce" and (problem := package_missing("cut_cross_entropy", "cut-cross-entropy")):
            raise ValueError(f"cce runs cut-cross-entropy's GPU kernel and {problem}; use 'auto' or 'fastlm'")
        return value

    @model_validator(mode="after")
    def _cce_computes_no_label_smoothing(self):
        if self.fused_linear_kernel == "cce" and self.label_smoothing:
            raise ValueError(
                "fused_linear_kernel: cce has no label smoothing (cut-cross-entropy); use 'auto', 'fastlm' "
                "or 'liger' with label_smoothing, or label_smoothing: 0"
            )
        return self


class EarlyStoppingParams(Params):
    patience: int | None = Field(
        None,
        ge=1,
        description="evaluations in a row without a validation-loss "
        "improvement before the run stops; null: off",
    )
    min_delta: float = Field(0.0, ge=0, description="what counts as an improvement of the validation loss")
    metric: Literal["val_loss"] = "val_loss"


# DataLoader worker processes per training process: auto picks 2 to 8; each worker is a process of its own
# (a copy of the loading state, prefetch_factor batches in flight), so past this a count is a typo, not a
# setting (100000 would start as many processes). A fixed cap: a conf is valid on every machine.
MAX_LOADER_WORKERS = 64


class DataLoaderParams(Params):
    num_workers: Annotated[int, Field(ge=0)] | Literal["auto"] = "auto"
    pin_memory: bool | Literal["auto"] = "auto"
    prefetch_factor: int = Field(4, ge=1)
    persistent_workers: bool = True

    @field_validator("num_workers")
    @classmethod
    def _workers_capped(cls, workers):
        if isinstance(workers, int) and workers > MAX_LOADER_WORKERS:
            raise ValueError(
                f"at most {MAX_LOADER_WORKERS} DataLoader worker processes per training process (each is a "
                "process of its own; auto picks 2 to 8 from the machine's cores)"
            )
        return workers


class RuntimeParams(Params):
    """Where and how to compute. A device or precision this machine cannot give is refused here, before any
    node has run (not as a traceback from torch once training or the report's evaluation starts)."""

    device: str = "auto"
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"

    @field_validator("device")
    @classmethod
    def _device_this_machine_has(cls, value: str) -> str:
        if value not in ("auto", "cpu", "cuda") and not re.fullmatch(r"cuda:\d+", value):
            raise ValueError("must be 'auto', 'cpu', 'cuda' or 'cuda:N' (e.g. cuda:0)")
        if not value.startswith("cuda"):
            return value
        import torch  # here: validating the defaults would import torch wherever the parameters are read

        if not torch.cuda.is_available():
            raise ValueError("CUDA is not available on this machine (torch sees no GPU); use 'auto' or 'cpu'")
        if value.startswith("cuda:") and int(value[5:]) >= torch.cuda.device_count():
            raise ValueError(f"this machine has {torch.cuda.device_count()} CUDA device(s), numbered from 0")
        return value

    @field_validator("precision")
    @classmethod
    def _precision_this_machine_has(cls, value: str, info: ValidationInfo) -> str:
        if value != "fp16":
            return value
        import torch  # here: validating the defaults would import torch wherever the parameters are read

        if info.data.get("device") == "cpu" or not torch.cuda.is_available():
            raise ValueError("fp16 needs a CUDA device and this run is on CPU; use 'auto', 'bf16' or 'fp32'")
        return value

    tf32: bool = True
    cudnn_benchmark: bool = True
    compile: bool | Literal["auto"] = Field(
        "auto",
        description="torch.compile; auto: where the first micro-batch measures it faster in a run long "
        "enough to repay it (CPU and CUDA; compiled on CUDA under compile_mode reduce-overhead, in several "
        "processes, or where float8 layers may train)",
    )
    compile_scope: Literal["model", "layers"] = Field(
        "model",
        description="what torch.compile compiles (engine/runtime/regions.py): model (one graph, cross-layer "
        "fusion) or layers (each transformer layer in place, one layer's compile time at any depth; "
        "embedding, head and loss stay eager)",
    )
    compile_mode: Literal["default", "reduce-overhead"] = Field(
        "default",
        description="torch.compile's mode: reduce-overhead replays a CUDA graph of each compiled layer (one "
        "launch per layer where each kernel was one) over micro-batches of one shape (the packed row padded "
        "to its capacity); an experiment to A/B against default: slower than eager where measured "
        "(docs/benchmarks.md); needs CUDA, compile, compile_scope layers and batching.mode packed, no "
        "gradient checkpointing, not FSDP2",
    )
    deterministic: bool = False
    num_threads: int | None = Field(None, ge=1, le=4096)
    float8: Literal["off", "on", "auto"] = Field(
        "auto",
        description="float8 matmuls through torchao (engine/runtime/float8.py); auto: on CUDA "
        "compute capability >= 8.9 with torchao and a hidden size >= 2048 (then measured on the first "
        "micro-batch, kept when 1.1x faster), else off (the reason is logged)",
    )

    param_dtype: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="the weights forward and backward read (engine/train/master_weights.py): bf16 "
        "(fp32 master weights in the optimizer; every activation bf16, no per-micro-batch weight or "
        "activation casts; under FSDP2 its MixedPrecisionPolicy) or fp32 (bf16 autocast over fp32 "
        "weights); auto: bf16 for a full fine-tune on a GPU in bf16 from its start (one process, DDP or "
        "FSDP2) and for LoRA's adapters there (one process or DDP: no cast of each adapter in each "
        "micro-batch), else fp32",
    )

    @field_validator("param_dtype")
    @classmethod
    def _bf16_weights_need_bf16(cls, value: str, info: ValidationInfo) -> str:
        precision = info.data.get("precision")
        if value == "bf16" and precision in ("fp32", "fp16"):
            raise ValueError(
                f"bf16 weights compute in bf16 and train.runtime.precision is {precision}; use precision "
                "bf16 (or auto on a GPU with bf16), or param_dtype auto or fp32"
            )
        return value

    def fixed_shapes(self) -> bool:
        """Whether every packed micro-batch keeps one shape (its capacity, ``PackedCollator.fixed_shape``):
        the CUDA graphs of ``compile_mode: reduce-overhead`` replay one shape."""
        return self.compile_mode == "reduce-overhead"

    @field_validator("float8", mode="before")
    @classmethod
    def _yaml_on_off(cls, value):
        """YAML 1.1 reads an unquoted on/off as true/false."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("float8")
    @classmethod
    def _float8_this_machine_has(cls, value: str, info: ValidationInfo) -> str:
        if value != "on":
            return value
        import importlib.util

        import torch  # here: validating the defaults would import torch wherever the parameters are read

        if info.data.get("device") == "cpu" or not torch.cuda.is_available():
            problem = "this run is not on a CUDA device"
        elif tuple(torch.cuda.get_device_capability()) < (8, 9):
            problem = "this GPU's compute capability is below 8.9 (no float8 tensor cores)"
        elif importlib.util.find_spec("torchao") is None:
            problem = "torchao is not installed (`pip install torchao`)"
        else:
            return value
        raise ValueError(
            f"float8 training needs a CUDA GPU of compute capability >= 8.9 and torchao, "
            f"and {problem}; use 'auto' or 'off'"
        )


class ProfileParams(Params):
    enabled: bool = False
    start_step: int = Field(5, ge=1, description="first optimizer step recorded (after warm-up)")
    steps: int = Field(3, ge=1)
    trace_dir: str = Field("data/07_model_output/profile", min_length=1)


def train_processes(nproc_per_node: int, environ: Mapping[str, str] | None = None) -> int:
    """The processes a training step spans: torchrun's world size where the run is started under it (its
    ``--nproc-per-node`` decides and ``nproc_per_node`` stays 1: ``distributed.parallel.launch_mode``), else
    ``train.distributed.nproc_per_node``. Read as ``distributed.ranks.rank_from_env`` reads it (this layer
    sits below that one)."""
    environ = os.environ if environ is None else environ
    if "RANK" in environ and "WORLD_SIZE" in environ and int(environ["WORLD_SIZE"]) > 1:
        return int(environ["WORLD_SIZE"])
    return nproc_per_node


class DistributedParams(Params):
    nproc_per_node: int = Field(
        1, ge=1, description="worker processes the train node launches; 1 = this process"
    )
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    strategy: Literal["ddp", "fsdp"] = "ddp"
    find_unused_parameters: bool = False
    bucket_cap_mb: int = Field(25, ge=1)
    timeout_s: float = Field(600, gt=0, description="a collective waiting longer than this ends the run")
    monitor_interval_s: float = Field(0.5, gt=0, description="how often the launcher checks its workers")
    start_method: Literal["auto", "spawn", "forkserver"] = Field(
        "auto",
        description="how the launcher starts its workers: forkserver forks them from one server process "
        "that imported the engine once (a process's later launches skip the imports), spawn starts a fresh "
        "interpreter for each; auto: forkserver for a job on the CPU, spawn for one on a GPU "
        "(engine/launch/workers.py)",
    )

    @property
    def processes(self) -> int:
        """The processes a training step spans: torchrun's world size under it (where ``nproc_per_node``
        stays 1), else ``nproc_per_node`` (``train_processes``)."""
        return train_processes(self.nproc_per_node)


class TrainParams(Params):
    model: ModelParams = ModelParams()
    batching: BatchingParams = BatchingParams()
    optimizer: OptimizerParams = OptimizerParams()
    loss: LossParams = LossParams()
    dataloader: DataLoaderParams = DataLoaderParams()
    runtime: RuntimeParams = RuntimeParams()
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, ge=1, description="optimizer steps; overrides epochs")
    max_minutes: float | None = Field(
        None,
        gt=0,
        description="time budget of the training loop: it stops at "
        "the first step boundary after it, with a checkpoint (engine/train/time_limit.py)",
    )
    # torch's generators take seeds below 2**64 (a larger one would stop the set-up with torch's overflow)
    seed: int = Field(0, ge=0, le=2**64 - 1)
    data_seed: int | None = Field(
        None,
        ge=0,
        le=2**64 - 1,
        description="the data order's seed (the Hugging Face Trainer's data_seed): null = train.seed's "
        "order; the weights' init, dropout and NEFTune draws stay on train.seed",
    )
    fold: int | None = Field(
        None,
        ge=0,
        description="k-fold runs on data split with split.folds: "
        "validate on fold i of train + validation, train on the rest "
        "(engine/data/folds.py)",
    )
    log_every: int = Field(10, ge=1)
    eval_every: int | None = Field(100, ge=1)
    eval_max_batches: int | None = Field(None, ge=1)
    early_stopping: EarlyStoppingParams = EarlyStoppingParams()
    save_every: int | None = Field(200, ge=1)
    keep_last: int = Field(2, ge=1)
    resume: str = Field(
        "auto", min_length=1, description="auto | never | a checkpoint folder (engine/checkpoint/resume.py)"
    )
    checkpoint_dir: str = Field(
        "data/06_models/checkpoints",
        min_length=1,
        description="the engine writes here; the train node appends /<run_name>",
    )
    quiet: bool = False
    profile: ProfileParams = ProfileParams()
    distributed: DistributedParams = DistributedParams()

    @property
    def order_seed(self) -> int:
        """The seed every epoch's data order is drawn from (``samplers.epoch_rng``): ``data_seed`` where set,
        else ``seed``."""
        return self.seed if self.data_seed is None else self.data_seed

    @field_validator("runtime")
    @classmethod
    def _liger_needs_a_cuda_run(cls, value: RuntimeParams, info: ValidationInfo):
        model, loss = info.data.get("model"), info.data.get("loss")
        if loss is not None and loss.fused_linear_kernel == "cce" and value.precision == "fp32":
            raise ValueError(
                "train.loss.fused_linear_kernel: cce computes in bf16 or fp16 only (cut-cross-entropy has "
                "no fp32 backward) and train.runtime.precision is fp32; use precision bf16 or auto, or the "
                "kernel auto"
            )
        if value.device != "cpu":
            return value
        if model is not None and model.liger == "on":
            raise ValueError(
                "train.model.liger: on patches GPU kernels and this run is on CPU; use auto or off"
            )
        if loss is not None and loss.fused_linear_kernel in ("liger", "cce"):
            raise ValueError(
                f"train.loss.fused_linear_kernel: {loss.fused_linear_kernel} runs a GPU kernel and this run "
                "is on CPU; use auto or fastlm"
            )
        return value

    @field_validator("runtime")
    @classmethod
    def _cuda_graphs_need_one_shape(cls, value: RuntimeParams, info: ValidationInfo):
        if value.compile_mode != "reduce-overhead":
            return value
        batching, model = info.data.get("batching"), info.data.get("model")
        problem = fix = None
        if value.device == "cpu":
            problem, fix = "this run is on CPU", "compile_mode: default"
        elif value.compile is False:
            problem, fix = (
                "train.runtime.compile is false",
                "compile: true (or auto), or compile_mode: default",
            )
        elif value.compile_scope != "layers":
            problem = (
                "train.runtime.compile_scope is model (the whole model's graph holds the head, whose target "
                "count changes every micro-batch: a graph recorded again each time)"
            )
            fix = "compile_scope: layers, or compile_mode: default"
        elif batching is not None and batching.mode != "packed":
            problem = f"train.batching.mode is {batching.mode} (its micro-batches change shape)"
            fix = "batching.mode: packed, or compile_mode: default"
        elif model is not None and model.gradient_checkpointing in ("selective", "full"):
            problem = (
                f"train.model.gradient_checkpointing is {model.gradient_checkpointing} (a checkpointed layer "
                "runs its forward again inside the backward, which CUDA graph trees fail to replay: "
                "pytorch/pytorch#154306)"
            )
            fix = "gradient_checkpointing: off, or compile_mode: default"
        if problem is None:
            return value
        raise ValueError(
            "train.runtime.compile_mode: reduce-overhead replays CUDA graphs of the compiled layers on "
            f"micro-batches of one shape and {problem}; set {fix}"
        )

    @field_validator("distributed")
    @classmethod
    def _cuda_graphs_without_sharding(cls, value: DistributedParams, info: ValidationInfo):
        runtime = info.data.get("runtime")
        sharded = value.strategy == "fsdp" and value.processes > 1
        if sharded and runtime is not None and runtime.compile_mode == "reduce-overhead":
            raise ValueError(
                "train.runtime.compile_mode: reduce-overhead is not wired for strategy fsdp (FSDP2 gathers "
                "each layer's weights in collectives around it, which a layer's CUDA graph would capture); "
                "use strategy ddp, or compile_mode default"
            )
        return value

    @field_validator("distributed")
    @classmethod
    def _bitsandbytes_optimizer_without_shards(cls, value: DistributedParams, info: ValidationInfo):
        optimizer = info.data.get("optimizer")
        if optimizer is None or optimizer.name == "adamw" or value.strategy != "fsdp" or value.processes < 2:
            return value
        # ConfigError (not ValueError): the check runs on train.distributed, and the optimizer is at fault too
        raise ConfigError(
            f"train.optimizer.name is {optimizer.name} and train.distributed.strategy is fsdp over "
            f"{value.processes} processes: bitsandbytes' 8-bit AdamW updates plain tensors and FSDP2's "
            "parameters are sharded DTensors, so its first step would fail in every worker.",
            fix="set train.optimizer.name: adamw (FSDP2 already shards its AdamW state over the processes), "
            "or train.distributed.strategy: ddp to keep the 8-bit states.",
        )

    @field_validator("distributed")
    @classmethod
    def _in_backward_with_bf16_weights_or_shards(cls, value: DistributedParams, info: ValidationInfo):
        runtime, optimizer = info.data.get("runtime"), info.data.get("optimizer")
        if optimizer is None or not optimizer.in_backward:
            return value
        if value.processes > 1 and value.strategy == "fsdp":
            return value  # FSDP2's fp32 shards are the masters, whatever dtype it gathers them in
        if runtime is not None and runtime.param_dtype == "fp32":
            # ConfigError (not ValueError): the check runs on train.distributed, whose keys are not at fault
            raise ConfigError(
                "train.optimizer.in_backward = True is invalid with train.runtime.param_dtype = 'fp32': "
                "in_backward updates the fp32 masters of bf16 weights.",
                fix="set train.runtime.param_dtype: auto (a GPU) or bf16 (e.g. --params "
                "train.runtime.param_dtype=bf16), or train.optimizer.in_backward: false.",
            )
        return value

    @field_validator("early_stopping")
    @classmethod
    def _early_stopping_needs_evaluations(cls, value: EarlyStoppingParams, info: ValidationInfo):
        if value.patience is not None and info.data.get("eval_every") is None:
            # ConfigError (not ValueError): the fix names train.eval_every, not a key of early_stopping
            raise ConfigError(
                "train.early_stopping.patience is set and train.eval_every is null: early stopping needs "
                "evaluations every N steps to watch the validation loss.",
                fix="set train.eval_every (e.g. --params train.eval_every=50), or "
                "train.early_stopping.patience: null.",
            )
        return value


def parse_train_params(raw) -> TrainParams:
    return parse_params(TrainParams, raw, prefix="train", source=SOURCE)
