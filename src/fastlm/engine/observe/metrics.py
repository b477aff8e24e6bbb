"""Training metrics that cost no GPU sync per step.

Reading a CUDA value on the host (``.item()``, ``.cpu()``, ``float(t)``, ``print(t)``) waits until the GPU
has finished every queued kernel, so the host can no longer run ahead and the GPU idles while the next step
is prepared. ``StepMetrics`` therefore keeps its sums in one small tensor ON THE DEVICE and updates it with
in-place tensor ops only; values are read back with a single transfer in ``flush()``, on logging steps.
Wall times are taken on the host (``time.perf_counter``), which needs no sync: over a flush window the
host cannot run ahead of the GPU by more than the queue, and ``flush()`` waits for the GPU before it reads
the clock, so window throughputs are exact.

A flush record (plain floats, ready for ``mlflow.log_metrics``):

``loss``                mean loss per target token since the last flush
``grad_norm``           last gradient norm passed to ``update`` (None if none was)
``lr``                  last learning rate passed to ``update`` (a host float, or a device tensor, read here)
``tokens_per_s``        computed tokens (padding included) per second
``real_tokens_per_s``   non-padding tokens per second
``samples_per_s``       rows per second
``step_time_s``         mean wall time of an optimizer step in the window
``step_time_max_s``     slowest host-side step time in the window (all of them are in ``step_times``)
``data_wait_share``     time spent waiting for the DataLoader ÷ window time (``record_data_wait``)
``padding_efficiency``  real ÷ computed tokens
``peak_memory_mb``      CUDA ``max_memory_allocated`` on a GPU, peak process RSS on CPU
``mfu``                 model FLOPs utilisation: flops_per_token × real tokens/s ÷ device peak FLOPs;
                        None on CPU or on a GPU missing from ``PEAK_BF16_DENSE_FLOPS``
``eta_s``               steps remaining × mean step time of the window (None without ``total_steps``)
``elapsed_s``           time since ``start()`` (or construction)
``compile_s``           seconds ``torch.compile`` spent compiling in the window (``compile_seconds``)

Compiling is a start-up cost, not the steps' speed: a compiled run compiles at its first step and again where
a micro-batch's shape first varies (dynamo's automatic dynamic shapes: the second step of a length-grouped
run, 19.4 s of a 0.003 s step on the toy model with cold caches, the summary's throughput 20.8 real tokens/s
where the steps ran at about 14,000). The compile seconds (``compile_seconds``: a reading of
``runtime.regions.CompileClock``) are left out of every time here, the step times and the window's clock
alike, and counted apart (``compile_s`` of each record, ``step_compile_s``, the summary's ``compile_s``);
``elapsed_s`` stays the wall clock. The clock may hold compiles from before ``start()`` (``compile: auto``'s
probe compiles its candidate before the first step): ``compile_before_start_s``, which the summary's
``compile_s`` adds to the steps' own (``compile_probe_s`` says how much).
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Callable
from time import perf_counter

import torch

# Dense (no sparsity) bf16 tensor-core peaks, FLOP/s, matched against torch.cuda.get_device_name in this
# order (more specific names first). fp16 peaks are the same on these GPUs.
PEAK_BF16_DENSE_FLOPS = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM
    ("H200 NVL", 835e12),
    ("H200", 989e12),  # SXM
    ("A100", 312e12),
)

_SLOTS = ("loss_sum", "target_tokens", "real_tokens", "computed_tokens", "samples", "grad_norm")


def flops_per_token(n_params: int, n_layers: int, hidden_size: int, seq_len: int) -> int:
    """Training FLOPs per token (forward + backward), PaLM appendix B: 6·N + 12·layers·hidden·seq_len.

    6·N covers the matmuls with the weights, the second term the attention scores and their use, which grow
    with the attended length ``seq_len`` (the padded or packed row length).
    """
    return 6 * n_params + 12 * n_layers * hidden_size * seq_len


def attended_length(lengths) -> float:
    """The mean number of keys a token's attention row spans when each document attends only to itself:
    ``sum(len**2) / sum(len)`` over the documents (``flops_per_token``'s ``seq_len`` for document-masked
    work)."""
    import numpy as np

    lengths = np.asarray(lengths, dtype=np.float64)
    return float((lengths**2).sum() / lengths.sum()) if lengths.sum() else 0.0


def device_peak_flops(device: torch.device | str) -> float | None:
    """Dense bf16 peak of a known GPU; None on CPU or for a GPU missing from the table."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_DENSE_FLOPS if key in name), None)


