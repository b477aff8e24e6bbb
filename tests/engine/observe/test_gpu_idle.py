"""The GPU's idle time read from a profiler trace (engine/observe/gpu_idle.py): a hand-built trace whose
every gap is known (host-bound, after a host sync, queued, after the last kernel) against the breakdown, and
a CPU run's real trace, which has no device events."""

from __future__ import annotations

import json

import pytest
import torch

from fastlm.engine.observe.gpu_idle import idle_breakdown, idle_lines
from fastlm.engine.observe.profiling import PHASES, StepProfiler
from tests.support.traces import hand_built_trace, host, kernel, launch


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
