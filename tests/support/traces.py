"""A hand-built torch.profiler Chrome trace whose every GPU gap is known (engine/observe/gpu_idle.py's
tests and the report's)."""

from __future__ import annotations

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
