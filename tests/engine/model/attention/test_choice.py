"""What ``attention.choice`` picks: ``auto`` by the installed kernels and the precision, half-precision
kernels refused in fp32 in one line, and SDPA meanwhile for generation on a packed-only varlen model."""

from __future__ import annotations

import pytest
import torch

from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from tests.support.packed_attention import EOS, PAD, SAMPLES, packed_model


@pytest.mark.parametrize("attn", ["torch_varlen", "flash_attention_2"])
def test_half_precision_kernels_are_refused_in_fp32_on_cuda_with_a_clear_message(attn):
    from fastlm.engine.model.attention.choice import choose_attention
    from fastlm.errors import ConfigError

    with pytest.raises(ConfigError, match=f"{attn} runs in bf16 or fp16 only.*runtime.precision") as refused:
        choose_attention(attn, torch.device("cuda"), "fp32")
    assert "\n" not in str(refused.value)
    assert choose_attention(attn, torch.device("cuda"), "bf16") == attn


def test_generation_on_a_torch_varlen_model_uses_sdpa_and_puts_it_back():
    """Generation (KV cache, left padding) cannot use the packed-only varlen path: it runs on SDPA
    meanwhile."""
    from fastlm.engine.evaluate.generation import generate_continuations

    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))
    prompts = [SAMPLES[0][:4].tolist(), SAMPLES[3][:7].tolist()]
    outputs = {}
    for attn in ("sdpa", "torch_varlen", "sdpa_varlen"):
        model = packed_model(attn)
        outputs[attn] = generate_continuations(
            model, prompts, pad_id=PAD, eos_id=EOS, runtime=runtime, max_new_tokens=4
        ).continuations
        assert model.config._attn_implementation == attn
    assert outputs["torch_varlen"] == outputs["sdpa"] == outputs["sdpa_varlen"]


def test_auto_prefers_varlen_then_flex_then_dense_and_logs_why(monkeypatch, caplog):
    import importlib.util
    import logging

    from fastlm.engine.model.attention import choice

    installed: set[str] = set()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name in installed else None)
    monkeypatch.setattr(choice, "torch_varlen_available", lambda device: "torch" in installed)
    cuda = torch.device("cuda")
    with caplog.at_level(logging.INFO, logger="fastlm.engine.model.attention.choice"):
        installed.update({"flash_attn", "torch"})
        assert choice.choose_attention("auto", cuda, "bf16") == "flash_attention_2"
        installed.discard("flash_attn")
        assert choice.choose_attention("auto", cuda, "bf16") == "torch_varlen"
        installed.clear()
        assert choice.choose_attention("auto", cuda, "bf16") == "flex_attention"
        installed.update({"flash_attn", "torch"})
        assert choice.choose_attention("auto", cuda, "fp32") == "flex_attention"  # varlen kernels: half only
        assert choice.choose_attention("auto", torch.device("cpu")) == "sdpa"
        assert choice.choose_attention("eager", cuda) == "eager"
    assert sum("attention auto ->" in message for message in caplog.messages) == 5
