"""Data-parallel training on PyTorch's own engine: process groups, DDP / FSDP2 wrapping, the few collectives.

Never ``nn.DataParallel`` (one process, one Python thread driving every GPU, the replicas re-broadcast every
step, GPU 0 holding the outputs): every rank here is its own process with its own copy of the loop.

What the loop needs from the other ranks is behind :class:`Collectives` (one process: :class:`SingleProcess`,
whose calls cost nothing, so the one-process path is unchanged):

``sum_host(values)``   one small all-reduce of host numbers per optimizer step: the step's target tokens (the
                       loss divisor must be the GLOBAL count, see ``loss``), real/computed tokens and samples
                       for the metrics, and the stop flag (SIGTERM on any rank stops every rank at the same
                       step). It runs on a gloo group over host memory, so it never waits for a GPU.
``sum_device_(t)``     an in-place all-reduce of a device tensor: the loss sum at a logging step, evaluation
                       sums.
``gather_host(value)`` every rank's small picklable ``value``, in rank order, gathered over the gloo group:
                       once at the start of a run, the ranks' tokenized data compared (``launch.job``).

Gradient reduction is DDP's (bucketed all-reduce overlapped with the backward) or FSDP2's (reduce-scatter),
skipped on all but the last micro-batch of an accumulation (:func:`gradient_sync`). DDP averages gradients
over ranks, so the loss is scaled by the world size to keep "sum of per-token losses / global target tokens".

How a run becomes distributed (:func:`launch_mode`): ``torchrun`` (or any elastic agent) sets ``RANK`` /
``WORLD_SIZE`` / ``LOCAL_RANK`` / ``MASTER_ADDR`` before the process starts; otherwise the train node may
spawn ``train.distributed.nproc_per_node`` workers itself (``engine/launch/workers.py``).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import re
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from fastlm.engine.distributed.ranks import RankInfo, rank_from_env
from fastlm.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = [
    "Collectives",
    "ProcessGroup",
    "RankInfo",
    "SingleProcess",
    "connect",
    "full_state_dicts",
    "gradient_sync",
    "is_sharded",
    "launch_mode",
    "load_full_state_dicts",
    "lost_peer",
    "optimizer_state_by_index",
    "optimizer_state_by_name",
    "rank_device",
    "rank_from_env",
    "resolve_backend",
    "wrap_model",
]


def launch_mode(nproc_per_node: int, environ: dict | None = None) -> str:
    """``"torchrun"`` (started under an elastic agent), ``"spawn"`` (we launch workers) or ``"single"``."""
    info = rank_from_env(environ)
    if info is not None and info.world_size > 1:
        if nproc_per_node > 1:
            log.info(
                "Started under torchrun with %d processes: train.distributed.nproc_per_node=%d is not used "
                "(torchrun's --nproc-per-node decides).",
                info.world_size,
                nproc_per_node,
            )
        return "torchrun"
    return "spawn" if nproc_per_node > 1 else "single"


# A collective whose peer process is gone, in gloo's words ("Connection closed by peer", "Connection reset by
# peer", "Broken pipe") and NCCL's ("remote process exited"), with the word before them ("Connection").
_LOST_PEER = re.compile(
    r"(?:\w+ )?(?:(?:closed|reset) by peer|Broken pipe|remote process exited)", re.IGNORECASE
)


def lost_peer(error: BaseException) -> str | None:
    """The words of ``error``'s own message that say a collective lost its peer process (one killed, by the
    out-of-memory killer or kill -9, or crashed), e.g. ``"Connection reset by peer"``; None when it says
    nothing of the kind. The backends raise a RuntimeError (``DistBackendError``) whose text is all that tells
    this failure, the consequence of another rank's death, from a failure of this rank's own; an OSError of
    this process's own (a ``BrokenPipeError`` writing to a closed pipe) is not one."""
    if not isinstance(error, RuntimeError):
        return None
    match = _LOST_PEER.search(str(error))
    return match[0] if match else None


