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

Shapes: packed micro-batches change shape at every step (rows, row length, segment boundaries, target
positions). On the varlen paths (the GPU's) those sizes are marked dynamic before the first compile
(``attention.inputs.mark_varying_sizes`` for the model's inputs, ``mark_token_dim`` for a layer's) and the
kernel gets a fixed bound of the longest segment (``kernels.MAX_LENGTH_BOUND``), so the first compile serves
every micro-batch (tested: 4 shapes, 1 graph, either scope). Elsewhere dynamo compiles the first static and
once more for each size it first sees vary (automatic dynamic shapes). ``torch.compile(dynamic=True)`` would
skip those, but measured on this CPU it doubled the whole model's compile (160.6 s against 78.1 s) and cost
the layers 16 % of their steady speed on fixed shapes (``benchmarks/compile_scope.py``;
docs/benchmarks.md), so it is not used.

CUDA graphs (``train.runtime.compile_mode: reduce-overhead``, layers only): each compiled layer's kernels are
captured once and replayed by one launch, for steps whose GPU waits for the host (a 3B LoRA step left an
H200 idle 21-41 % of its time, docs/gpu-runs/2026-11-27-h200-*: thousands of small launches and the Python
between them). A graph replays one shape, so the micro-batches keep one (``PackedCollator.fixed_shape``; the
varlen row padded to its capacity, ``attention.inputs.without_padding``): the token count stays static, only
the segment boundaries' count (a few powers of two) is dynamic, one graph recorded per count. A graph's
gradient outputs are overwritten by its next replay: with several micro-batches a step, gradients no fp32
master moves out after each one are copied once into the step's own memory (``step.owning_gradients``).
Measured once (``benchmarks/gpu_session.sh --only lora_cudagraphs``, an H100, 2026-11-28): the 3B LoRA ran
slower with the graphs than eager (docs/benchmarks.md). Kept as an experiment to A/B, not a default, and the
report offers it as one; why it is slower needs a profile on a GPU.

A layer whose hidden states need no gradient while the later layers' do (the first layer of an adapter
model: LoRA freezes the embedding) would be traced twice (dynamo guards on ``requires_grad``): it runs
eagerly, decided at its first call (``_FirstCall``), and the others share one graph.

transformers' once-only log calls (``logger.warning_once`` / ``info_once``, attached to ``logging.Logger``)
are no-ops while dynamo traces (``torch._dynamo.config.ignore_logging_functions``): its flash-attention path
warns once when it casts fp32 queries (fp32 weights under bf16 autocast), and dynamo cannot trace a logger
call, so each compiled layer broke in two at it, each layer's attention a frame of its own (guarded on its
``layer_idx``), eager past dynamo's recompile limit. A flash-attention kernel is loaded before the layers are
compiled (a layer traced through transformers' loading at its first call was compiled twice).

Module hooks are guarded (``torch._dynamo.config.skip_nnmodule_hook_guards`` set off when a model is
compiled): a sweep's runs train in one process, and dynamo shares a class's traced frames between
instances, so a run with NEFTune (hooks on the model and its embeddings, ``model.noise``) after one
compiled without it ran the earlier graph, without the hooks, while its summary said the noise was on.
Guarded, the hooked model traces a graph of its own (once: the run's later steps reuse it).

The layers are transformers' own (``GradientCheckpointingLayer``: every decoder and encoder layer of the
families fastlm trains); checkpointing, LoRA, liger's patches and DDP/FSDP2 wrap around them unchanged, and
the state dict keeps its names (nothing is wrapped).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from time import perf_counter

import torch

from fastlm.errors import ConfigError

_log = logging.getLogger(__name__)

__all__ = [
    "COMPILE_MODES",
    "COMPILE_SCOPES",
    "CompileClock",
    "GraphCensus",
    "compile_in_scope",
    "compiled_layers",
    "cuda_graph_census",
    "describe_cuda_graphs",
    "eager_stance",
    "repeated_layers",
    "uncompile_layers",
]

COMPILE_SCOPES = ("model", "layers")
COMPILE_MODES = ("default", "reduce-overhead")  # train.runtime.compile_mode: torch.compile's mode
PARAM = "train.runtime.compile_scope"


def repeated_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's transformer layers (transformers' ``GradientCheckpointingLayer`` instances), in order."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]