# a container's memory limit: cgroup v2's file, then v1's (read in this order; the first that holds a number)
CGROUP_MEMORY_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def device_memory_mb(device: torch.device | str) -> float | None:
    """Total memory of the device: the GPU's; on CPU the host's RAM, or the cgroup's limit where one is
    lower (a container's: Docker's ``--memory``, a Kubernetes pod's limit), past which the kernel kills the
    process rather than raise an out-of-memory error (None where unknown)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / 2**20
    try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (ValueError, OSError, AttributeError):
        host = None
    limit = _cgroup_memory_mb()
    if limit is None:
        return host
    return limit if host is None else min(host, limit)


def _cgroup_memory_mb() -> float | None:
    """This process's cgroup memory limit in MB (None: no limit, v2's ``max`` or v1's near-2**63, or no
    cgroup file)."""
    for path in CGROUP_MEMORY_LIMITS:
        try:
            with open(path) as handle:
                text = handle.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < 2**60:  # v1 writes "no limit" as a page-rounded 2**63 - 1
            return int(text) / 2**20
        if text:
            return None  # "max": no limit here
    return None


def peak_memory_mb(device: torch.device | str) -> float:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20  # allocator bookkeeping, no sync
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max_rss / 2**20 if sys.platform == "darwin" else max_rss / 2**10  # bytes on macOS, KiB on Linux


class StepMetrics:
    """Per-step accumulators on the device, read back once per logging step.

    In the loop::

        metrics = StepMetrics(device, total_steps=..., flops_per_token=flops_per_token(...))
        metrics.start()
        for step in range(total_steps):
            t0 = perf_counter(); batches = next_micro_batches(); metrics.record_data_wait(perf_counter() - t0)
            loss_sum, n_targets = accumulate_gradients(...); grad_norm = clip_grad_norm_(...); ...
            metrics.update(loss_sum=loss_sum, target_tokens=n_targets, real_tokens=..., computed_tokens=...,
                           samples=..., grad_norm=grad_norm, lr=scheduler.get_last_lr()[0])
            if (step + 1) % log_every == 0:
                log_metrics(metrics.flush(step + 1))

    ``update`` takes tensors (on the device) or host numbers; it never reads a tensor on the host.
    """

    def __init__(
        self,
        device: torch.device | str,
        *,
        total_steps: int | None = None,
        flops_per_token: float | None = None,
        peak_flops: float | None = None,
        reduce_loss_sum: Callable[[torch.Tensor], object] | None = None,
        compile_seconds: Callable[[], float] | None = None,
    ) -> None:
        self.device = torch.device(device)
        # seconds torch.compile has spent compiling so far (runtime.regions.CompileClock): left out of times
        self._compile_seconds = compile_seconds or (lambda: 0.0)
        # Data parallel: sums the window's loss over ranks in flush() (the token counts passed to update()
        # are already global); one small collective per logging step.
        self._reduce_loss_sum = reduce_loss_sum
        self.total_steps = total_steps
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops if peak_flops is not None else device_peak_flops(self.device)
        self._sums = torch.zeros(len(_SLOTS), dtype=torch.float64, device=self.device)
        # Views into _sums, made once: in-place ops on them update the one tensor flush() reads.
        (
            self._loss_sum,
            self._target_tokens,
            self._real_tokens,
            self._computed_tokens,
            self._samples,
            self._grad_norm,
        ) = self._sums.unbind()
        self.step_times: list[float] = []  # host wall time of every step, since start(), compiles left out
        self.step_compile_s: list[float] = []  # the seconds torch.compile took within each step
        # Per step, host numbers only (None where update() got a device tensor): data wait, real and computed
        # tokens.
        self.step_data_waits: list[float] = []
        self.step_real_tokens: list[float | None] = []
        self.step_computed_tokens: list[float | None] = []
        self.history: list[dict] = []  # one record per flush
        self.start()

    def start(self, elapsed_before_s: float = 0.0) -> None:
        """(Re)start the clocks, e.g. right before the first step once the model is built and compiled.
        ``elapsed_before_s``: where ``elapsed_s`` starts (a resumed run: its earlier processes' time)."""
        self._start = self._window_start = self._last_step_end = perf_counter()
        self._compiled_at_window_start = self._compiled_at_last_step_end = self._compile_seconds()
        self._elapsed_before_s = elapsed_before_s
        self.compile_s = 0.0  # seconds torch.compile took since start(), in the steps or between them
        # the seconds it took before start(): the runtime probes' compiles (compile and float8 auto)
        self.compile_before_start_s = self._compiled_at_window_start
        self.outside_steps_s = 0.0  # host time spent between steps on other work (``set_aside``)
        self.oom_failed_s = 0.0  # host time of step attempts that ran out of memory (``discard_attempt``)
        self._window_steps = 0
        self._window_data_wait = 0.0
        self._step_data_wait = 0.0
        self._has_grad_norm = False
        self._sharded_grad_norm = None
        self._lr: torch.Tensor | float | None = None
        self._sums.zero_()

    @property
    def pending_steps(self) -> int:
        """Steps updated since the last flush."""
        return self._window_steps

    def set_aside(self) -> None:
        """The time since the last step ended went to other work (an evaluation, a checkpoint save): kept out
        of the next step's time (``step_times``, the steady throughput) and counted in ``outside_steps_s``.
        The logging window's wall clock keeps it (its ``real_tokens_per_s``, ``step_time_s``)."""
        now, compiling = perf_counter(), self._compiled_since_last_step_end()
        self.outside_steps_s += now - self._last_step_end - compiling
        self._last_step_end = now

    def discard_attempt(self) -> None:
        """The step begun since the last one ended ran out of memory and is redone smaller: its time (its data
        wait included) is counted in ``oom_failed_s``, not in the redone step's (``step_times``, the
        percentiles, the data wait and steady throughput). The logging window's wall clock keeps it."""
        now, compiling = perf_counter(), self._compiled_since_last_step_end()
        self.oom_failed_s += now - self._last_step_end - compiling
        self._last_step_end = now
        self._step_data_wait = 0.0

    def record_data_wait(self, seconds: float) -> None:
        """Host time the loop spent waiting for the next batch(es) during the current step."""
        self._window_data_wait += seconds
        self._step_data_wait += seconds

    def update(
        self,
        *,
        loss_sum: torch.Tensor | float,
        target_tokens: torch.Tensor | int,
        real_tokens: torch.Tensor | int,
        computed_tokens: torch.Tensor | int,
        samples: torch.Tensor | int,
        grad_norm: torch.Tensor | float | None = None,
        lr: torch.Tensor | float | None = None,
    ) -> None:
        """Add one optimizer step. Tensor ops and host arithmetic only: no device-to-host transfer."""
        now, compiling = perf_counter(), self._compiled_since_last_step_end()
        self.step_times.append(now - self._last_step_end - compiling)
        self.step_compile_s.append(compiling)
        self.step_data_waits.append(self._step_data_wait)
        self.step_real_tokens.append(None if isinstance(real_tokens, torch.Tensor) else float(real_tokens))
        self.step_computed_tokens.append(
            None if isinstance(computed_tokens, torch.Tensor) else float(computed_tokens)
        )
        self._last_step_end = now
        self._step_data_wait = 0.0
        self._window_steps += 1

        if isinstance(loss_sum, torch.Tensor):
            loss_sum = loss_sum.detach()
        self._loss_sum.add_(loss_sum)
        self._target_tokens.add_(target_tokens)
        self._real_tokens.add_(real_tokens)
        self._computed_tokens.add_(computed_tokens)
        self._samples.add_(samples)
        if grad_norm is not None:
            if hasattr(grad_norm, "full_tensor"):  # FSDP2's DTensor: made whole at the flush, not every step
                self._sharded_grad_norm = grad_norm.detach()
            elif isinstance(grad_norm, torch.Tensor):
                self._grad_norm.copy_(grad_norm.detach())
            else:
                self._grad_norm.fill_(grad_norm)
            self._has_grad_norm = True
        if lr is not None:
            self._lr = lr

    def flush(self, step: int) -> dict[str, float | int | None]:
        """Read the sums back (the one sync), compute the window's metrics, reset the window."""
        if not self._window_steps:
            raise ValueError("flush() with no update() since the last flush")
        if self._reduce_loss_sum is not None:
            self._reduce_loss_sum(self._sums[:1])
        # every rank flushes at the same steps: the collective matches
        if self._sharded_grad_norm is not None:
            self._grad_norm.copy_(self._sharded_grad_norm.full_tensor())
            self._sharded_grad_norm = None
        loss_sum, target_tokens, real_tokens, computed_tokens, samples, grad_norm = self._sums.tolist()
        now = perf_counter()  # after the sync: the GPU has finished the window's work
        # the read-back waited for the window's queued device work: the steps' own time (the last step's),
        # not lost between them (the steady throughput would read high on a GPU)
        compiling = self._compiled_since_last_step_end()
        self.step_times[-1] += now - self._last_step_end - compiling
        self.step_compile_s[-1] += compiling
        self._last_step_end = now
        window_compile = self._compile_seconds() - self._compiled_at_window_start
        window = max(now - self._window_start - window_compile, 1e-12)
        steps = self._window_steps
        step_time = window / steps
        real_tokens_per_s = real_tokens / window
        mfu = None
        if self.flops_per_token is not None and self.peak_flops:
            mfu = self.flops_per_token * real_tokens_per_s / self.peak_flops
        record = {
            "step": step,
            "loss": loss_sum / target_tokens if target_tokens else float("nan"),  # no target: no loss
            # the window's (summed over ranks): 0 where no sample had one
            "target_tokens": int(target_tokens),
            "grad_norm": grad_norm if self._has_grad_norm else None,
            "lr": float(self._lr) if self._lr is not None else None,  # a device rate (fp16, fused) read here
            "tokens_per_s": computed_tokens / window,
            "real_tokens_per_s": real_tokens_per_s,
            "samples_per_s": samples / window,
            "step_time_s": step_time,
            "step_time_max_s": max(self.step_times[-steps:]),
            "data_wait_share": self._window_data_wait / window,
            "padding_efficiency": real_tokens / computed_tokens if computed_tokens else None,
            "peak_memory_mb": peak_memory_mb(self.device),
            "mfu": mfu,
            "eta_s": max(self.total_steps - step, 0) * step_time if self.total_steps is not None else None,
            "elapsed_s": self._elapsed_before_s + now - self._start,
            "compile_s": window_compile,
        }
        self.history.append(record)
        self._sums.zero_()
        self._window_steps = 0
        self._window_data_wait = 0.0
        self._has_grad_norm = False
        self._window_start = self._last_step_end = perf_counter()
        self._compiled_at_window_start = self._compiled_at_last_step_end
        return record

    def _compiled_since_last_step_end(self) -> float:
        """The compile seconds since the last step ended (or the clocks started), added to ``compile_s``."""
        total = self._compile_seconds()
        compiling = total - self._compiled_at_last_step_end
        self._compiled_at_last_step_end = total
        self.compile_s += compiling
        return compiling

    def step_figures(self) -> dict[str, float | None]:
        """The run's figures over its single steps (the first one, warm-up and compilation, left out unless it
        is the only one): step-time percentiles and maximum, data-wait share (total wait / total time),
        padding efficiency (total real / total computed tokens) and the steady throughput
        (``steady_real_tokens_per_s``: total real tokens / total step time, the time ``set_aside`` for
        evaluations and saves not in it; ``outside_steps_s``: that time; ``oom_failed_s``: the time of the
        attempts that ran out of memory and were redone smaller, in no step's). None where nothing was
        measured."""
        keep = slice(1, None) if len(self.step_times) > 1 else slice(None)
        times, waits = self.step_times[keep], self.step_data_waits[keep]
        real, computed = self.step_real_tokens[keep], self.step_computed_tokens[keep]
        counted = None not in real and None not in computed and sum(computed) > 0
        total = sum(times)
        return {
            "step_time_p50_s": _percentile(times, 50),
            "step_time_p90_s": _percentile(times, 90),
            "step_time_p99_s": _percentile(times, 99),
            "step_time_max_s": max(times, default=None),
            "data_wait_share": sum(waits) / total if total > 0 else None,
            "padding_efficiency": sum(real) / sum(computed) if counted else None,
            "steady_real_tokens_per_s": sum(real) / total if None not in real and total > 0 else None,
            "outside_steps_s": round(self.outside_steps_s, 3),
            "oom_failed_s": round(self.oom_failed_s, 3),
        }

    def to_frame(self):
        """The flush history as a pandas DataFrame (built once, at the end)."""
        import pandas as pd

        return pd.DataFrame(self.history)


def _percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile with linear interpolation (numpy's default); None for no values."""
    if not values:
        return None
    import numpy as np

    return float(np.percentile(values, q))
