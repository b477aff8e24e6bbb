"""bf16 LoRA adapters with fp32 masters (``train.runtime.param_dtype``, engine/train/master_weights.py).

Under bf16 autocast an fp32 adapter is cast to bf16 in every micro-batch's forward and its bf16 gradient cast
back in the backward: two dispatched ops per adapter matrix and micro-batch (392 each way for the 7
projections of a 28-layer model), host work that left an H200 waiting for the host in a 3B LoRA step
(docs/gpu-runs/2026-11-27-h200-gpu_speed_lora.log). With bf16 adapters the forward casts nothing, each
micro-batch's bf16 gradients move into the fp32 masters' sums in one foreach op, the optimizer updates the
masters and one foreach copy publishes them: the same values in every matmul, the same fp32 sums."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fastlm.engine.config import LoraParams, parse_train_params
from fastlm.engine.model.lora import apply_lora
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from fastlm.engine.train.master_weights import MasterWeights, choose_param_dtype
from fastlm.engine.train.step import make_optimization, train_step
from tests.support.lora_checks import nonzero_lora_b, token_batch
from tests.support.tolerances import TRAINED_FP32_LOSS_REL, TRAINED_FP32_WEIGHTS
from tests.support.toy_training import VOCAB, run_toy, toy_model, toy_params

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too

ROWS, TOKENS = 2, 24


def _runtime():
    return setup_runtime(RuntimeConfig(device="cpu", precision="bf16", compile=False, num_threads=1))


def _params(param_dtype: str, **lora):
    return parse_train_params(
        {
            "runtime": {"device": "cpu", "precision": "bf16", "param_dtype": param_dtype, "float8": "off"},
            "model": {"lora": {"enabled": True, **lora}},
            "loss": {"fused_linear": False},
            "optimizer": {"lr": 1e-2, "warmup_steps": 0},
        }
    )


def _adapted(seed: int = 0, dropout: float = 0.0):
    model = apply_lora(
        toy_model(seed), LoraParams(enabled=True, r=4, alpha=8, dropout=dropout), gradient_checkpointing=False
    )
    nonzero_lora_b(model)
    return model


def _trainable(model) -> dict[str, torch.nn.Parameter]:
    return {name: param for name, param in model.named_parameters() if param.requires_grad}


class _Casts(TorchDispatchMode):
    """The shapes of the tensors cast by ``aten._to_copy``."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket is torch.ops.aten._to_copy:
            self.shapes.append(tuple(args[0].shape))
        return func(*args, **(kwargs or {}))


def _adapter_casts(param_dtype: str) -> tuple[int, int]:
    """(casts of adapter-shaped tensors in one step of 2 micro-batches, adapter matrices)."""
    runtime = _runtime()
    model = _adapted()
    opt = make_optimization(model, _params(param_dtype), runtime, total_steps=2)
    shapes = {tuple(param.shape) for param in _trainable(model).values()}
    batches = [token_batch(VOCAB, TOKENS, rows=ROWS, seed=seed) for seed in range(2)]
    train_step(model, batches, opt, runtime=runtime)  # the first step (optimizer state made) is not counted
    with _Casts() as casts:
        train_step(model, batches, opt, runtime=runtime)
    return sum(shape in shapes for shape in casts.shapes), len(_trainable(model))


def test_bf16_adapters_are_cast_in_no_micro_batch():
    ours, adapters = _adapter_casts("bf16")
    autocast, _ = _adapter_casts("fp32")
    assert autocast >= 2 * 2 * adapters  # each matrix cast in each micro-batch's forward, its gradient back
    assert ours == 0


def _run(param_dtype: str, model, steps: int = 3, micro_batches: int = 2):
    runtime = _runtime()
    opt = make_optimization(model, _params(param_dtype), runtime, total_steps=steps)
    losses = []
    for step in range(steps):
        batches = [token_batch(VOCAB, TOKENS, rows=ROWS, seed=10 * step + i) for i in range(micro_batches)]
        result = train_step(model, batches, opt, runtime=runtime)
        losses.append(float(result.loss_sum / result.target_tokens))
    return opt, losses


def test_bf16_adapters_train_as_fp32_adapters_under_autocast_and_the_run_returns_fp32():
    """The same bf16 operands in every matmul (the masters' bf16 copy is autocast's cast of the fp32
    adapter) and the same fp32 sums of the micro-batches' bf16 gradients: the same losses and weights up to
    fp32 reordering."""
    model = _adapted()
    reference = copy.deepcopy(model)
    opt, losses = _run("bf16", model)
    reference_opt, reference_losses = _run("fp32", reference)

    assert isinstance(opt.masters, MasterWeights) and "bf16 adapters" in opt.param_dtype_choice
    assert reference_opt.masters is None
    assert {param.dtype for param in _trainable(model).values()} == {torch.bfloat16}
    for ours, theirs in zip(losses, reference_losses, strict=True):
        assert abs(ours - theirs) <= TRAINED_FP32_LOSS_REL * abs(theirs)
    opt.release()  # what the run does before it returns the model
    expected = _trainable(reference)
    for name, param in _trainable(model).items():
        assert param.dtype == torch.float32, name
        torch.testing.assert_close(param.detach(), expected[name].detach(), **TRAINED_FP32_WEIGHTS, msg=name)
    frozen = [param for param in model.parameters() if not param.requires_grad]
    assert frozen and all(param.dtype == next(iter(frozen)).dtype for param in frozen)  # base untouched


