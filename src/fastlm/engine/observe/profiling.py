"""Profiling on demand: record a short window of training steps with torch.profiler.

The loop marks its phases with ``torch.profiler.record_function`` ranges (``fastlm.data``,
``fastlm.forward``, ``fastlm.backward``, ``fastlm.optimizer``): free when no profiler is recording. The
trace is a Chrome-trace JSON (``*.pt.trace.json``) that Perfetto (ui.perfetto.dev) and TensorBoard's profiler
plugin open; the summary lists the top operators by self time and each phase's share of the window, and on
a GPU where the GPU sat idle and why (gpu_idle.py: waiting for the host, by phase and launching operator,
after host syncs, or queued).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from time import perf_counter

import torch

from fastlm.engine.observe.gpu_idle import idle_breakdown, idle_lines

log = logging.getLogger(__name__)
PHASES = ("fastlm.data", "fastlm.forward", "fastlm.backward", "fastlm.optimizer")


class StepProfiler:
    """Profiles optimizer steps ``start_step .. start_step + steps - 1`` (1-based), once."""

    def __init__(
        self, *, start_step: int, steps: int, trace_dir: str | Path, device: torch.device, top: int = 15
    ):
        self.start_step, self.steps, self.trace_dir, self.top = start_step, steps, Path(trace_dir), top
        self.activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            self.activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = None
        self._started = 0.0
        self.summary: dict = {"enabled": True, "recorded": False}

    def before_step(self, step: int) -> None:
        """``step`` is the 1-based number of the step about to run."""
        if step == self.start_step and self._profiler is None and not self.summary["recorded"]:
            self._profiler = torch.profiler.profile(activities=self.activities, record_shapes=False)
            self._profiler.__enter__()
            self._started = perf_counter()

    def after_step(self, step: int) -> None:
        if self._profiler is not None and step == self.start_step + self.steps - 1:
            self._finish(step)

    def close(self, step: int) -> None:
        """End a window the run did not reach the end of (fewer steps than asked)."""
        if self._profiler is not None:
            self._finish(step)

    def _finish(self, last_step: int) -> None:
        profiler, self._profiler = self._profiler, None
        if profiler.activities and torch.cuda.is_available():
            torch.cuda.synchronize()
        wall_us = (perf_counter() - self._started) * 1e6
        profiler.__exit__(None, None, None)
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        trace = self.trace_dir / f"steps_{self.start_step}-{last_step}.pt.trace.json"
        profiler.export_chrome_trace(str(trace))
        events = profiler.key_averages()
        on_cuda = torch.profiler.ProfilerActivity.CUDA in self.activities
        ops = sorted(
            (e for e in events if not e.key.startswith("fastlm.") and not e.key.startswith("ProfilerStep")),
            key=lambda e: e.self_cpu_time_total + (e.self_device_time_total if on_cuda else 0),
            reverse=True,
        )
        phases = phase_times(events)
        idle = None
        if on_cuda:  # where the GPU waited, from the trace's device and launch events
            idle = idle_breakdown(
                json.loads(trace.read_text()).get("traceEvents", []),
                steps=last_step - self.start_step + 1,
                phases=PHASES,
            )
        self.summary = {
            "enabled": True,
            "recorded": True,
            "steps": f"{self.start_step}-{last_step}",
            "trace": str(trace),
            "window_ms": wall_us / 1e3,
            "phase_share": {name.removeprefix("fastlm."): phases.get(name, 0.0) / wall_us for name in PHASES},
            "gpu_idle": idle,
            "top_operators": [
                {
                    "operator": e.key,
                    "calls": e.count,
                    "self_cpu_ms": e.self_cpu_time_total / 1e3,
                    "self_cuda_ms": (e.self_device_time_total / 1e3) if on_cuda else None,
                }
                for e in ops[: self.top]
            ],
        }
        log.info(
            "Profiled steps %s: trace %s (open it in Perfetto or TensorBoard); phase shares %s",
            self.summary["steps"],
            trace,
            ", ".join(f"{k} {v:.0%}" for k, v in self.summary["phase_share"].items()),
        )
        if idle is not None:
            log.info("Profiled steps %s: %s", self.summary["steps"], "\n".join(idle_lines(idle)))


def phase_times(events) -> dict[str, float]:
    """Each phase range's host time in microseconds, from ``key_averages()``'s rows: the host's row of each
    (with CUDA recorded a range has a GPU row too, grouped apart by device type, without host time)."""
    return {
        e.key: e.cpu_time_total
        for e in events
        if e.key in PHASES and e.device_type == torch.autograd.DeviceType.CPU
    }


class NoProfiler:
    """Profiling off (or another rank than 0): the profiler's calls do nothing."""

    summary = {"enabled": False}

    def before_step(self, step: int) -> None:
        return None

    def after_step(self, step: int) -> None:
        return None

    def close(self, step: int) -> None:
        return None


def step_profiler(profile, device: torch.device, *, enabled: bool = True) -> StepProfiler | NoProfiler:
    """``train.profile``'s profiler (``StepProfiler``) when it is on and ``enabled``, else a
    ``NoProfiler``."""
    if not (profile.enabled and enabled):
        return NoProfiler()
    return StepProfiler(
        start_step=profile.start_step, steps=profile.steps, trace_dir=profile.trace_dir, device=device
    )