def compile_in_scope(
    model: torch.nn.Module, scope: str, mode: str = "default", backend: str | Callable = "inductor"
) -> torch.nn.Module:
    """``model`` compiled in ``scope``: ``torch.compile(model)`` (a wrapper) for ``model``; for ``layers``
    each transformer layer compiled in place and ``model`` itself returned. ``mode``: torch.compile's
    (``reduce-overhead``: CUDA graphs, on inputs of one shape); ``backend``: torch.compile's (runs train with
    inductor; ``aot_eager`` traces without generating kernels, benchmarks/compile_scope.py's quick form). A
    model without such layers cannot be compiled by layers: one ``ConfigError`` line."""
    if mode not in COMPILE_MODES:
        raise ConfigError(
            f"train.runtime.compile_mode is {mode!r}.", fix=f"set it to one of {', '.join(COMPILE_MODES)}."
        )
    options = {} if mode == "default" else {"mode": mode}
    _trace_past_once_only_logging()
    _guard_module_hooks()
    _load_flash_attention(model)
    if backend != "inductor":
        options["backend"] = backend
    if scope == "model":
        return torch.compile(model, **options)
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
        layer._compiled_call_impl = _FirstCall(layer, options)  # where nn.Module.compile keeps it
    return model


def _trace_past_once_only_logging() -> None:
    """transformers' ``warning_once`` / ``info_once`` ignored under dynamo's tracing (module docstring)."""
    ignored = getattr(torch._dynamo.config, "ignore_logging_functions", None)
    if ignored is None:  # a torch without the setting: the graph break stays
        return
    for name in ("warning_once", "info_once"):
        function = getattr(logging.Logger, name, None)  # set when transformers is imported
        if function is not None:
            ignored.add(function)


def _guard_module_hooks() -> None:
    """Dynamo guards on module hooks from here on (``skip_nnmodule_hook_guards`` off; module docstring)."""
    if getattr(torch._dynamo.config, "skip_nnmodule_hook_guards", None):
        torch._dynamo.config.skip_nnmodule_hook_guards = False


def _load_flash_attention(model: torch.nn.Module) -> None:
    """transformers loads a flash-attention kernel at its first call and keeps which in a module global: a
    layer traced through that load is guarded on the global and compiled again at the next call. Loaded here
    before anything is compiled (transformers' own advice for compiling)."""
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None) or ""
    if implementation.startswith("flash_attention"):
        from transformers.modeling_flash_attention_utils import lazy_import_flash_attention

        lazy_import_flash_attention(implementation)


class _FirstCall:
    """A layer's call until its first one decides: compiled (``torch.compile`` of its call, as
    ``nn.Module.compile`` does), or eager when gradients are on and its hidden states need none (module
    docstring)."""

    def __init__(self, layer: torch.nn.Module, options: dict) -> None:
        self.layer, self.options = layer, options

    def __call__(self, *args, **kwargs):
        layer = self.layer
        hidden = args[0] if args else kwargs.get("hidden_states")
        frozen_input = isinstance(hidden, torch.Tensor) and not hidden.requires_grad
        if torch.is_grad_enabled() and frozen_input:
            layer._compiled_call_impl = None
            return layer._call_impl(*args, **kwargs)
        # a varlen call: the token count varies (attention.inputs), except where a CUDA graph keeps one shape
        if "cu_seq_lens_q" in kwargs and self.options.get("mode") != "reduce-overhead":
            mark_token_dim(hidden, kwargs.get("position_embeddings"))
        layer._compiled_call_impl = torch.compile(layer._call_impl, **self.options)
        return layer._compiled_call_impl(*args, **kwargs)


def mark_token_dim(hidden, position_embeddings) -> None:
    """A varlen layer call's token count (``[1, tokens, ...]`` hidden states and rotary cos/sin) marked
    dynamic for its first compile; ``attention.inputs.mark_varying_sizes`` marks the model's inputs the
    same way (a layer's inputs are made inside the model, so they carry no mark of their own)."""
    from torch._dynamo import maybe_mark_dynamic

    tensors = [hidden, *(position_embeddings if isinstance(position_embeddings, tuple) else ())]
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.dim() >= 2 and tensor.shape[0] == 1:
            maybe_mark_dynamic(tensor, 1)


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


