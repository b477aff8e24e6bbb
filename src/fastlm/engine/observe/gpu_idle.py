"""Where the GPU waits in a profiled window, read from torch.profiler's Chrome trace.

A step's time is its kernels' time plus the GPU's idle time between them. The idle time has two causes that
call for different cures:

- **waiting for the host**: the next kernel was launched only after the GPU had run out of work (the launch
  call, ``cudaLaunchKernel`` or the driver's ``cuLaunchKernel*``, starts after the previous kernel ended). The
  host, not the GPU, set the pace there: Python and dispatch overhead of many small kernels, a data or
  optimizer step on the host, or a host sync (``.item()``, ``torch.equal``, a blocking copy) that emptied
  the queue and made the host start launching again from nothing. Cures: fewer and larger kernels (fusion,
  compile, CUDA graphs), no syncs.
- **queued**: the kernel had been launched before the GPU went idle, and still started later (launch
  latency, a wait on another stream or an event). Usually a few microseconds per kernel.

``idle_breakdown`` measures both from the trace's own events: device intervals (``kernel``, ``gpu_memcpy``,
``gpu_memset``), joined to their launch calls by the ``correlation`` id, and the host's operators and the
loop's phase ranges (``fastlm.data`` .. ``fastlm.optimizer``, profiling.PHASES) on the launching thread. The
host-bound idle time is attributed to the phase and to the operators that launched the kernel ending it
(outermost below the phase > innermost), and to the host sync that ended inside the gap, if one did.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable

DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
HOST_CATEGORIES = frozenset({"cpu_op", "user_annotation", "python_function"})
# calls that block the host until the GPU is done (``.item()`` is a cudaMemcpyAsync + cudaStreamSynchronize)
SYNC_CALLS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
    }
)
TOP = 5

__all__ = ["idle_breakdown", "idle_lines"]


class _Host:
    """One host thread's operator ranges (nested, as a thread's are), for "which operators were running at
    time t": each range's parent found once, so a query walks up from the last range started, not back
    over every earlier one."""

    def __init__(self, ranges: list[tuple[float, float, str]]) -> None:
        self.ranges = sorted(ranges, key=lambda r: (r[0], -r[1]))  # a parent before a child starting with it
        self.starts = [start for start, _, _ in self.ranges]
        self.parents: list[int] = []
        open_: list[int] = []
        for index, (start, _end, _) in enumerate(self.ranges):
            while open_ and self.ranges[open_[-1]][1] < start:
                open_.pop()
            self.parents.append(open_[-1] if open_ else -1)
            open_.append(index)

    def enclosing(self, t: float) -> list[str]:
        """The names of the ranges running at ``t``, outermost first."""
        names = []
        index = bisect.bisect_right(self.starts, t) - 1
        while index >= 0:
            start, end, name = self.ranges[index]
            if end >= t:
                names.append(name)
            index = self.parents[index]
        return names[::-1]


def idle_breakdown(events: Iterable[dict], *, steps: int = 1, phases: Iterable[str] = ()) -> dict | None:
    """The GPU's busy and idle time over the profiled window of ``events`` (a Chrome trace's
    ``traceEvents``), per step (``steps`` steps in the window), split into host-bound and queued idle time,
    the host-bound part by phase, by launching operators and by host sync. None without device events (a
    CPU run)."""
    phases = tuple(phases)
    device, launches, host = [], {}, defaultdict(list)
    phase_ranges, syncs = [], []
    for event in events:
        if event.get("ph") != "X" or "dur" not in event:
            continue
        category, start, end = event.get("cat"), float(event["ts"]), float(event["ts"]) + float(event["dur"])
        thread = (event.get("pid"), event.get("tid"))
        if category in DEVICE_CATEGORIES:
            device.append((start, end, (event.get("args") or {}).get("correlation")))
        elif category in LAUNCH_CATEGORIES:
            correlation = (event.get("args") or {}).get("correlation")
            if correlation is not None:
                launches[correlation] = (start, thread)
            if event.get("name") in SYNC_CALLS:
                syncs.append((start, end, thread))
        elif category in HOST_CATEGORIES:
            if event.get("name") in phases:
                phase_ranges.append((start, end, event["name"]))
            else:
                host[thread].append((start, end, event.get("name", "?")))
    if not device:
        return None
    device.sort()
    hosts = {thread: _Host(ranges) for thread, ranges in host.items()}
    phase_host = _Host(phase_ranges)
    window_start = min([start for start, _, _ in phase_ranges] or [device[0][0]])
    window_end = max([end for _, end, _ in phase_ranges] + [max(end for _, end, _ in device)])

    busy = 0.0
    host_bound = queued = after_sync = 0.0
    by_phase: dict[str, float] = defaultdict(float)
    by_source: dict[str, list] = defaultdict(lambda: [0.0, 0])
    by_sync: dict[str, list] = defaultdict(lambda: [0.0, 0])
    sync_starts = sorted(syncs)
    covered_end = window_start
    for start, end, correlation in device:
        if start > covered_end:  # a gap: the GPU idle from covered_end to start
            gap = start - covered_end
            launch = launches.get(correlation)
            if launch is None or launch[0] < covered_end:
                queued += gap
            else:
                host_bound += gap
                launched_at, thread = launch
                phase = (phase_host.enclosing(launched_at) or ["outside the loop's phases"])[-1]
                by_phase[phase.removeprefix("fastlm.")] += gap
                sync = _sync_ending_in(sync_starts, covered_end, launched_at)
                if sync is not None:
                    after_sync += gap
                    names = hosts[sync[2]].enclosing(sync[1]) if sync[2] in hosts else []
                    site = _chain(names) or "a host sync"
                    by_sync[site][0] += gap
                    by_sync[site][1] += 1
                names = hosts[thread].enclosing(launched_at) if thread in hosts else []
                source = _chain(names) or "no operator (Python between operators)"
                by_source[source][0] += gap
                by_source[source][1] += 1
        if end > covered_end:
            busy += end - max(start, covered_end)
            covered_end = end
    if window_end > covered_end:  # the host's last phase ran past the last kernel
        host_bound += window_end - covered_end
        by_phase["after the last kernel"] += window_end - covered_end
    window = window_end - window_start
    per_step = 1e3 * max(steps, 1)  # microseconds in the window -> milliseconds per step

    def top(table: dict[str, list]) -> list[dict]:
        rows = sorted(table.items(), key=lambda item: item[1][0], reverse=True)[:TOP]
        return [{"where": name, "ms_per_step": us / per_step, "gaps": count} for name, (us, count) in rows]

    return {
        "steps": steps,
        "window_ms_per_step": window / per_step,
        "busy_ms_per_step": busy / per_step,
        "idle_ms_per_step": (window - busy) / per_step,
        "idle_share": (window - busy) / window if window > 0 else 0.0,
        "host_bound_ms_per_step": host_bound / per_step,
        "queued_ms_per_step": queued / per_step,
        "after_sync_ms_per_step": after_sync / per_step,
        "syncs_per_step": len(syncs) / max(steps, 1),
        "host_bound_by_phase_ms_per_step": {
            name: us / per_step for name, us in sorted(by_phase.items(), key=lambda item: -item[1])
        },
        "host_bound_top_launchers": top(by_source),
        "host_bound_top_syncs": top(by_sync),
    }


def _sync_ending_in(syncs: list[tuple], start: float, end: float) -> tuple | None:
    """The last host sync call (by start) whose end lies in ``[start, end]``, if any."""
    index = bisect.bisect_right(syncs, (end, float("inf"))) - 1
    while index >= 0:
        sync = syncs[index]
        if start <= sync[1] <= end:
            return sync
        if sync[1] < start and sync[0] < start - 1e6:  # a second before the gap: stop looking
            return None
        index -= 1
    return None


def _chain(names: list[str]) -> str:
    """``outermost > innermost`` operator names (one name where they are the same)."""
    if not names:
        return ""
    return names[0] if len(names) == 1 else f"{names[0]} > {names[-1]}"


def idle_lines(idle: dict | None) -> list[str]:
    """The breakdown in a few lines for a log or a benchmark's output."""
    if not idle:
        return ["GPU idle: no device events in the trace (a CPU run)"]
    lines = [
        f"GPU idle {idle['idle_share']:.1%} of the window: {idle['idle_ms_per_step']:.2f} ms per step of "
        f"{idle['window_ms_per_step']:.2f} (kernels {idle['busy_ms_per_step']:.2f}); waiting for the host "
        f"{idle['host_bound_ms_per_step']:.2f} ms (after a host sync "
        f"{idle['after_sync_ms_per_step']:.2f} ms, "
        f"{idle['syncs_per_step']:.1f} syncs per step), queued {idle['queued_ms_per_step']:.2f} ms",
        "  waiting for the host, by phase (ms per step): "
        + ", ".join(f"{name} {ms:.2f}" for name, ms in idle["host_bound_by_phase_ms_per_step"].items()),
    ]
    for row in idle["host_bound_top_launchers"]:
        lines.append(
            f"  {row['ms_per_step']:>8.2f} ms per step in {row['gaps']:>6} gaps before: {row['where']}"
        )
    for row in idle["host_bound_top_syncs"]:
        lines.append(f"  {row['ms_per_step']:>8.2f} ms per step after a sync in: {row['where']}")
    return lines
