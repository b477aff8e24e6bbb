"""StepMetrics: right values at flush, and no host sync in the per-step update."""

from __future__ import annotations

import pytest
import torch

from fastlm.engine.observe import metrics as metrics_module
from fastlm.engine.observe.metrics import StepMetrics, device_peak_flops, flops_per_token


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    clock = FakeClock()
    monkeypatch.setattr(metrics_module, "perf_counter", clock)
    return clock


def test_flush_values_on_a_synthetic_sequence(clock):
    metrics = StepMetrics("cpu", total_steps=10, flops_per_token=1000, peak_flops=1e6)

    metrics.record_data_wait(0.1)
    clock.now = 1.0
    metrics.update(
        loss_sum=torch.tensor(6.0),
        target_tokens=3,
        real_tokens=4,
        computed_tokens=5,
        samples=2,
        grad_norm=torch.tensor(2.0),
        lr=1e-3,
    )
    metrics.record_data_wait(0.3)
    clock.now = 2.0
    metrics.update(
        loss_sum=torch.tensor(4.0),
        target_tokens=torch.tensor(2),
        real_tokens=torch.tensor(4),
        computed_tokens=8,
        samples=2,
        grad_norm=torch.tensor(1.5),
        lr=2e-3,
    )
    clock.now = 2.5
    first = metrics.flush(step=2)

    assert first["step"] == 2
    assert first["loss"] == pytest.approx(10 / 5)  # per target token, not per step
    assert first["grad_norm"] == pytest.approx(1.5)  # the last one
    assert first["lr"] == 2e-3
    assert first["tokens_per_s"] == pytest.approx(13 / 2.5)
    assert first["real_tokens_per_s"] == pytest.approx(8 / 2.5)
    assert first["samples_per_s"] == pytest.approx(4 / 2.5)
    assert first["step_time_s"] == pytest.approx(1.25)
    # the flush's read-back waits for the window's queued device work (2.0 -> 2.5): the last step's time
    assert first["step_time_max_s"] == pytest.approx(1.5)
    assert first["data_wait_share"] == pytest.approx(0.4 / 2.5)
    assert first["padding_efficiency"] == pytest.approx(8 / 13)
    assert first["mfu"] == pytest.approx(1000 * (8 / 2.5) / 1e6)
    assert first["eta_s"] == pytest.approx(8 * 1.25)
    assert first["elapsed_s"] == pytest.approx(2.5)
    assert first["peak_memory_mb"] > 0
    assert metrics.pending_steps == 0

    clock.now = 4.5  # the window restarts at the flush (2.5)
    metrics.update(loss_sum=torch.tensor(3.0), target_tokens=4, real_tokens=6, computed_tokens=6, samples=1)
    clock.now = 5.0
    second = metrics.flush(step=3)

    assert second["loss"] == pytest.approx(3 / 4)  # the sums were reset
    assert second["grad_norm"] is None  # none given in this window
    assert second["lr"] == 2e-3  # the last known value
    assert second["step_time_s"] == pytest.approx(2.5)
    assert second["step_time_max_s"] == pytest.approx(2.5)
    assert second["data_wait_share"] == 0
    assert second["padding_efficiency"] == 1
    assert second["eta_s"] == pytest.approx(7 * 2.5)
    assert second["elapsed_s"] == pytest.approx(5.0)
    # the steps' own times add up to the windows' wall clock: none of it lost at a flush (steady throughput)
    assert metrics.step_times == pytest.approx([1.0, 1.5, 2.5]) and sum(metrics.step_times) == 5.0

    frame = metrics.to_frame()
    assert list(frame["step"]) == [2, 3]
    assert list(frame["loss"]) == pytest.approx([2.0, 0.75])


def test_flush_without_steps_is_an_error():
    with pytest.raises(ValueError, match="no update"):
        StepMetrics("cpu").flush(step=0)


def test_mfu_is_none_on_cpu_without_a_known_peak():
    metrics = StepMetrics("cpu", flops_per_token=1000)
    metrics.update(loss_sum=1.0, target_tokens=1, real_tokens=1, computed_tokens=1, samples=1)
    assert metrics.flush(step=1)["mfu"] is None
    assert device_peak_flops("cpu") is None


