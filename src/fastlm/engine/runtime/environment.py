"""Process-wide runtime settings, applied once at the start of training, in one place.

``setup_runtime(params.runtime, seed=params.seed)`` (the validated ``train.runtime`` parameters,
``fastlm.engine.config.RuntimeParams``; or a plain :class:`RuntimeConfig` outside a Kedro run) picks the
device, sets the CUDA speed flags (TF32, cuDNN autotuning, fused attention kernels), resolves the training
precision, sizes the CPU thread pool, prepares the environment for DataLoader workers and, on request, trades
speed for bitwise reproducibility. It returns a frozen :class:`Runtime` that records what was applied
(``describe()`` gives flat MLflow parameters) and hands out the autocast context and the gradient scaler that
match the resolved precision.

Everything runs on a CPU-only machine: each CUDA branch is guarded by ``torch.cuda.is_available()``.

Precision, resolved from ``RuntimeConfig.precision``:

============  ==========================================  ====================  ===========
requested     CUDA                                        CPU                   grad scaler
============  ==========================================  ====================  ===========
``auto``      bf16 if the GPU does bf16 natively, else    fp32 here; then the   fp16 only
              fp16                                        loop measures bf16
                                                          (``runtime_probe``)
``bf16``      bf16 (error if the GPU lacks native bf16)   bf16 autocast         no
``fp16``      fp16                                        error (needs CUDA)    yes
``fp32``      fp32 (TF32 matmuls if ``tf32``)             fp32                  no
============  ==========================================  ====================  ===========

Threads: ``torch.set_num_threads`` sizes the intra-op pool (OpenMP/MKL) of this process. Left unset, it is
``OMP_NUM_THREADS`` where the user set it to a count (to share the machine between runs), else the number of
usable cores: the CPU affinity mask, capped by a cgroup CPU quota when one is set (what a container really
grants; ``os.cpu_count()`` over-counts there). ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` are only read when
those libraries start, so the runtime call is the knob that works after ``import torch``.
DataLoader workers set themselves to one thread each (PyTorch does this in every worker).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
from collections.abc import Collection
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

import torch

from fastlm.engine.runtime.regions import COMPILE_MODES, COMPILE_SCOPES, compile_in_scope

if TYPE_CHECKING:
    from fastlm.engine.config import RuntimeParams

log = logging.getLogger(__name__)

DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}

# cuBLAS needs a fixed workspace to be deterministic; it must be set before the first cuBLAS call.
CUBLAS_DETERMINISTIC_WORKSPACE = ":4096:8"


@dataclass
class RuntimeConfig:
    """What the user asks for; ``setup_runtime`` turns it into a :class:`Runtime`."""

    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N"
    precision: str = "auto"  # "auto" | "bf16" | "fp16" | "fp32"
    tf32: bool = True  # TF32 tensor cores for fp32 matmuls and convolutions (Ampere and newer)
    cudnn_benchmark: bool = True  # let cuDNN autotune kernels for the shapes it sees
    deterministic: bool = False  # bitwise reproducible runs, slower
    # torch.compile the model (applied by the loop through Runtime.compile_model); auto: measured by the loop
    compile: bool | str = "auto"
    compile_scope: str = "model"  # "model" | "layers" (engine/runtime/regions.py)
    compile_mode: str = "default"  # "default" | "reduce-overhead": CUDA graphs of the layers (regions.py)
    num_threads: int | None = None  # CPU intra-op threads; None = usable cores
    float8: str = "auto"  # float8 matmuls (engine/runtime/float8.py), applied when the optimizer is made
    # bf16 weights with fp32 masters (engine/train/master_weights.py), applied when the optimizer is made
    param_dtype: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.device not in DEVICES and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be one of {DEVICES} or 'cuda:N', got {self.device!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.compile not in (True, False, "auto"):
            raise ValueError(f"compile must be true, false or 'auto', got {self.compile!r}")
        if self.compile_scope not in COMPILE_SCOPES:
            raise ValueError(f"compile_scope must be one of {COMPILE_SCOPES}, got {self.compile_scope!r}")
        if self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode must be one of {COMPILE_MODES}, got {self.compile_mode!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be at least 1, got {self.num_threads}")


@dataclass(frozen=True)
class Runtime:
    """A record of what ``setup_runtime`` applied, and the precision helpers that go with it."""

    device: torch.device
    device_name: str
    precision: str  # resolved: "bf16" | "fp16" | "fp32"
    grad_scaler: bool  # fp16 needs loss scaling; bf16 and fp32 do not
    tf32: bool  # applied (only on CUDA)
    cudnn_benchmark: bool
    sdpa_flash: bool | None  # None off CUDA
    sdpa_mem_efficient: bool | None
    deterministic: bool
    compile: bool
    num_threads: int
    seed: int
    tokenizers_parallelism: str
    torch_version: str
    cuda_version: str | None
    precision_choice: str | None = None  # why this precision (``runtime_probe`` measures ``auto`` on CPU)
    compile_choice: str | None = None  # why compiled or not (``runtime_probe`` measures ``auto`` on CPU)
    float8: bool = False  # float8 matmuls in the Linear layers (``train.runtime.float8``)
    float8_choice: str | None = (
        None  # why (``probe.probe_float8`` measures ``auto`` where the rule allows it)
    )
    compile_scope: str = "model"  # what compile_model compiles: the model or each layer (regions.py)
    compile_mode: str = "default"  # torch.compile's mode; reduce-overhead: CUDA graphs of the layers

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return AUTOCAST_DTYPES[self.precision]

    def autocast_context(self) -> contextlib.AbstractContextManager:
        """``torch.autocast`` for bf16/fp16, a no-op context for fp32. Wrap the forward and the loss."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def make_grad_scaler(self) -> torch.amp.GradScaler:
        """A GradScaler, enabled only for fp16 (disabled, its calls pass straight through)."""
        return torch.amp.GradScaler(self.device.type, enabled=self.grad_scaler)

    def compiling_as(self, settings) -> Runtime:
        """This runtime compiling in ``settings``' scope and mode (``train.runtime``: the run's parameters
        decide what ``compile_model`` compiles, whatever runtime a caller set up)."""
        return replace(self, compile_scope=settings.compile_scope, compile_mode=settings.compile_mode)

    def compile_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` compiled in ``compile_scope`` (``regions.compile_in_scope``: ``torch.compile(model)``, or
        each layer in place) when ``compile`` was asked for, the model itself otherwise."""
        return compile_in_scope(model, self.compile_scope, self.compile_mode) if self.compile else model

    def describe(self) -> dict[str, str | int | float | bool | None]:
        """Everything applied, as a flat dict of plain values (MLflow parameters, a log line)."""
        record = asdict(self)
        record["device"] = str(self.device)
        dtype = self.autocast_dtype
        record["autocast_dtype"] = str(dtype).removeprefix("torch.") if dtype is not None else None
        record["float32_matmul_precision"] = torch.get_float32_matmul_precision()
        return record


def usable_cpu_count(cpus: Collection[int] | None = None) -> int:
    """Cores this process may run on: the affinity mask (``cpus``: these CPUs instead), capped by a cgroup v2
    CPU quota if any (:func:`cpu_quota`)."""
    cores, quota = len(cpu_affinity() if cpus is None else cpus), cpu_quota()
    return max(1, cores if quota is None else min(cores, quota))


def cpu_affinity() -> set[int]:
    """The CPUs this process may run on (its affinity mask; every CPU where the system has none)."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return set(range(os.cpu_count() or 1))


def cpu_quota() -> int | None:
    """The cores a cgroup v2 CPU quota grants (rounded up), None without one."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as cpu_max:
            quota, period = cpu_max.read().split()[:2]
        if quota != "max":
            return max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return None


def threads_set_in_environment() -> int | None:
    """``OMP_NUM_THREADS`` as a positive count (of a nested list such as ``4,2``, the first level's), or None
    where it is unset or no count."""
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else None


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy (if installed) and torch on every device."""
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass
    torch.manual_seed(seed)  # also seeds every CUDA device


def resolve_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {requested!r} was asked for, but CUDA is not available here")
    return device


def gpu_has_native_bf16() -> bool:
    """True on GPUs with bf16 tensor cores (Ampere and newer); emulated bf16 does not count, it is slow."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def resolve_compile(requested: bool | str, device: torch.device) -> bool:
    """``auto``: on CUDA compiled, on CPU eager, until the training loop measures it (``runtime_probe``:
    compiled where the run is long enough to repay the compile time and its first micro-batch runs measurably
    faster compiled; on CUDA a run of several processes, of CUDA graphs or of float8 layers stays
    compiled)."""
    return device.type == "cuda" if requested == "auto" else bool(requested)


def resolve_precision(requested: str, device: torch.device) -> str:
    if device.type == "cuda":
        if requested == "auto":
            return "bf16" if gpu_has_native_bf16() else "fp16"
        if requested == "bf16" and not gpu_has_native_bf16():
            raise RuntimeError("precision 'bf16' was asked for, but this GPU has no native bf16; use 'fp16'")
        return requested
    if requested == "fp16":
        raise RuntimeError("precision 'fp16' needs CUDA; on CPU use 'bf16' or 'fp32'")
    return "bf16" if requested == "bf16" else "fp32"


def setup_runtime(
    config: RuntimeConfig | RuntimeParams,
    *,
    seed: int | None = None,
    measured_later: bool = False,
    said: bool = False,
) -> Runtime:
    """Apply the whole runtime configuration to this process (call it once, before building the model).

    ``measured_later``: the caller trains, and ``runtime_probe`` settles CPU ``auto`` precision and compile on
    the first micro-batch; the runtime line says so instead of stating the provisional values as settled.
    ``said``: an earlier node of the same run logged this runtime's line (the report's generations after its
    evaluation): logged at DEBUG only. ``config`` is already validated (``RuntimeParams`` by the parameter
    hook, ``RuntimeConfig`` on creation): it is read as it is. ``seed`` (``train.seed``) overrides
    ``config.seed``; ``RuntimeParams`` has none (default 0).
    """
    seed = getattr(config, "seed", 0) if seed is None else seed
    device = resolve_device(config.device)
    precision = resolve_precision(config.precision, device)
    on_cuda = device.type == "cuda"

    # DataLoader workers are forked: a tokenizers thread pool that already ran in the parent would make
    # every worker warn (or hang). An explicit user setting is respected.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    num_threads = config.num_threads or threads_set_in_environment() or usable_cpu_count()
    torch.set_num_threads(num_threads)

    if config.deterministic:
        log.warning(
            "deterministic=true: bitwise reproducible runs at the cost of speed "
            "(deterministic kernels only, cuDNN autotuning off, CUBLAS_WORKSPACE_CONFIG=%s)",
            CUBLAS_DETERMINISTIC_WORKSPACE,
        )
        # cuBLAS reads this when its first handle is made: setup_runtime must run before any CUDA work.
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_DETERMINISTIC_WORKSPACE
    if config.deterministic or torch.are_deterministic_algorithms_enabled():  # the first call takes seconds
        torch.use_deterministic_algorithms(config.deterministic, warn_only=False)
    cudnn_benchmark = config.cudnn_benchmark and not config.deterministic
    torch.backends.cudnn.benchmark = cudnn_benchmark
    torch.backends.cudnn.deterministic = config.deterministic

    tf32 = config.tf32 and on_cuda
    sdpa_flash = sdpa_mem_efficient = None
    if on_cuda:
        if device.index is not None:
            torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
        # Fused attention kernels for F.scaled_dot_product_attention; the math kernel stays as fallback.
        torch.backends.cuda.enable_flash_sdp(True)
        torch.backends.cuda.enable_mem_efficient_sdp(True)
        sdpa_flash = torch.backends.cuda.flash_sdp_enabled()
        sdpa_mem_efficient = torch.backends.cuda.mem_efficient_sdp_enabled()

    seed_everything(seed)

    runtime = Runtime(
        device=device,
        device_name=torch.cuda.get_device_name(device) if on_cuda else "cpu",
        precision=precision,
        grad_scaler=precision == "fp16",
        tf32=tf32,
        cudnn_benchmark=cudnn_benchmark,
        sdpa_flash=sdpa_flash,
        sdpa_mem_efficient=sdpa_mem_efficient,
        deterministic=config.deterministic,
        compile=resolve_compile(config.compile, device),
        compile_scope=config.compile_scope,
        compile_mode=config.compile_mode,
        num_threads=num_threads,
        seed=seed,
        tokenizers_parallelism=os.environ["TOKENIZERS_PARALLELISM"],
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
    )
    if config.compile_mode == "reduce-overhead" and not on_cuda:
        log.warning(
            "compile_mode reduce-overhead: this run is on %s, not CUDA; the compiled layers run without "
            "CUDA graphs (the micro-batches keep one shape)",
            device.type,
        )
    described = runtime.describe()
    # the training loop's runtime_probe settles these: not stated here
    if measured_later and device.type == "cpu" and config.precision == "auto":
        described["precision"] = f"{precision} (auto: measured on the first micro-batch)"
    if measured_later and config.compile == "auto":
        described["compile"] = f"{runtime.compile} (auto: measured on the first micro-batch)"
    log.log(
        logging.DEBUG if said else logging.INFO,
        "runtime: %s",
        ", ".join(f"{key}={value}" for key, value in described.items()),
    )
    return runtime
