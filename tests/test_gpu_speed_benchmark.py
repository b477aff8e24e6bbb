"""benchmarks/gpu_speed.py stays runnable without a GPU: ``--help`` works on CPU, the contender list holds
the LoRA/QLoRA pairs (fastlm and Trainer + peft, usual and best), and the adapter flags reach every child."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
ADAPTERS = [
    "fastlm_lora",
    "fastlm_qlora",
    "trainer_lora_usual",
    "trainer_lora_best",
    "trainer_qlora_usual",
    "trainer_qlora_best",
]


@pytest.fixture()
def gpu_speed(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_speed

    return gpu_speed


def test_help_runs_on_cpu_and_lists_the_adapter_contenders():
    shown = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_speed.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert all(name in shown for name in ADAPTERS) and "--adapters" in shown and "--checkpointing" in shown


def test_adapters_select_the_adapter_contenders_and_their_settings_reach_the_children(gpu_speed, monkeypatch):
    assert list(gpu_speed.ADAPTER_CONTENDERS) == ADAPTERS and set(ADAPTERS) <= set(gpu_speed.CONTENDERS)
    args = gpu_speed.parse_args(["--adapters", "--checkpointing", "selective", "--optim", "paged_adamw_8bit"])
    assert args.adapters and args.checkpointing == "selective" and args.optim == "paged_adamw_8bit"
    seen = {}
    monkeypatch.setattr(gpu_speed, "run_contender", lambda *a, extra_args, **k: seen.update(args=extra_args))
    gpu_speed.run_child("fastlm_lora", args, Path("."), 0)
    passed = seen["args"]
    assert passed[passed.index("--checkpointing") + 1] == "selective"
    assert passed[passed.index("--optim") + 1] == "paged_adamw_8bit"


def test_the_liger_and_fused_linear_flags_reach_the_children_and_the_parameters(gpu_speed, monkeypatch):
    from types import SimpleNamespace

    args = gpu_speed.parse_args(
        ["--model", "tiny", "--liger", "off", "--fused-linear", "on", "--threads", "1"]
    )
    seen = {}
    monkeypatch.setattr(gpu_speed, "run_contender", lambda *a, extra_args, **k: seen.update(args=extra_args))
    gpu_speed.run_child("fastlm_eager", args, Path("."), 0)
    passed = seen["args"]
    assert passed[passed.index("--liger") + 1] == "off" and passed[passed.index("--fused-linear") + 1] == "on"
    ctx = SimpleNamespace(args=SimpleNamespace(**{**vars(args), "workdir": "."}), attn="sdpa", device="cpu")
    params = gpu_speed.fastlm_params(ctx, compile_=False, max_steps=1, log_every=1, name="x")
    assert params.model.liger == "off" and params.loss.fused_linear_kernel == "fastlm"
    assert params.loss.fused_linear is True
    assert gpu_speed.parse_args([]).liger == "auto"  # default: liger where CUDA and liger-kernel are