def resolve_backend(requested: str, device: torch.device) -> str:
    """``train.distributed.backend``: ``auto`` is NCCL on CUDA, gloo elsewhere; NCCL asked for a run on
    another device is one line (torch's own error names neither the parameter nor the fix)."""
    if requested == "nccl" and device.type != "cuda":
        raise ConfigError(
            f"train.distributed.backend is nccl, which runs on CUDA GPUs only, and this run's device is "
            f"{device.type}.",
            fix="set train.distributed.backend: auto (gloo on a CPU) or gloo.",
        )
    if requested != "auto":
        return requested
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(requested: str, info: RankInfo, *, local_world: int = 1, backend: str = "auto") -> str:
    """One GPU per local rank: ``auto``/``cuda`` become ``cuda:<local_rank>`` where CUDA is present.

    ``local_world``: the processes of this machine (``LOCAL_WORLD_SIZE``). More of them than GPUs, or a
    fixed ``cuda:N`` for several, puts two ranks on one GPU, which NCCL refuses at its first collective
    (``Duplicate GPU detected``) in words naming no parameter: one line here instead. ``backend: gloo``
    may share a GPU."""
    if (not requested.startswith("cuda") and requested != "auto") or not torch.cuda.is_available():
        return requested
    shared = backend != "gloo" and local_world > 1
    count = max(torch.cuda.device_count(), 1)
    if requested in ("auto", "cuda"):
        if shared and local_world > count:
            raise ConfigError(
                f"this run starts {local_world} processes on this machine, which has {count} CUDA "
                f"device(s): NCCL runs one process a GPU.",
                fix=f"set train.distributed.nproc_per_node (or torchrun's --nproc-per-node) to at most "
                f"{count}, or make more GPUs visible (CUDA_VISIBLE_DEVICES).",
            )
        return f"cuda:{info.local_rank % count}"
    if shared:
        raise ConfigError(
            f"train.runtime.device is {requested} and this machine runs {local_world} processes of the run: "
            "every one would use that GPU, and NCCL runs one process a GPU.",
            fix="set train.runtime.device: auto (each process its own GPU); choose the GPUs with "
            "CUDA_VISIBLE_DEVICES.",
        )
    return requested


class Collectives:
    """What the training loop asks of the other ranks (see the module docstring)."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum_host(self, values: Sequence[float]) -> list[float]:
        return list(values)

    def sum_device_(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def gather_host(self, value: object) -> list:
        return [value]

    def barrier(self) -> None:
        return None

    def close(self) -> None:
        return None


class SingleProcess(Collectives):
    """One process: every collective is the identity."""


class ProcessGroup(Collectives):
    """A torch.distributed process group (NCCL or gloo) plus a gloo group for host-side sums."""

    def __init__(self, info: RankInfo, backend: str, device: torch.device, timeout_s: float) -> None:
        self.rank, self.world_size, self.device = info.rank, info.world_size, device
        timeout = datetime.timedelta(seconds=timeout_s)
        self._owns_group = not dist.is_initialized()
        if self._owns_group:
            kwargs = {"device_id": device} if device.type == "cuda" else {}
            dist.init_process_group(
                backend, rank=info.rank, world_size=info.world_size, timeout=timeout, **kwargs
            )
        self.backend = dist.get_backend()
        self._host_group = dist.new_group(backend="gloo", timeout=timeout) if self.backend != "gloo" else None
        log.info(
            "Process group: rank %d of %d, backend %s, device %s",
            self.rank,
            self.world_size,
            self.backend,
            device,
        )

    def sum_host(self, values: Sequence[float]) -> list[float]:
        buffer = torch.tensor(list(values), dtype=torch.float64)
        dist.all_reduce(buffer, group=self._host_group)
        return buffer.tolist()  # a CPU tensor: no device sync

    def sum_device_(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor)
        return tensor

    def gather_host(self, value: object) -> list:
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, value, group=self._host_group)  # gloo: pickled into host memory
        return gathered

    def barrier(self) -> None:
        dist.barrier(group=self._host_group)

    def close(self) -> None:
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()


def connect(
    info: RankInfo | None, backend: str, device: torch.device, timeout_s: float = 600.0
) -> Collectives:
    """The collectives of this process: a process group when ``info`` says there are several ranks."""
    if info is None or info.world_size == 1:
        return SingleProcess()
    return ProcessGroup(info, resolve_backend(backend, device), device, timeout_s)


def wrap_model(
    model: torch.nn.Module,
    comm: Collectives,
    *,
    strategy: str,
    device: torch.device,
    find_unused_parameters: bool = False,
    bucket_cap_mb: int = 25,
    param_dtype: torch.dtype | None = None,
) -> torch.nn.Module:
    """DDP (replicated weights, all-reduced gradients) or FSDP2 (sharded weights, gradients and optimizer
    state).

    One process: the model itself. FSDP2 shards every decoder layer, then the root (embeddings, head): each
    rank then holds 1/world of the parameters and of the AdamW state, and the optimizer must be built on the
    wrapped model (its parameters become DTensors). The root keeps its parameters whole from its forward to
    its post-backward (``reshard_after_forward=False``, what torch does for a root by default, said
    explicitly): the fused LM head + loss (``linear_loss``) reads the head's weight after the forward.
    ``param_dtype`` (bf16; ``train.runtime.param_dtype``, engine/train/master_weights.py): FSDP2's
    ``MixedPrecisionPolicy``, the weights gathered in bf16 for forward and backward, the fp32 shards the
    optimizer's masters, the gradients reduce-scattered in fp32.
    """
    if comm.world_size == 1:
        return model
    if strategy == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = {}
        if param_dtype is not None:
            policy = {"mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)}
        for layer in _decoder_layers(model):
            fully_shard(layer, **policy)
        return fully_shard(model, reshard_after_forward=False, **policy)
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [device.index] if device.type == "cuda" and device.index is not None else None
    return DistributedDataParallel(
        model,
        device_ids=device_ids,
        find_unused_parameters=find_unused_parameters,
        bucket_cap_mb=bucket_cap_mb,
        gradient_as_bucket_view=True,
    )


def gathered_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The dtype an FSDP2 model gathers its weights in for forward and backward (its
    ``MixedPrecisionPolicy``'s ``param_dtype``; read from FSDP2's state, for the record), None where it keeps
    theirs or is not FSDP2."""
    state = getattr(model, "_get_fsdp_state", None)
    policy = getattr(state(), "_mp_policy", None) if state is not None else None
    return getattr(policy, "param_dtype", None)


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks (HF decoder models keep them in a ModuleList named
    ``layers``/``h``)."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "h", "blocks"):
            return list(module)
    return []