def test_a_probe_backward_before_the_first_step_leaves_nothing_in_the_masters():
    """The runtime probe runs a forward and backward outside any step (engine/runtime/probe.py): its bf16
    gradients must not be added to the first step's."""
    runtime = _runtime()
    model = _adapted()
    reference = copy.deepcopy(model)
    opt = make_optimization(model, _params("bf16"), runtime, total_steps=2)
    reference_opt = make_optimization(reference, _params("bf16"), runtime, total_steps=2)
    with runtime.autocast_context():
        model(**token_batch(VOCAB, TOKENS, rows=ROWS, seed=99)).loss.backward()
    batch = [token_batch(VOCAB, TOKENS, rows=ROWS, seed=0)]
    train_step(model, batch, opt, runtime=runtime)
    train_step(reference, batch, reference_opt, runtime=runtime)
    ours, theirs = _trainable(model), _trainable(reference)
    for name, param in ours.items():
        expected = reference_opt.masters.master_of(theirs[name])
        torch.testing.assert_close(opt.masters.master_of(param), expected, **TRAINED_FP32_WEIGHTS)


def test_auto_takes_bf16_adapters_on_a_gpu_and_keeps_fp32_ones_on_a_cpu():
    model = _adapted()
    bf16, one = torch.bfloat16, {"world_size": 1, "adapters": True}
    dtype, why = choose_param_dtype("auto", model, autocast_dtype=bf16, device="cuda", **one)
    assert dtype is bf16 and "bf16 adapters" in why
    dtype, why = choose_param_dtype("auto", model, autocast_dtype=bf16, device="cpu", **one)
    assert dtype is None and "param_dtype auto" in why
    assert choose_param_dtype("bf16", model, autocast_dtype=bf16, device="cpu", **one)[0] is bf16
    sharded = {"world_size": 2, "strategy": "fsdp", "adapters": True}
    assert choose_param_dtype("auto", model, autocast_dtype=bf16, device="cuda", **sharded)[0] is None
    assert (
        parse_train_params(
            {"runtime": {"param_dtype": "bf16"}, "model": {"lora": {"enabled": True}}}
        ).runtime.param_dtype
        == "bf16"
    )


@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["no_dropout", "dropout"])
def test_a_lora_run_with_bf16_adapters_resumes_exactly_and_returns_fp32_adapters(tmp_path, dropout):
    """Checkpoints hold the fp32 masters (``MasterWeights.full_precision``), a resumed run continues as the
    straight one (deterministic mode: the same computation twice, bitwise; with LoRA dropout the same masks),
    the run returns fp32 adapters."""

    def params(folder, **overrides):
        return toy_params(
            folder,
            runtime={"precision": "bf16", "param_dtype": "bf16", "deterministic": True},
            model={"lora": {"enabled": True, "r": 4, "alpha": 8, "dropout": dropout}},
            log_every=1,
            save_every=2,
            eval_every=None,
            max_steps=6,
            **overrides,
        )

    straight = run_toy(params(tmp_path / "a"), model=_adapted(dropout=dropout), attn="eager")  # run_toy: bf16
    assert "bf16 adapters" in straight.summary["param_dtype"]
    assert {p.dtype for p in _trainable(straight.model).values()} == {torch.float32}

    def interrupt(kind, record):
        if record["step"] == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_toy(params(tmp_path / "b"), callbacks=[interrupt], model=_adapted(dropout=dropout), attn="eager")
    resumed = run_toy(params(tmp_path / "b", resume="auto"), model=_adapted(dropout=dropout), attn="eager")
    assert str(resumed.summary["resumed_from"]).endswith("checkpoint-00000002")
    assert resumed.history[-1]["loss"] == straight.history[-1]["loss"]
    theirs = _trainable(resumed.model)
    for name, param in _trainable(straight.model).items():
        assert theirs[name].dtype == torch.float32 and torch.equal(param, theirs[name]), name


class _ForeachDtypes(TorchDispatchMode):
    """The dtypes of each ``_foreach_*`` op's tensor lists."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, set]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket).removeprefix("aten.")
        if name.startswith("_foreach_"):
            lists = [arg for arg in args if isinstance(arg, (list, tuple))]
            self.calls.append((name, {t.dtype for items in lists for t in items}))
        return func(*args, **(kwargs or {}))


def test_later_micro_batches_add_into_the_masters_with_one_dtype_per_foreach_op():
    """On CUDA a foreach op over lists of two dtypes leaves its fused kernel for one launch per tensor (392
    adds per micro-batch on the 3B shape); ``_foreach_copy_`` converts dtypes inside its fused kernel. So a
    later micro-batch's bf16 gradients are copied into fp32 and added fp32 to fp32."""
    runtime = _runtime()
    model = _adapted()
    opt = make_optimization(model, _params("bf16"), runtime, total_steps=2)
    batches = [token_batch(VOCAB, TOKENS, rows=ROWS, seed=seed) for seed in range(3)]
    with _ForeachDtypes() as seen:
        train_step(model, batches, opt, runtime=runtime)
    adds = [dtypes for name, dtypes in seen.calls if name == "_foreach_add_"]
    assert len(adds) >= 2  # the second and third micro-batches
    assert all(dtypes == {torch.float32} for dtypes in adds), adds
