"""The GPU's idle time read from a profiler trace (engine/observe/gpu_idle.py): a hand-built trace whose
every gap is known (host-bound, after a host sync, queued, after the last kernel) against the breakdown, and
a CPU run's real trace, which has no device events."""

from __future__ import annotations

import json

import pytest
import torch

from fastlm.engine.observe.gpu_idle import idle_breakdown, idle_lines
from fastlm.engine.observe.profiling import PHASES, StepProfiler

HOST = {"pid": 1, "tid": 1}
GPU = {"pid": 0, "tid": 7}


def host(name, start, end, category="cpu_op"):
    return {"ph": "X", "cat": category, "name": name, "ts": start, "dur": end - start, **HOST}


def launch(correlation, start, end, name="cudaLaunchKernel"):
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": name,
        "ts": start,
        "dur": end - start,
        "args": {"correlation": correlation},
        **HOST,
    }


def kernel(correlation, start, end, category="kernel"):
    return {
        "ph": "X",
        "cat": category,
        "name": f"k{correlation}",
        "ts": start,
        "dur": end - start,
        "args": {"correlation": correlation},
        **GPU,
    }


def hand_built_trace() -> list[dict]:
    """Two steps' worth of events (microseconds) whose gaps are, by construction:
    0-12 host-bound (forward, launched by aten::mm), 78-131 host-bound after a host sync (an .item() whose
    cudaStreamSynchronize ended at 78.5; the next launch at 130, in backward), 190-195 queued (launched at
    150), 198-214 host-bound (optimizer), 220-230 the host's optimizer phase after the last kernel."""
    return [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        host("fastlm.forward", 0, 100, "user_annotation"),
        host("fastlm.backward", 100, 200, "user_annotation"),
        host("fastlm.optimizer", 200, 230, "user_annotation"),
        {"ph": "X", "cat": "gpu_user_annotation", "name": "fastlm.forward", "ts": 12, "dur": 66, **GPU},
        host("aten::mm", 5, 15),
        launch(1, 10, 12),
        kernel(1, 12, 50),
        host("aten::add", 19, 22),
        launch(2, 20, 21),
        kernel(2, 50, 77),
        host("aten::item", 60, 80),
        host("aten::_local_scalar_dense", 61, 79),
        launch(3, 61, 62, "cudaMemcpyAsync"),
        kernel(3, 77, 78, "gpu_memcpy"),
        launch(None, 62, 78.5, "cudaStreamSynchronize"),
        host("autograd::engine::evaluate_function: MmBackward0", 120, 160),
        host("aten::mm", 125, 135),
        launch(4, 130, 131),
        kernel(4, 131, 190),
        host("aten::mul", 149, 152),
        launch(5, 150, 151),
        kernel(5, 195, 198),
        host("Optimizer.step#AdamW.step", 205, 225),
        host("aten::_foreach_add_", 209, 212),
        launch(6, 210, 211),
        kernel(6, 214, 220),
    ]


def test_each_known_gap_lands_in_its_cause_its_phase_and_its_launcher():
    idle = idle_breakdown(hand_built_trace(), steps=2, phases=PHASES)
    per_step = 1e3 * 2  # microseconds over two steps -> milliseconds per step
    assert idle["window_ms_per_step"] == pytest.approx(230 / per_step)
    assert idle["busy_ms_per_step"] == pytest.approx((65 + 1 + 59 + 3 + 6) / per_step)
    assert idle["idle_ms_per_step"] == pytest.approx(96 / per_step)
    assert idle["idle_share"] == pytest.approx(96 / 230)
    assert idle["host_bound_ms_per_step"] == pytest.approx((12 + 53 + 16 + 10) / per_step)
    assert idle["queued_ms_per_step"] == pytest.approx(5 / per_step)
    assert idle["after_sync_ms_per_step"] == pytest.approx(53 / per_step)
    assert idle["syncs_per_step"] == 0.5
    by_phase = idle["host_bound_by_phase_ms_per_step"]
    expected = {"backward": 53, "optimizer": 16, "forward": 12, "after the last kernel": 10}
    assert by_phase == pytest.approx({name: us / per_step for name, us in expected.items()})
    assert list(by_phase) == ["backward", "optimizer", "forward", "after the last kernel"]  # largest first
    launchers = idle["host_bound_top_launchers"]
    assert [(row["where"], row["gaps"]) for row in launchers] == [
        ("autograd::engine::evaluate_function: MmBackward0 > aten::mm", 1),
        ("Optimizer.step#AdamW.step > aten::_foreach_add_", 1),
        ("aten::mm", 1),
    ]
    assert [row["ms_per_step"] for row in launchers] == pytest.approx(
        [53 / per_step, 16 / per_step, 12 / per_step]
    )
    syncs = idle["host_bound_top_syncs"]
    assert [(row["where"], row["gaps"]) for row in syncs] == [("aten::item > aten::_local_scalar_dense", 1)]
    assert syncs[0]["ms_per_step"] == pytest.approx(53 / per_step)
    text = "\n".join(idle_lines(idle))
    assert "GPU idle 41.7% of the window" in text
    assert "after a sync in: aten::item > aten::_local_scalar_dense" in text


def test_kernels_on_two_streams_count_their_overlap_once():
    events = [
        host("fastlm.forward", 0, 40, "user_annotation"),
        launch(1, 0, 1),
        kernel(1, 1, 20),
        launch(2, 2, 3),
        {**kernel(2, 10, 30), "tid": 8},  # another stream, overlapping the first kernel
    ]
    idle = idle_breakdown(events, steps=1, phases=PHASES)
    assert idle["busy_ms_per_step"] == pytest.approx(29 / 1e3)
    assert idle["idle_ms_per_step"] == pytest.approx(11 / 1e3)  # 0-1 before the first, 30-40 after the last
    assert idle["host_bound_ms_per_step"] == pytest.approx(11 / 1e3)


def test_a_cpu_runs_trace_has_no_device_events(tmp_path):
    profiler = StepProfiler(start_step=1, steps=1, trace_dir=tmp_path, device=torch.device("cpu"))
    profiler.before_step(1)
    with torch.profiler.record_function("fastlm.forward"):
        (torch.randn(16, 16) @ torch.randn(16, 16)).sum()
    profiler.after_step(1)
    events = json.loads((tmp_path / "steps_1-1.pt.trace.json").read_text())["traceEvents"]
    assert any(event.get("cat") == "cpu_op" for event in events)
    assert idle_breakdown(events, steps=1, phases=PHASES) is None
    assert profiler.summary["gpu_idle"] is None
    assert idle_lines(None) == ["GPU idle: no device events in the trace (a CPU run)"]
