"""setup_runtime: device, precision, threads, determinism and the record of what was applied.

setup_runtime changes process-wide torch state; the ``restore_global_state`` fixture puts every piece of it
back so that the other tests run as if nothing happened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random

import numpy as np
import pytest
import torch

from fastlm.engine.runtime import environment as runtime_module
from fastlm.engine.runtime.environment import (
    CUBLAS_DETERMINISTIC_WORKSPACE,
    Runtime,
    RuntimeConfig,
    resolve_precision,
    seed_everything,
    setup_runtime,
    usable_cpu_count,
)

ENV_SET_BY_SETUP = ("TOKENIZERS_PARALLELISM", "CUBLAS_WORKSPACE_CONFIG")


@pytest.fixture(autouse=True)
def restore_global_state():
    env = {key: os.environ.pop(key, None) for key in ENV_SET_BY_SETUP}  # each test starts without them
    saved = dict(
        threads=torch.get_num_threads(),
        deterministic=torch.are_deterministic_algorithms_enabled(),
        warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
        cudnn_benchmark=torch.backends.cudnn.benchmark,
        cudnn_deterministic=torch.backends.cudnn.deterministic,
        matmul_tf32=torch.backends.cuda.matmul.allow_tf32,
        cudnn_tf32=torch.backends.cudnn.allow_tf32,
        matmul_precision=torch.get_float32_matmul_precision(),
        flash_sdp=torch.backends.cuda.flash_sdp_enabled(),
        mem_efficient_sdp=torch.backends.cuda.mem_efficient_sdp_enabled(),
    )
    python_rng, numpy_rng = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=range(torch.cuda.device_count())):
        yield
    random.setstate(python_rng)
    np.random.set_state(numpy_rng)
    torch.set_num_threads(saved["threads"])
    mode = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    if mode != (saved["deterministic"], saved["warn_only"]):  # the call is slow the first time
        torch.use_deterministic_algorithms(saved["deterministic"], warn_only=saved["warn_only"])
    torch.backends.cudnn.benchmark = saved["cudnn_benchmark"]
    torch.backends.cudnn.deterministic = saved["cudnn_deterministic"]
    torch.backends.cuda.matmul.allow_tf32 = saved["matmul_tf32"]
    torch.backends.cudnn.allow_tf32 = saved["cudnn_tf32"]
    torch.set_float32_matmul_precision(saved["matmul_precision"])
    torch.backends.cuda.enable_flash_sdp(saved["flash_sdp"])
    torch.backends.cuda.enable_mem_efficient_sdp(saved["mem_efficient_sdp"])
    for key, value in env.items():
        os.environ.pop(key, None)
        if value is not None:
            os.environ[key] = value


cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU defaults")


@cpu_only
def test_defaults_on_cpu(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    runtime = setup_runtime(RuntimeConfig())

    assert runtime.device == torch.device("cpu")
    assert runtime.precision == "fp32" and runtime.autocast_dtype is None
    assert not runtime.grad_scaler and not runtime.make_grad_scaler().is_enabled()
    assert isinstance(runtime.autocast_context(), contextlib.nullcontext)
    assert runtime.tf32 is False  # a GPU feature, not applied on CPU
    assert runtime.sdpa_flash is None
    assert runtime.num_threads == usable_cpu_count() == torch.get_num_threads()
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false" == runtime.tokenizers_parallelism
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.benchmark is True


def test_describe_is_a_flat_dict_of_plain_values():
    runtime = setup_runtime(RuntimeConfig(device="cpu", num_threads=1))
    described = runtime.describe()
    assert all(isinstance(v, str | int | float | bool | type(None)) for v in described.values())
    assert described["device"] == "cpu"
    assert described["precision"] == "fp32"
    assert described["num_threads"] == 1
    assert {
        "tf32",
        "cudnn_benchmark",
        "deterministic",
        "compile",
        "seed",
        "torch_version",
        "float32_matmul_precision",
        "sdpa_flash",
    } <= described.keys()
    with pytest.raises(dataclasses.FrozenInstanceError):
        runtime.precision = "bf16"


def test_explicit_thread_count_is_applied():
    setup_runtime(RuntimeConfig(device="cpu", num_threads=1))
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize(("omp", "expected"), [("1", 1), ("3", 3), ("2,1", 2), ("0", None), ("many", None)])
def test_omp_num_threads_set_by_the_user_is_the_default_thread_count(monkeypatch, omp, expected):
    """OMP_NUM_THREADS set to share a machine between runs (two trainings, a training beside a test suite):
    the run took every usable core anyway (torch.set_num_threads over what torch read at import). A positive
    count is kept (a nested list: its first level); a value that is no count is left for the usable cores.
    train.runtime.num_threads still wins."""
    monkeypatch.setenv("OMP_NUM_THREADS", omp)
    runtime = setup_runtime(RuntimeConfig(device="cpu"))
    assert runtime.num_threads == (expected or usable_cpu_count()) == torch.get_num_threads()
    assert setup_runtime(RuntimeConfig(device="cpu", num_threads=2)).num_threads == 2


def test_user_setting_of_tokenizers_parallelism_is_kept(monkeypatch):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    assert setup_runtime(RuntimeConfig(device="cpu")).tokenizers_parallelism == "true"


def test_deterministic_mode(caplog):
    with caplog.at_level(logging.WARNING, logger=runtime_module.__name__):
        runtime = setup_runtime(RuntimeConfig(device="cpu", deterministic=True, cudnn_benchmark=True, seed=7))
    first = torch.rand(3)

    assert runtime.deterministic and not runtime.cudnn_benchmark
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.benchmark is False and torch.backends.cudnn.deterministic is True
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_DETERMINISTIC_WORKSPACE
    assert "bitwise reproducib" in caplog.text and "speed" in caplog.text

    setup_runtime(RuntimeConfig(device="cpu", deterministic=True, seed=7))
    assert torch.equal(torch.rand(3), first)  # seeded


def test_seed_everything_seeds_python_numpy_and_torch():
    seed_everything(123)
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    seed_everything(123)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


def test_bf16_autocast_on_cpu_when_asked():
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="bf16"))
    assert runtime.precision == "bf16" and not runtime.grad_scaler
    with runtime.autocast_context():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


def test_precision_resolution_on_cuda_without_a_gpu(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert resolve_precision("auto", cuda) == "bf16"
    assert resolve_precision("fp16", cuda) == "fp16"
    assert resolve_precision("fp32", cuda) == "fp32"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert resolve_precision("auto", cuda) == "fp16"  # emulated bf16 is slow: fp16 + GradScaler
    with pytest.raises(RuntimeError, match="native bf16"):
        resolve_precision("bf16", cuda)


def test_grad_scaler_is_enabled_only_for_fp16():
    def runtime_with(precision: str) -> Runtime:
        return Runtime(
            device=torch.device("cpu"),
            device_name="cpu",
            precision=precision,
            grad_scaler=precision == "fp16",
            tf32=False,
            cudnn_benchmark=False,
            sdpa_flash=None,
            sdpa_mem_efficient=None,
            deterministic=False,
            compile=False,
            num_threads=1,
            seed=0,
            tokenizers_parallelism="false",
            torch_version=torch.__version__,
            cuda_version=None,
        )

    assert runtime_with("fp16").autocast_dtype == torch.float16
    assert runtime_with("fp16").grad_scaler and not runtime_with("bf16").grad_scaler


@pytest.mark.parametrize(
    "config, error",
    [
        (dict(precision="fp16", device="cpu"), RuntimeError),
        (dict(precision="int8"), ValueError),
        (dict(device="tpu"), ValueError),
        (dict(num_threads=0), ValueError),
    ],
)
def test_invalid_settings_are_rejected(config, error):
    with pytest.raises(error):
        setup_runtime(RuntimeConfig(**config))


@cpu_only
def test_cuda_without_a_gpu_is_an_error():
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        setup_runtime(RuntimeConfig(device="cuda"))


def test_compile_model_is_the_identity_when_compile_is_off():
    model = torch.nn.Linear(2, 2)
    assert setup_runtime(RuntimeConfig(device="cpu")).compile_model(model) is model


def test_usable_cpu_count_is_within_the_machine():
    assert 1 <= usable_cpu_count() <= (os.cpu_count() or 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_speed_flags():
    runtime = setup_runtime(RuntimeConfig(device="cuda"))
    assert runtime.device.type == "cuda"
    assert runtime.tf32 and torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert torch.get_float32_matmul_precision() == "high"
    assert runtime.sdpa_flash and runtime.sdpa_mem_efficient
    native_bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
    assert runtime.precision == ("bf16" if native_bf16 else "fp16")
    assert runtime.grad_scaler == (runtime.precision == "fp16")
    with runtime.autocast_context():
        out = torch.ones(8, 8, device="cuda") @ torch.ones(8, 8, device="cuda")
    assert out.dtype == runtime.autocast_dtype


def test_compile_auto_is_on_for_cuda_and_off_on_cpu():
    from fastlm.engine.runtime.environment import resolve_compile

    assert resolve_compile("auto", torch.device("cuda")) is True
    assert resolve_compile("auto", torch.device("cpu")) is False
    assert (
        resolve_compile(True, torch.device("cpu")) is True
        and resolve_compile(False, torch.device("cuda")) is False
    )
    assert setup_runtime(RuntimeConfig(device="cpu")).compile is False  # the default, resolved
    with pytest.raises(ValueError, match="compile"):
        RuntimeConfig(compile="sometimes")


def test_the_validated_train_runtime_parameters_are_applied_as_they_are():
    """The node hands ``train.runtime`` (validated once by the parameter hook) and ``train.seed`` straight
    in."""
    from fastlm.engine.config import parse_train_params

    params = parse_train_params(
        {"seed": 7, "runtime": {"device": "cpu", "precision": "bf16", "num_threads": 1}}
    )
    runtime = setup_runtime(params.runtime, seed=params.seed)
    assert (runtime.device.type, runtime.precision, runtime.num_threads, runtime.seed) == (
        "cpu",
        "bf16",
        1,
        7,
    )
    assert torch.get_num_threads() == 1
    first = torch.rand(3)
    setup_runtime(params.runtime, seed=7)
    assert torch.equal(torch.rand(3), first)  # seeded with train.seed
    assert setup_runtime(params.runtime).seed == 0  # RuntimeParams has no seed of its own


@pytest.mark.parametrize(
    ("precision", "compile_", "provisional"),
    [
        ("auto", "auto", ["precision=fp32 (auto:", "compile=False (auto:"]),
        ("auto", False, ["precision=fp32 (auto:"]),
        ("fp32", "auto", ["compile=False (auto:"]),
        ("fp32", False, []),
        # not a training run: nothing measures them later, the values are the settled ones
        ("auto", "auto", None),
    ],
)
def test_the_runtime_line_says_which_cpu_choices_the_first_micro_batch_still_settles(
    caplog, precision, compile_, provisional
):
    """On CPU, ``auto`` precision and compile are measured on the first micro-batch (runtime_probe): the
    runtime line must not state fp32 / no compile as settled when a later line may pick bf16 / compile."""
    with caplog.at_level(logging.INFO, logger=runtime_module.__name__):
        setup_runtime(
            RuntimeConfig(device="cpu", precision=precision, compile=compile_, num_threads=1),
            measured_later=provisional is not None,
        )
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("runtime: "))
    for part in provisional or []:
        assert part in line and "first micro-batch" in line
    if not provisional:
        assert "(auto:" not in line and "precision=fp32," in line


def test_a_runtime_an_earlier_node_said_is_logged_at_debug_only(caplog):
    """The report's generations apply the runtime its evaluation applied and logged: the line once at INFO."""
    config = RuntimeConfig(device="cpu", precision="fp32", compile=False, num_threads=1)
    with caplog.at_level(logging.DEBUG, logger=runtime_module.__name__):
        first = setup_runtime(config)
        again = setup_runtime(config, said=True)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.getMessage().startswith("runtime: ")]
    assert [level for level, _ in lines] == [logging.INFO, logging.DEBUG]
    assert lines[0][1] == lines[1][1] and again == first