class CompileClock:
    """The wall seconds ``torch.compile`` spends compiling in this process while it is entered (``with``):
    timed between dynamo's compile callbacks, which fire around each outermost compile (a frame traced and
    inductor's code generated, a backward compiled at its first call, a CUDA graph recorded). Calling it
    reads the seconds so far (``observe.metrics.StepMetrics``' ``compile_seconds``: the compiles left out of
    the step times and the throughput, counted apart); ``compiles`` counts them.

    It also watches for dynamo's recompile limit (``torch._dynamo.config.recompile_limit``, 8 by default):
    a function compiled that many times (one graph per shape or guarded value it met) is run eagerly from
    then on, said only in dynamo's own log, while the run stays compiled in name. ``recompile_limit_hits``
    names each such function with the guard that failed last (read from dynamo's warning), and the first one
    is said once as a warning with the fix (``RECOMPILE_LIMIT_FIX``). The hits are counted from dynamo's own
    count (``counters["unimplemented"]``), whatever the log levels; the names are read from the warning,
    which the watch sees even where a logging config or ``TORCH_LOGS`` set that logger above WARNING
    (``_RecompileLimitWatch``), and a hit whose warning never came (a disabled logger) is kept unnamed."""

    def __init__(self) -> None:
        self.seconds, self.compiles, self._began = 0.0, 0, None
        self._watch = _RecompileLimitWatch()
        self._counted_before, self._counted_at_exit = 0, None

    def __call__(self) -> float:
        return self.seconds

    def recompile_limit_hits(self) -> list[str]:
        """The functions that reached dynamo's recompile limit while entered ("function (file:line): last
        guard that failed"), one "unnamed" entry for each hit dynamo counted but did not log; the first
        said once as a warning (``_RecompileLimitWatch``)."""
        named = list(self._watch.hits)
        counted = _recompile_limit_count() if self._counted_at_exit is None else self._counted_at_exit
        hits = named + [UNNAMED_LIMIT_HIT] * max(counted - self._counted_before - len(named), 0)
        if hits and not self._watch.said:
            limit = torch._dynamo.config.recompile_limit
            self._watch.say("recompile_limit", limit, "a function dynamo did not name", "not logged")
        return hits

    def __enter__(self) -> CompileClock:
        handler = torch._dynamo.callback_handler
        handler.register_start_callback(self._start)
        handler.register_end_callback(self._end)
        self._counted_before, self._counted_at_exit = _recompile_limit_count(), None
        self._watch.attach()
        return self

    def __exit__(self, *exc_info) -> None:
        self._counted_at_exit = _recompile_limit_count()
        self._watch.detach()
        handler = torch._dynamo.callback_handler
        for callbacks, callback in (
            (handler.start_callbacks, self._start),
            (handler.end_callbacks, self._end),
        ):
            if callback in callbacks:  # torch._dynamo.reset() clears them
                callbacks.remove(callback)

    def _start(self, _args) -> None:
        self._began = perf_counter()

    def _end(self, _args) -> None:
        if self._began is not None:
            self.seconds += perf_counter() - self._began
            self.compiles += 1
            self._began = None


DYNAMO_FRAME_LOGGER = "torch._dynamo.convert_frame"  # where dynamo warns that a frame hit its recompile limit
_LIMIT_HIT = "torch._dynamo hit config."  # that warning's opening words (torch 2.5 to 2.13)
# the graph break dynamo raises at the limit, counted in counters["unimplemented"] under its message, which
# opens with this (torch/_dynamo/convert_frame.py, 2.8 to 2.13); the count names no function
_LIMIT_GRAPH_BREAK = "Dynamo recompile limit exceeded"
UNNAMED_LIMIT_HIT = "unnamed (dynamo's warning was not logged): recompile_limit"
RECOMPILE_LIMIT_FIX = (
    "Fix: give the micro-batches fewer shapes (train.batching.mode: packed, whose rows keep one length), set "
    "train.runtime.compile: false, or raise torch._dynamo.config.recompile_limit before the run."
)


def _recompile_limit_count() -> int:
    """How many times this process's dynamo reached a recompile limit (its own count, logging aside)."""
    from torch._dynamo.utils import counters

    return sum(
        n for message, n in counters["unimplemented"].items() if message.startswith(_LIMIT_GRAPH_BREAK)
    )


