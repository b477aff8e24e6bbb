"""tune.memory_limit_gb: tune for a smaller card than the one at hand (e.g. a 24 GB budget on an 80 GB GPU).
The ladder's budget is the limit, and on CUDA the process is capped to it
(``torch.cuda.set_per_process_memory_fraction``) so that the trials meet the out-of-memory and allocator-retry
behaviour of that card, not of the bigger one."""

import pytest
import torch

from fastlm.engine.train import tune
from fastlm.errors import ConfigError
from fastlm.pipelines.tune.params import parse_tune_params


def test_no_limit_keeps_the_devices_own_memory():
    assert tune.memory_budget_mb(torch.device("cpu"), None, total_mb=4096.0) == 4096.0


def test_a_limit_below_the_device_is_the_budget_on_cpu_without_touching_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda *a, **k: pytest.fail("CUDA"))
    assert tune.memory_budget_mb(torch.device("cpu"), 2.0, total_mb=4096.0) == 2048.0


def test_on_cuda_the_process_is_capped_to_the_limit(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: calls.append((f, d)))
    device = torch.device("cuda", 0)
    assert tune.memory_budget_mb(device, 24.0, total_mb=80 * 1024.0) == 24 * 1024.0
    assert calls == [(pytest.approx(24 / 80), device)]


def test_a_limit_above_the_device_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"tune\.memory_limit_gb = 96.*80\.0 GB") as error:
        tune.memory_budget_mb(torch.device("cpu"), 96.0, total_mb=80 * 1024.0)
    assert "\n" not in str(error.value)


def test_the_parameter_is_validated():
    assert parse_tune_params({"memory_limit_gb": 24}).memory_limit_gb == 24.0
    with pytest.raises(ConfigError, match="tune.memory_limit_gb"):
        parse_tune_params({"memory_limit_gb": 0})
