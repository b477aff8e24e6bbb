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


def test_auto_takes_only_a_path_the_model_class_supports(monkeypatch, caplog):
    """Gemma2 has no SDPA path (transformers refuses it): ``auto`` on CPU picked sdpa, and the load failed
    with a message about a damaged folder; GPT-2 has no flex_attention. ``auto`` goes down its list to the
    first path the class supports, eager last, and says why."""
    import importlib.util
    import logging

    from transformers import Gemma2ForCausalLM, GPT2LMHeadModel, LlamaForCausalLM

    from fastlm.engine.model.attention import choice

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    monkeypatch.setattr(choice, "torch_varlen_available", lambda device: False)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    with caplog.at_level(logging.INFO, logger="fastlm.engine.model.attention.choice"):
        assert choice.choose_attention("auto", cpu, model_class=Gemma2ForCausalLM) == "eager"
        assert choice.choose_attention("auto", cpu, model_class=LlamaForCausalLM) == "sdpa"
        assert choice.choose_attention("auto", cuda, "bf16", model_class=GPT2LMHeadModel) == "sdpa"
        assert (
            choice.choose_attention("auto", cuda, "bf16", model_class=Gemma2ForCausalLM) == "flex_attention"
        )
    assert "Gemma2ForCausalLM has no sdpa path" in caplog.messages[0], caplog.messages


def test_the_class_a_run_trains_is_known_before_its_weights_load(tmp_path):
    from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaForCausalLM

    from fastlm.engine.model.pretrained import trained_class

    config = Gemma2Config(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8,
    )  # fmt: skip
    config.save_pretrained(tmp_path / "gemma2")  # its config alone: nothing else is read
    assert trained_class(str(tmp_path / "gemma2")) is Gemma2ForCausalLM
    assert trained_class(None) is LlamaForCausalLM  # from config
    assert trained_class(str(tmp_path / "missing")) is None  # the build says what is wrong


def test_auto_skips_the_varlen_kernels_for_softcapping_or_sinks_and_a_request_is_refused(monkeypatch, caplog):
    """Gemma2 caps its attention logits and GPT-OSS adds attention sinks: the varlen kernels compute neither.
    On a GPU with PyTorch's varlen kernel, ``auto`` took it for Gemma2 (the cap dropped: another model);
    it goes on to flex_attention, and asking for a varlen kernel is one line."""
    import importlib.util
    import logging

    from transformers import Gemma2Config, Gemma2ForCausalLM, GptOssConfig, GptOssForCausalLM, LlamaConfig

    from fastlm.engine.model.attention import choice
    from fastlm.errors import ConfigError

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    monkeypatch.setattr(choice, "torch_varlen_available", lambda device: True)
    cuda = torch.device("cuda")
    with caplog.at_level(logging.INFO, logger="fastlm.engine.model.attention.choice"):
        picked = choice.choose_attention(
            "auto", cuda, "bf16", model_class=Gemma2ForCausalLM, config=Gemma2Config()
        )
        assert picked == "flex_attention"
        sinks = choice.choose_attention(
            "auto", cuda, "bf16", model_class=GptOssForCausalLM, config=GptOssConfig()
        )
        assert sinks == "flex_attention"
        assert choice.choose_attention("auto", cuda, "bf16", config=LlamaConfig()) == "torch_varlen"
    assert "attention logit softcapping" in caplog.messages[0], caplog.messages
    for attn in ("torch_varlen", "sdpa_varlen"):
        with pytest.raises(ConfigError, match="has no attention logit softcapping") as raised:
            choice.choose_attention(attn, cuda, "bf16", config=Gemma2Config())
        assert "train.model.attn_implementation" in str(raised.value)


def test_any_class_whose_attention_passes_sinks_is_kept_off_the_varlen_kernels(monkeypatch):
    """GPT-OSS was recognised by its family name alone: GraniteSWA (and Flint, MiMo-V2-Flash) pass attention
    sinks too, ``auto`` took torch_varlen for them and the run failed at its first forward. What the class's
    attention passes decides it; a multimodal config's softcapping is in its text config."""
    import importlib.util

    from transformers import GraniteSWAConfig, GraniteSWAForCausalLM, LlamaForCausalLM

    from fastlm.engine.model.attention import choice
    from fastlm.engine.model.attention.kernels import unsupported_terms

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    monkeypatch.setattr(choice, "torch_varlen_available", lambda device: True)
    cuda = torch.device("cuda")
    picked = choice.choose_attention(
        "auto", cuda, "bf16", model_class=GraniteSWAForCausalLM, config=GraniteSWAConfig()
    )
    assert picked == "flex_attention"
    assert unsupported_terms(None, LlamaForCausalLM) == []

    class Multimodal:  # a config whose language model caps its logits (as a Gemma2-based multimodal one)
        def get_text_config(self):
            return type("Text", (), {"attn_logit_softcapping": 30.0})()

    assert unsupported_terms(Multimodal()) == ["attention logit softcapping"]


@pytest.mark.parametrize("installed", [set(), {"flash_attn", "torch"}])
def test_auto_keeps_an_encoder_decoder_model_on_the_dense_mask_that_packs_its_rows(monkeypatch, installed):
    """An encoder-decoder model's packed rows keep their samples apart through dense per-sample masks (sdpa
    or eager): ``auto`` on a GPU picked flex_attention (or flash_attention_2 with flash_attn installed) for
    BART and T5, which cannot, and every packed run batched length_grouped instead, said in a warning the
    user had not caused. A decoder-only model keeps its varlen or flex path."""
    import importlib.util

    from transformers import (
        BartConfig,
        BartForConditionalGeneration,
        LlamaConfig,
        LlamaForCausalLM,
        T5Config,
        T5ForConditionalGeneration,
    )

    from fastlm.engine.model.attention import choice
    from fastlm.engine.model.encoder_decoder import packing_unavailable
    from tests.support.tiny_seq2seq import SMALL_BART_LAYERS

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name in installed else None)
    monkeypatch.setattr(choice, "torch_varlen_available", lambda device: "torch" in installed)
    cuda = torch.device("cuda")
    bart = BartConfig(vocab_size=50, **SMALL_BART_LAYERS)
    t5 = T5Config(vocab_size=50, d_model=16, d_kv=8, num_heads=2, num_layers=1, d_ff=32)
    for model_class, config in ((BartForConditionalGeneration, bart), (T5ForConditionalGeneration, t5)):
        for precision in ("bf16", "fp32"):
            attn = choice.choose_attention("auto", cuda, precision, model_class=model_class, config=config)
            assert attn == "sdpa", (model_class.__name__, precision, attn)
            assert packing_unavailable(model_class(config), attn) is None
    decoder = choice.choose_attention(
        "auto", cuda, "bf16", model_class=LlamaForCausalLM, config=LlamaConfig()
    )
    assert decoder == ("flash_attention_2" if installed else "flex_attention")