class _RecompileLimitWatch(logging.Filter):
    """Dynamo's recompile-limit warnings, kept in ``hits`` ("function (file:line): last reason"); the first
    said once on fastlm's log.

    A filter on dynamo's frame logger while attached, not a handler: a level above WARNING there or on a
    parent (a logging config, ``TORCH_LOGS``, ``torch._logging.set_logs``) drops a record before any handler
    sees it, so that logger is set to WARNING while attached, and the filter, having read the record, lets
    through only what the level it replaced would have let through: the user's handlers see what they saw
    before, and the level is put back on detaching."""

    def __init__(self) -> None:
        super().__init__()
        self.hits: list[str] = []
        self.said = False
        self._replaced: int | None = None  # the logger's own level, where set to WARNING while attached

    def attach(self) -> None:
        logger = logging.getLogger(DYNAMO_FRAME_LOGGER)
        logger.addFilter(self)
        if logger.getEffectiveLevel() > logging.WARNING:
            self._replaced = logger.level
            logger.setLevel(logging.WARNING)

    def detach(self) -> None:
        logger = logging.getLogger(DYNAMO_FRAME_LOGGER)
        logger.removeFilter(self)
        if self._replaced is not None and logger.level == logging.WARNING:  # unless changed meanwhile
            logger.setLevel(self._replaced)
        self._replaced = None

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith(_LIMIT_HIT):
            self._read(record)
        if self._replaced is None:
            return True
        logger = logging.getLogger(DYNAMO_FRAME_LOGGER)
        level = self._replaced or (logger.parent.getEffectiveLevel() if logger.parent else logging.WARNING)
        return record.levelno >= level

    def _read(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        limit, value, function, reason = (list(args) + ["recompile_limit", "?", "?", "?"][len(args) :])[:4]
        function = str(function).strip("'").replace("' (", " (", 1)
        self.hits.append(f"{function}: {reason}")
        if not self.said:
            self.say(limit, value, function, reason)

    def say(self, limit: object, value: object, function: str, reason: object) -> None:
        self.said = True
        _log.warning(
            "torch.compile reached torch._dynamo.config.%s (%s) at %s: it runs eagerly for the rest of "
            "the run (the summary's recompile_limit_hit), compiled in name only; the last guard that "
            "failed: %s. %s",
            limit,
            value,
            function,
            reason,
            RECOMPILE_LIMIT_FIX,
        )


@dataclass(frozen=True)
class GraphCensus:
    """The process's CUDA graphs so far: ``recorded`` by torch's CUDA graph trees on the run's device (None
    off CUDA, or where torch's trees cannot be read), and the compiled graphs inductor ran without one
    (``skipped``: its ``cudagraph_skips`` counter)."""

    recorded: int | None
    skipped: int


def cuda_graph_census(device: torch.device) -> GraphCensus:
    """The counts now; a run takes two and reports the difference (``describe_cuda_graphs``)."""
    from torch._dynamo.utils import counters

    return GraphCensus(_recorded_graphs(device), int(counters["inductor"]["cudagraph_skips"]))


def _recorded_graphs(device: torch.device) -> int | None:
    """The graphs in the device's CUDA graph tree (torch's own structure, read defensively: not a public
    API)."""
    if device.type != "cuda":
        return None
    try:
        from torch._inductor import cudagraph_trees

        index = device.index if device.index is not None else torch.cuda.current_device()
        manager = cudagraph_trees.get_manager(index, create_if_none_exists=False)
        if manager is None or manager.roots is None:
            return 0
        count, nodes = 0, [node for roots in manager.roots.values() for node in roots]
        while nodes:
            node = nodes.pop()
            count += 1
            nodes.extend(child for children in node.children.values() for child in children)
        return count
    except (AttributeError, ImportError, RuntimeError, TypeError):
        return None


def describe_cuda_graphs(before: GraphCensus, after: GraphCensus, device: torch.device) -> str:
    """What ``compile_mode: reduce-overhead`` did over a run (the summary's ``cuda_graphs``): the graphs it
    recorded, and the compiled graphs inductor ran without one (``TORCH_LOGS=cudagraphs`` prints its
    reason for each: a CPU tensor, a dynamic size, an op it cannot capture)."""
    skipped = after.skipped - before.skipped
    if device.type != "cuda":
        return f"none: this run is on {device.type}" + (
            f" ({skipped} compiled graphs ran without)" if skipped else ""
        )
    recorded = "?" if after.recorded is None else str(after.recorded - (before.recorded or 0))
    text = f"{recorded} recorded"
    if skipped:
        text += (
            f"; {skipped} compiled graphs ran without one (TORCH_LOGS=cudagraphs prints inductor's reason "
            "for each)"
        )
    return text