def test_update_does_no_host_sync_and_flush_reads_back_once(monkeypatch):
    metrics = StepMetrics("cpu", total_steps=100)
    steps = [
        dict(
            loss_sum=torch.tensor(2.0, requires_grad=True) * 3,
            target_tokens=torch.tensor(3),
            real_tokens=torch.tensor(5),
            computed_tokens=torch.tensor(8),
            samples=torch.tensor(2),
            grad_norm=torch.tensor(0.5),
            lr=1e-3,
        ),
        dict(
            loss_sum=torch.tensor(4.0),
            target_tokens=5,
            real_tokens=7,
            computed_tokens=8,
            samples=2,
            grad_norm=0.25,
            lr=1e-3,
        ),
    ]

    def no_sync(*args, **kwargs):
        raise AssertionError("host sync in StepMetrics.update")

    with monkeypatch.context() as patch:
        for name in ("item", "cpu", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__"):
            patch.setattr(torch.Tensor, name, no_sync)
        with pytest.raises(AssertionError):
            torch.tensor(1.0).item()  # the trap works
        for step in steps:
            metrics.update(**step)

    original_tolist = torch.Tensor.tolist
    reads = []

    def counting_tolist(self):
        reads.append(self.shape)
        return original_tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counting_tolist)
    record = metrics.flush(step=2)
    assert len(reads) == 1  # one transfer for every sum
    assert record["loss"] == pytest.approx(10 / 8)
    assert record["grad_norm"] == pytest.approx(0.25)
    assert record["padding_efficiency"] == pytest.approx(12 / 16)


def test_flops_per_token_and_the_peak_flops_table(monkeypatch):
    assert flops_per_token(n_params=1000, n_layers=2, hidden_size=64, seq_len=128) == 6000 + 12 * 2 * 64 * 128
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name, peak in [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("Tesla T4", None),
    ]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=name: name)
        assert device_peak_flops("cuda") == peak, name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_update_does_not_synchronize_cuda():
    metrics = StepMetrics("cuda", total_steps=10)
    loss_sum = torch.tensor(3.0, device="cuda")
    count = torch.tensor(4, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            metrics.update(
                loss_sum=loss_sum,
                target_tokens=count,
                real_tokens=count,
                computed_tokens=8,
                samples=2,
                grad_norm=loss_sum,
                lr=1e-3,
            )
    finally:
        torch.cuda.set_sync_debug_mode("default")
    record = metrics.flush(step=3)
    assert record["loss"] == pytest.approx(0.75)
    assert record["peak_memory_mb"] > 0


def test_attended_length_is_the_per_document_span():
    from fastlm.engine.observe.metrics import attended_length, flops_per_token

    assert attended_length([4, 4]) == 4.0  # documents filling the rows: the usual figure
    assert attended_length([1, 3]) == (1 + 9) / 4
    assert flops_per_token(10, 2, 8, attended_length([2, 6])) < flops_per_token(10, 2, 8, 8)


@pytest.mark.parametrize(
    ("files", "limited"),
    [
        ({"memory.max": "8589934592\n"}, True),  # cgroup v2: a container's 8 GiB
        ({"memory.max": "max\n"}, False),  # v2, no limit
        ({"memory.limit_in_bytes": "8589934592\n"}, True),  # cgroup v1
        ({"memory.limit_in_bytes": "9223372036854771712\n"}, False),  # v1's "no limit"
        ({}, False),  # no cgroup files (not Linux, or not mounted)
    ],
    ids=["v2-limit", "v2-max", "v1-limit", "v1-unlimited", "none"],
)
def test_the_cpus_memory_is_the_containers_where_a_cgroup_limits_it(tmp_path, monkeypatch, files, limited):
    """On a CPU the device's memory is the memory this process may use: the host's RAM, or less where a
    cgroup limits it (a Docker ``--memory 8g`` container, a Kubernetes pod's limit on a large node). The
    tune's budget is a share of it (``tune.memory_headroom``) and the train summary's diagnosis reads it:
    with the host's RAM (here up to hundreds of GB) the tune's ladder climbed past the container's limit,
    where the kernel kills the process (SIGKILL, no word, nothing written) before any headroom stops it."""
    host = metrics_module.device_memory_mb("cpu")
    assert host is not None and host > 0
    paths = []
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    for name in ("memory.max", "memory.limit_in_bytes"):
        paths.append(tmp_path / name)
    monkeypatch.setattr(metrics_module, "CGROUP_MEMORY_LIMITS", tuple(str(path) for path in paths))
    expected = min(host, 8 * 1024.0) if limited else host
    assert metrics_module.device_memory_mb("cpu") == expected
    assert metrics_module.device_memory_mb(torch.device("cpu")) == expected
