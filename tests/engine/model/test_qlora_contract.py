"""QLoRA's calling contract, on CPU: the base loads with an NF4 ``BitsAndBytesConfig`` (double quantization,
bf16 compute), the 4-bit base is prepared with the checkpointing policy (``selective`` survives it) and
keeps its frozen matrices in the compute dtype, the runtime trains in bf16 without a GradScaler (on a GPU
without native bf16: fp16 4-bit compute and a GradScaler that unscales fp32 adapters only), and the fused
linear loss stays on for a 128k vocabulary.

A patched ``torch.cuda`` stands in for the GPU, and the weights are not quantized (``from_pretrained`` runs
without the quantization arguments it was handed): what is checked is what fastlm asks of a GPU.
test_qlora_forward.py and test_lora.py run real NF4 weights through bitsandbytes' CPU backend; the quantized
GPU run is ``benchmarks/gpu_speed.py --contenders fastlm_qlora``."""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from fastlm.engine import config as engine_config
from fastlm.engine.config import parse_train_params
from fastlm.engine.model import lora, pretrained
from fastlm.engine.model.build import build_model
from fastlm.engine.model.linear_loss import fused_head_choice
from fastlm.engine.model.recompute import checkpointed_layers, enable_checkpointing
from fastlm.engine.runtime import environment
from tests.support.tiny_llama import llama_style_tokenizer, save_tiny_llama

TEXTS = [f"sample {index} of the qlora contract, word {index * 7 % 13}" for index in range(60)]


@pytest.fixture
def fake_cuda_with_bitsandbytes(monkeypatch):
    """A machine that has CUDA and bitsandbytes, as far as fastlm's checks go. No ``bitsandbytes`` module is
    put in ``sys.modules``: peft and transformers would then take it for the real one (and cache that). The
    real one, where installed, is imported first, on this CPU: imported first under the faked CUDA it loaded
    its CUDA backend and failed (``torch._C`` has no ``_cuda_getCurrentRawStream``), so this file failed run
    alone and passed only after another file had imported it."""
    with contextlib.suppress(ImportError):
        import bitsandbytes  # noqa: F401
    monkeypatch.setattr(engine_config, "bitsandbytes_missing", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


@pytest.mark.parametrize(
    ("policy", "checkpointed"), [("selective", [0, 2]), ("full", [0, 1, 2, 3]), ("off", [])]
)
def test_qlora_loads_nf4_with_bf16_compute_and_prepares_with_the_policy(
    tmp_path, monkeypatch, fake_cuda_with_bitsandbytes, policy, checkpointed
):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)  # an A100
    tokenizer = llama_style_tokenizer(TEXTS, vocab_size=300)
    base = save_tiny_llama(tmp_path / "base", tokenizer, layers=4)
    loads: list[dict] = []
    real_load = pretrained.load_pretrained

    def load(checkpoint, **kwargs):
        loads.append(kwargs)
        kwargs = {
            key: value for key, value in kwargs.items() if key not in ("quantization_config", "device_map")
        }
        return real_load(checkpoint, **{**kwargs, "dtype": torch.float32})  # not quantized on CPU

    monkeypatch.setattr(pretrained, "load_pretrained", load)
    params = parse_train_params(
        {
            "model": {
                "name_or_path": str(base),
                "gradient_checkpointing": policy,
                "lora": {"enabled": True, "load_in_4bit": True, "r": 4},
            }
        }
    ).model
    model = build_model(params, tokenizer, max_length=64, attn_implementation="sdpa")

    quantization = loads[0]["quantization_config"]
    assert quantization.load_in_4bit and quantization.bnb_4bit_quant_type == "nf4"
    assert quantization.bnb_4bit_use_double_quant and quantization.bnb_4bit_compute_dtype == torch.bfloat16
    assert loads[0]["dtype"] == torch.bfloat16 and loads[0]["device_map"] == {"": 0}
    assert checkpointed_layers(model) == checkpointed  # selective is not widened to full by the preparation
    assert any("lora_A" in name for name, p in model.named_parameters() if p.requires_grad)


