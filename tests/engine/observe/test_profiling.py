"""The step profiler, driven directly: it records exactly the asked window of steps once, writes a Chrome
trace holding the loop's phase ranges, and summarises the phases and the top operators; off, it does
nothing."""

from __future__ import annotations

import json

import torch

from fastlm.engine.config import ProfileParams
from fastlm.engine.observe.profiling import PHASES, NoProfiler, StepProfiler, step_profiler

CPU = torch.device("cpu")


def run_steps(profiler, steps: range) -> None:
    """Steps as the loop runs them: each phase under its ``record_function`` range, some real work inside."""
    weight = torch.randn(64, 64, requires_grad=True)
    for step in steps:
        profiler.before_step(step)
        with torch.profiler.record_function("fastlm.data"):
            batch = torch.randn(32, 64)
        with torch.profiler.record_function("fastlm.forward"):
            loss = (batch @ weight).square().mean()
        with torch.profiler.record_function("fastlm.backward"):
            loss.backward()
        with torch.profiler.record_function("fastlm.optimizer"), torch.no_grad():
            weight -= 0.01 * weight.grad
            weight.grad = None
        profiler.after_step(step)


def test_records_the_asked_window_once_and_summarises_it(tmp_path):
    profiler = StepProfiler(start_step=2, steps=2, trace_dir=tmp_path / "profile", device=CPU, top=5)
    assert profiler.summary == {"enabled": True, "recorded": False}
    run_steps(profiler, range(1, 7))
    summary = profiler.summary
    assert summary["recorded"] and summary["steps"] == "2-3"
    trace = tmp_path / "profile" / "steps_2-3.pt.trace.json"
    assert summary["trace"] == str(trace) and [p.name for p in trace.parent.iterdir()] == [trace.name]
    names = {event.get("name") for event in json.loads(trace.read_text())["traceEvents"]}
    assert set(PHASES) <= names  # the loop's ranges are in the trace Perfetto opens
    shares = summary["phase_share"]
    assert list(shares) == ["data", "forward", "backward", "optimizer"]
    assert all(0 < share <= 1 for share in shares.values()) and sum(shares.values()) <= 1.0
    top = summary["top_operators"]
    assert 0 < len(top) <= 5 and not any(op["operator"].startswith("fastlm.") for op in top)
    assert [op["self_cpu_ms"] for op in top] == sorted((op["self_cpu_ms"] for op in top), reverse=True)
    assert all(op["self_cuda_ms"] is None and op["calls"] >= 1 for op in top)
    assert summary["window_ms"] > 0


def test_a_run_that_ends_inside_the_window_is_closed_at_its_last_step(tmp_path):
    profiler = StepProfiler(start_step=2, steps=10, trace_dir=tmp_path, device=CPU)
    run_steps(profiler, range(1, 5))
    assert not profiler.summary["recorded"]  # still recording: the window asks for steps 2-11
    profiler.close(4)
    assert profiler.summary["recorded"] and profiler.summary["steps"] == "2-4"
    assert (tmp_path / "steps_2-4.pt.trace.json").is_file()
    profiler.close(4)  # nothing left open: a second close does nothing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps_2-4.pt.trace.json"]


def test_step_profiler_is_off_unless_enabled_and_on_this_rank(tmp_path):
    on = ProfileParams(enabled=True, start_step=3, steps=2, trace_dir=str(tmp_path))
    assert isinstance(step_profiler(ProfileParams(), CPU), NoProfiler)
    assert isinstance(step_profiler(on, CPU, enabled=False), NoProfiler)  # another rank than 0
    profiler = step_profiler(on, CPU)
    assert isinstance(profiler, StepProfiler)
    assert (profiler.start_step, profiler.steps, profiler.trace_dir) == (3, 2, tmp_path)
    off = NoProfiler()
    run_steps(off, range(1, 4))
    assert off.summary == {"enabled": False} and list(tmp_path.iterdir()) == []


def test_phase_times_read_the_host_rows_where_a_gpu_run_has_device_rows_too():
    """With CUDA recorded, ``key_averages()`` holds each phase range twice: the host's row and the GPU's
    (``gpu_user_annotation``, grouped apart by device type, no host time). The H100 profiles of 2026-11-27
    printed forward, backward and optimizer shares of 0.0: the GPU's rows had replaced the host's."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from fastlm.engine.observe.profiling import phase_times

    rows = [
        SimpleNamespace(key="fastlm.forward", cpu_time_total=300.0, device_type=DeviceType.CPU),
        SimpleNamespace(key="fastlm.forward", cpu_time_total=0.0, device_type=DeviceType.CUDA),
        SimpleNamespace(key="fastlm.data", cpu_time_total=20.0, device_type=DeviceType.CPU),
        SimpleNamespace(key="aten::mm", cpu_time_total=50.0, device_type=DeviceType.CPU),
        SimpleNamespace(key="fastlm.backward", cpu_time_total=0.0, device_type=DeviceType.CUDA),
        SimpleNamespace(key="fastlm.backward", cpu_time_total=500.0, device_type=DeviceType.CPU),
    ]
    assert phase_times(rows) == {"fastlm.forward": 300.0, "fastlm.data": 20.0, "fastlm.backward": 500.0}