def gradient_sync(model: torch.nn.Module) -> Callable[[bool], contextlib.AbstractContextManager]:
    """``sync(last)``: the context for one micro-batch's forward+backward; reduces gradients only when
    ``last``.

    DDP: ``no_sync()`` on the non-final micro-batches (gradients accumulate locally, one all-reduce per step).
    FSDP2: ``set_requires_gradient_sync(last)``. One process: nothing.
    """
    if hasattr(model, "no_sync"):
        return lambda last: contextlib.nullcontext() if last else model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):

        def fsdp_sync(last: bool) -> contextlib.AbstractContextManager:
            model.set_requires_gradient_sync(last)
            return contextlib.nullcontext()

        return fsdp_sync
    return lambda last: contextlib.nullcontext()


def is_sharded(model: torch.nn.Module) -> bool:
    """True for an FSDP2 (fully_shard) model: its parameters are DTensors."""
    return any(hasattr(param, "full_tensor") for param in model.parameters())


def full_state_dicts(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, *, trainable_only: bool = False
) -> tuple[dict, dict | None]:
    """Whole (unsharded) model and optimizer state dicts on the CPU of rank 0; every rank must call it.
    ``trainable_only``: the trained weights alone (LoRA's adapters; the frozen base is not gathered).

    The weights are a one-process run's (the same names and whole tensors); the optimizer state holds every
    parameter's whole AdamW moments, keyed by parameter name where one process's ``optimizer.state_dict()``
    keys them by position. A checkpoint of any world size and strategy resumes in any other with the same
    effective batch (``checkpoint.resume``): one process or DDP reads this state through
    :func:`optimizer_state_by_index`, FSDP2 one of one process through :func:`optimizer_state_by_name`.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only)
    if optimizer is None:
        model_state, optimizer_state = get_model_state_dict(model, options=options), None
    else:
        model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
    if trainable_only:  # a frozen head tied to the embedding is gathered under its own name all the same
        trained = {
            name for name, param in model.named_parameters(remove_duplicate=False) if param.requires_grad
        }
        model_state = {name: value for name, value in model_state.items() if name in trained}
    return model_state, optimizer_state


def load_full_state_dicts(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    model_state: dict,
    optimizer_state: dict | None,
    *,
    trainable_only: bool = False,
) -> None:
    """Load a checkpoint's whole model/optimizer state dicts into a sharded model (every rank calls it);
    without an optimizer, the weights alone (early stopping's best step). ``trainable_only``: the state holds
    the trained weights alone (``full_state_dicts``), the frozen ones stay as they are."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_state_dict

    model_keys = set(get_plain_keys(model))
    for name in model_keys - model_state.keys() if not trainable_only else ():
        model_state[name] = model_state[_tied_source(model, name)]  # a tied head saved once (save_model)
    options = StateDictOptions(full_state_dict=True, strict=not trainable_only)
    if optimizer_state is not None:  # one process's (or DDP's) checkpoint: its moments keyed by position
        optimizer_state = optimizer_state_by_name(model, optimizer, optimizer_state)
    if optimizer is None:
        set_model_state_dict(model, model_state, options=options)
        return
    set_state_dict(
        model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state, options=options
    )


def optimizer_state_by_name(model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict) -> dict:
    """``saved`` (an ``optimizer.state_dict()``: parameters by their position in ``optimizer``'s groups)
    keyed by the parameters' names, as :func:`full_state_dicts` writes it; one keyed by name as it is."""
    if not _by_position(saved):
        return saved
    names = _optimizer_names(model, optimizer)
    try:
        return {
            "state": {names[index]: value for index, value in saved["state"].items()},
            "param_groups": [
                {**group, "params": [names[index] for index in group["params"]]}
                for group in saved["param_groups"]
            ],
        }
    except IndexError:
        raise ValueError(
            f"the optimizer state holds other parameters than this model's optimizer ({len(names)})"
        ) from None


def optimizer_state_by_index(model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict) -> dict:
    """``saved`` keyed by parameter name (:func:`full_state_dicts` of an FSDP2 model) keyed as this
    ``optimizer.state_dict()`` keys it: each parameter by its position in ``optimizer``'s groups, each group
    holding the same parameters as this one's (else ``ValueError``: no moment lands on another parameter);
    one keyed by position as it is."""
    if _by_position(saved):
        return saved
    names = _optimizer_names(model, optimizer)
    groups, start = [], 0
    saved_groups = saved["param_groups"]
    if len(saved_groups) != len(optimizer.param_groups):
        raise ValueError(
            f"the optimizer state holds other parameters than this model's optimizer ({len(saved_groups)} "
            f"parameter groups, this one {len(optimizer.param_groups)})"
        )
    for number, (group, current) in enumerate(zip(saved_groups, optimizer.param_groups, strict=True)):
        own = names[start : start + len(current["params"])]
        if set(group["params"]) != set(own):
            raise ValueError(
                f"the optimizer state holds other parameters than this model's optimizer (group {number}: "
                f"{sorted(set(group['params']) ^ set(own))[:3]} differ)"
            )
        groups.append({**group, "params": list(range(start, start + len(own)))})
        start += len(own)
    position = {name: index for index, name in enumerate(names)}
    unknown = sorted(set(saved["state"]) - position.keys())
    if unknown:
        raise ValueError(
            f"the optimizer state holds other parameters than this model's optimizer ({unknown[:3]})"
        )
    return {
        "state": {position[name]: value for name, value in saved["state"].items()},
        "param_groups": groups,
    }


def _by_position(saved: dict) -> bool:
    keys = list(saved.get("state", {})) + [key for group in saved["param_groups"] for key in group["params"]]
    return all(isinstance(key, int) for key in keys)


def _optimizer_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of ``optimizer``'s parameters, in the order of its groups."""
    named = {id(param): name for name, param in model.named_parameters()}
    names = [named.get(id(param)) for group in optimizer.param_groups for param in group["params"]]
    if None in names:
        raise ValueError("the optimizer updates a tensor that is not one of the model's parameters")
    return names


def get_plain_keys(model: torch.nn.Module) -> list[str]:
    return [name for name, _ in model.named_parameters(remove_duplicate=False)]


def _tied_source(model: torch.nn.Module, name: str) -> str:
    params = dict(model.named_parameters(remove_duplicate=False))
    target = params[name]
    return next(other for other, param in params.items() if param is target and other != name)