def test_qlora_runtime_is_bf16_without_a_grad_scaler(monkeypatch, fake_cuda_with_bitsandbytes):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "fake H100")
    before = torch.get_float32_matmul_precision()
    try:
        runtime = environment.setup_runtime(environment.RuntimeConfig(device="cuda", precision="auto"))
    finally:
        torch.set_float32_matmul_precision(before)
    assert runtime.precision == "bf16" and runtime.autocast_dtype == torch.bfloat16
    assert runtime.grad_scaler is False and not runtime.make_grad_scaler().is_enabled()


def test_the_fused_linear_loss_stays_on_for_a_128k_vocabulary_under_qlora(fake_cuda_with_bitsandbytes):
    config = LlamaConfig(
        vocab_size=128_256,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        model = LlamaForCausalLM(config)
    enable_checkpointing(model, "full")
    raw = {"model": {"lora": {"enabled": True, "load_in_4bit": True, "r": 4}}}
    settings = parse_train_params(raw).model.lora
    adapted = lora.apply_lora(model, settings, gradient_checkpointing="full")
    head, why = fused_head_choice(adapted, "auto")
    assert head is adapted.get_base_model().lm_head and "128,256" in why  # LoRA adapts projections only


@pytest.fixture
def gpu_without_native_bf16(monkeypatch, fake_cuda_with_bitsandbytes):
    """A T4 / V100 as torch's capability queries describe it: bf16 only emulated, no bf16 tensor cores."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "fake T4")


def test_qlora_on_a_gpu_without_native_bf16_computes_in_fp16_under_a_grad_scaler(gpu_without_native_bf16):
    """Not refused: the 4-bit matmuls compute in fp16 (emulated bf16 would be slow and would disagree with
    the fp16 autocast the runtime picks), the runtime trains in fp16 with a GradScaler."""
    settings = parse_train_params({"model": {"lora": {"enabled": True, "load_in_4bit": True}}}).model.lora
    kwargs = lora.load_kwargs(settings)
    assert kwargs["quantization_config"].bnb_4bit_compute_dtype == torch.float16
    assert kwargs["dtype"] == torch.float16
    plain = parse_train_params({"model": {"lora": {"enabled": True}}}).model.lora
    assert lora.base_dtype(plain) == torch.float32  # emulated bf16 does not count for the frozen base either
    before = torch.get_float32_matmul_precision()
    try:
        runtime = environment.setup_runtime(environment.RuntimeConfig(device="cuda", precision="auto"))
    finally:
        torch.set_float32_matmul_precision(before)
    assert runtime.precision == "fp16" and runtime.grad_scaler is True


def test_the_grad_scaler_unscales_only_the_fp32_adapters_over_a_half_precision_base():
    """The fp16 step's contract: peft keeps the adapters fp32 over an fp16 frozen base and the optimizer holds
    only the trainable parameters, so ``GradScaler.unscale_`` (which refuses fp16 gradients) sees fp32 ones,
    finite, and divides exactly those by the scale."""
    from fastlm.engine.model.accumulation import accumulate_gradients
    from fastlm.engine.train.optim import make_optimizer

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=32,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).to(torch.float16)
    settings = parse_train_params({"model": {"lora": {"enabled": True, "r": 4, "dropout": 0}}}).model.lora
    adapted = lora.apply_lora(model, settings, gradient_checkpointing="off")
    optimizer = make_optimizer(adapted, parse_train_params({}).optimizer)
    held = [p for group in optimizer.param_groups for p in group["params"]]
    assert held and all(p.requires_grad and p.dtype == torch.float32 for p in held)
    frozen = [p for p in adapted.parameters() if not p.requires_grad]
    assert frozen and all(p.dtype == torch.float16 for p in frozen)
    ids = torch.arange(3, 19).reshape(2, 8)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    scale = 2.0**8
    scaler = torch.amp.GradScaler("cpu", init_scale=scale)
    accumulate_gradients(
        adapted, [batch], autocast=lambda: torch.autocast("cpu", dtype=torch.float16), grad_scaler=scaler
    )
    scaled = [p.grad.clone() for p in held]
    assert all(p.grad is None for p in frozen)
    scaler.unscale_(optimizer)  # raises on an fp16 gradient
    assert all(torch.isfinite(param.grad).all() for param in held)  # no skipped step
    for before, param in zip(scaled, held, strict=True):
        assert torch.equal(param.grad, before * (1 / scale))  # a power of two: the division is exact
    assert any(before.abs().sum() > 0 for before in scaled)


def test_qlora_keeps_frozen_matrices_in_the_compute_dtype_and_trains_in_fp32(fake_cuda_with_bitsandbytes):
    """peft's ``prepare_model_for_kbit_training`` casts every 16-bit parameter that is not 4-bit to fp32: a
    Llama-3.2-3B's 128,256 x 3,072 embedding (tied head) grows from 0.79 to 1.58 GB, and the fused head then
    multiplies in fp32. fastlm keeps everything frozen (embedding, head, norms: fp32 norms would turn the
    activations fp32, test_qlora_forward.py) in the compute dtype, and trains every trainable parameter
    (adapters, ``modules_to_save``) in fp32; a bf16-autocast step over it gives finite fp32 gradients to
    those only."""
    from fastlm.engine.model.accumulation import accumulate_gradients

    model = _bf16_llama(tie_word_embeddings=False)
    raw = {"model": {"lora": {"enabled": True, "load_in_4bit": True, "r": 4, "modules_to_save": ["lm_head"]}}}
    adapted = lora.apply_lora(model, parse_train_params(raw).model.lora, gradient_checkpointing="full")
    base = adapted.get_base_model()
    assert (
        base.model.embed_tokens.weight.dtype == torch.bfloat16
        and not base.model.embed_tokens.weight.requires_grad
    )
    frozen = {name: p for name, p in adapted.named_parameters() if not p.requires_grad}
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen.values())
    trainable = {name: p for name, p in adapted.named_parameters() if p.requires_grad}
    assert any("lm_head" in name for name in trainable) and any("lora_A" in name for name in trainable)
    assert all(p.dtype == torch.float32 for p in trainable.values()), {
        name: p.dtype for name, p in trainable.items()
    }
    assert checkpointed_layers(base) == [0, 1]
    ids = torch.arange(3, 19).reshape(2, 8)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    loss, _ = accumulate_gradients(
        adapted, [batch], autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    )
    assert torch.isfinite(loss)
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in trainable.values())
    assert all(torch.isfinite(p.grad).all() for p in trainable.values())
    assert all(p.grad is None for p in frozen.values())


def test_the_adapters_log_line_says_a_qlora_run_is_one(fake_cuda_with_bitsandbytes, caplog):
    """The line that says what was adapted read ``LoRA r=4 alpha=8 adapting ...`` for a QLoRA run too:
    nothing in the run's log said its base was 4-bit. It names the 4-bit NF4 base."""
    import logging

    lines = {}
    for four_bit in (True, False):
        model = _bf16_llama()
        raw = {"model": {"lora": {"enabled": True, "load_in_4bit": four_bit, "r": 4}}}
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="fastlm.engine.model.lora"):
            lora.apply_lora(model, parse_train_params(raw).model.lora, gradient_checkpointing="full")
        lines[four_bit] = next(message for message in caplog.messages if " r=4 " in message)
    assert lines[True].startswith("LoRA on a 4-bit NF4 base (QLoRA) r=4 "), lines[True]
    assert lines[False].startswith("LoRA r=4 "), lines[False]


def _bf16_llama(**config) -> LlamaForCausalLM:
    """A two-layer Llama in bf16, as the 4-bit load leaves what it does not quantize (seed 0)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return LlamaForCausalLM(
            LlamaConfig(
                vocab_size=96,
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                max_position_embeddings=32,
                **config,
            )
        ).to(torch.bfloat16)
