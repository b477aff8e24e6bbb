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


def test_auto_keeps_long_cpu_rows_off_the_dense_mask(monkeypatch, caplog):
    """On CPU ``auto`` trained every row on SDPA over the dense ``[rows, 1, T, T]`` block-causal mask: one
    training step of a tiny Llama on a packed row of 16,384 tokens peaked 2.5 GiB above its start (8,192:
    0.7 GiB, 2,048: 0.08 GiB: quadratic; a 32,768-token row ~10 GiB), where ``sdpa_varlen`` (each document
    its own keys) took 0.27 GiB and was 2.5-5.7x faster from 2,048 tokens on. Rows of
    ``LONG_ROW_TOKENS`` or more now take ``sdpa_varlen``; shorter ones, an encoder-decoder model and a
    class or config it cannot serve keep their paths."""
    import logging

    from transformers import (
        BartConfig,
        BartForConditionalGeneration,
        Gemma2Config,
        Gemma2ForCausalLM,
        LlamaForCausalLM,
    )

    from fastlm.engine.model.attention import choice
    from tests.support.tiny_seq2seq import SMALL_BART_LAYERS

    cpu, long_row = torch.device("cpu"), choice.LONG_ROW_TOKENS
    with caplog.at_level(logging.INFO, logger="fastlm.engine.model.attention.choice"):
        picked = choice.choose_attention("auto", cpu, model_class=LlamaForCausalLM, row_length=long_row)
        assert picked == "sdpa_varlen"
        assert f"rows of up to {long_row} tokens" in caplog.messages[-1], caplog.messages
    assert choice.choose_attention("auto", cpu, row_length=32768) == "sdpa_varlen"
    assert (
        choice.choose_attention("auto", cpu, model_class=LlamaForCausalLM, row_length=long_row - 1) == "sdpa"
    )
    assert choice.choose_attention("auto", cpu) == "sdpa"  # row length unknown
    assert choice.choose_attention("sdpa", cpu, row_length=32768) == "sdpa"  # asked for: kept
    gemma = Gemma2Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
    )  # fmt: skip  (logit softcapping: no varlen path computes it)
    assert choice.choose_attention(
        "auto", cpu, model_class=Gemma2ForCausalLM, config=gemma, row_length=8192
    ) == ("eager")
    bart = BartConfig(vocab_size=50, **SMALL_BART_LAYERS)
    assert (
        choice.choose_attention(
            "auto", cpu, model_class=BartForConditionalGeneration, config=bart, row_length=8192
        )
        == "sdpa"
    )
    # a compiled CPU model keeps it (only sdpa becomes eager, whose additive mask is 4 bytes a score pair)
    assert choice.attention_when_compiled("sdpa_varlen", "auto", cpu) == "sdpa_varlen"


def test_a_run_chooses_its_attention_for_its_longest_row():
    """The row length ``auto`` judges by: a packed run's ``row_length`` where set, else ``split.max_length``
    (``row_length: auto`` never exceeds it; padded batches are at most that long)."""
    from fastlm.engine.config import BatchingParams, ModelParams
    from fastlm.engine.model.build import model_attention

    cpu = torch.device("cpu")
    assert BatchingParams(mode="packed", row_length=4096).longest_row(320) == 4096
    assert BatchingParams(mode="packed", row_length="auto").longest_row(8192) == 8192
    assert BatchingParams(mode="length_grouped", row_length=4096).longest_row(512) == 512
    assert model_attention(ModelParams(), cpu, row_length=8192) == "sdpa_varlen"
    assert model_attention(ModelParams(), cpu, row_length=320) == "sdpa"


@pytest.mark.parametrize("requested", ["sdpa", "eager"])
def test_an_explicit_dense_mask_path_on_long_cpu_rows_is_warned_about(requested, caplog):
    """``auto`` trains CPU rows of ``LONG_ROW_TOKENS`` or more per document; an explicit ``sdpa`` or
    ``eager`` kept the dense ``[T, T]`` mask (its memory the row's square: ~10 GiB a 32,768-token row)
    without a word. Now one warning names the parameter, the row length and the fix; shorter rows, a GPU
    and a model the varlen path cannot serve (an encoder-decoder one) are not warned about."""
    import logging

    from transformers import BartConfig, BartForConditionalGeneration, LlamaForCausalLM

    from fastlm.engine.model.attention import choice

    cpu, long_row = torch.device("cpu"), choice.LONG_ROW_TOKENS
    with caplog.at_level(logging.WARNING, logger="fastlm.engine.model.attention.choice"):
        picked = choice.choose_attention(requested, cpu, model_class=LlamaForCausalLM, row_length=long_row)
    assert picked == requested
    assert len(caplog.messages) == 1, caplog.messages
    said = caplog.messages[0]
    assert (
        f"train.model.attn_implementation: {requested}" in said and f"rows of up to {long_row} tokens" in said
    )
    assert "auto" in said and "sdpa_varlen" in said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fastlm.engine.model.attention.choice"):
        choice.choose_attention(requested, cpu, model_class=LlamaForCausalLM, row_length=long_row - 1)
        choice.choose_attention(requested, cpu, row_length=None)
        choice.choose_attention(requested, torch.device("cuda"), row_length=long_row)
        bart = BartConfig(vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1)
        choice.choose_attention(
            requested, cpu, model_class=BartForConditionalGeneration, config=bart, row_length=long_row
        )
    assert not caplog.messages, caplog.messages
