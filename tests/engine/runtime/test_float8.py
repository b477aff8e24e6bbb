"""train.runtime.float8: the auto decision (CUDA capability >= 8.9, torchao, hidden size >= 2048), the module
filter (no output head, dims divisible by 16, plain Linear only) and the conversion call, on a module tree.

torchao is not needed: its ``convert_to_float8_training`` is replaced by one that applies the filter the way
torchao does (every module, with its fully qualified name) and records what it would convert."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from fastlm.engine.config import parse_train_params
from fastlm.engine.runtime import float8
from fastlm.errors import ConfigError


def llama(hidden: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=1,
        num_attention_heads=4,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):  # shapes only: a 2048-wide model without its memory
        return LlamaForCausalLM(config)


@pytest.fixture
def hopper(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(float8, "torchao_installed", lambda: True)


CUDA = torch.device("cuda")


class FourBitLike(nn.Linear):
    """Stands for bitsandbytes' Linear4bit: a Linear subclass whose forward is no plain matmul."""


def test_auto_is_on_for_a_wide_model_on_a_hopper_gpu_with_torchao(hopper):
    on, why = float8.float8_decision("auto", llama(2048), CUDA)
    assert on and "9.0" in why and "2048" in why


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("cpu", "not a CUDA device"),
        ("ampere", "compute capability 8.0 < 8.9"),
        ("no_torchao", "torchao"),
        ("narrow", "hidden size 1024 < 2048"),
        ("four_bit", "no Linear layer can take it"),
    ],
)
def test_auto_is_off_with_the_reason(hopper, monkeypatch, change, reason):
    device, model = CUDA, llama(2048)
    if change == "cpu":
        device = torch.device("cpu")
    elif change == "ampere":
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    elif change == "no_torchao":
        monkeypatch.setattr(float8, "torchao_installed", lambda: False)
    elif change == "narrow":
        model = llama(1024)
    else:  # a 4-bit base (QLoRA): bitsandbytes' Linear subclasses, which float8 leaves out, the head aside
        for name, module in model.named_modules():
            if type(module) is nn.Linear and name != "lm_head":
                module.__class__ = FourBitLike
    on, why = float8.float8_decision("auto", model, device)
    assert not on and reason in why


def test_micro_batches_align_to_16_tokens_only_where_float8_may_train(hopper, monkeypatch):
    """Where float8 layers may train, every micro-batch's token count is a multiple of 16 (CUDA's float8
    GEMM, engine.batching); any other run pads no more than it did (short padded texts would pay)."""
    assert float8.token_multiple("on", "cpu") == float8.token_multiple("auto", "cuda") == 16
    assert float8.token_multiple("off", "cuda") == float8.token_multiple("auto", "cpu") == 1
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert float8.token_multiple("auto", "cuda") == 1  # no float8 tensor cores
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(float8, "torchao_installed", lambda: False)
    assert float8.token_multiple("auto", "cuda") == 1


def test_auto_with_packed_rows_not_a_multiple_of_16_is_off_and_pads_nothing_more(hopper):
    """An explicit ``train.batching.row_length`` float8's GEMMs cannot take (not a multiple of 16) turns
    ``auto`` off, named, instead of refusing the run: auto decides, the user's row stands. ``on`` still
    aligns (and the batching refuses the row, naming the fix)."""
    on, why = float8.float8_decision("auto", llama(2048), CUDA, row_length=1000)
    assert not on and "train.batching.row_length 1000 is not a multiple of 16" in why
    assert float8.float8_decision("auto", llama(2048), CUDA, row_length=1008)[0] is True
    assert float8.token_multiple("auto", "cuda", row_length=1000) == 1
    assert float8.token_multiple("auto", "cuda", row_length=1008) == 16
    assert float8.token_multiple("on", "cuda", row_length=1000) == 16
    assert float8.float8_decision("on", llama(2048), CUDA, row_length=1000)[0] is True


def test_a_narrow_model_without_torchao_is_off_for_its_width_not_for_the_package(hopper, monkeypatch):
    """The package is named only where it is all that is missing (the report's advice installs it)."""
    monkeypatch.setattr(float8, "torchao_installed", lambda: False)
    on, why = float8.float8_decision("auto", llama(1024), CUDA)
    assert not on and "hidden size 1024 < 2048" in why and "torchao" not in why


def test_off_and_on_are_what_they_say(hopper):
    assert float8.float8_decision("off", llama(2048), CUDA)[0] is False
    assert float8.float8_decision("on", llama(512), CUDA)[0] is True  # the config checked the machine


class Tree(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.up = nn.Linear(32, 64)
        self.odd = nn.Linear(32, 40)  # 40 is not a multiple of 16: float8 matmuls need both dims aligned
        self.block = nn.Sequential(nn.Linear(64, 32), nn.LayerNorm(32))
        self.quantized = type("Linear4bit", (nn.Linear,), {})(32, 32)  # a subclass: bitsandbytes, peft
        self.lm_head = nn.Linear(32, 64, bias=False)

    def get_output_embeddings(self):
        return self.lm_head


def test_the_filter_keeps_aligned_plain_linears_and_skips_the_head():
    model = Tree()
    keep = float8.module_filter(model)
    chosen = [name for name, module in model.named_modules() if name and keep(module, name)]
    assert chosen == ["up", "block.0"]


def test_the_filter_skips_a_trained_head_copy_and_the_lora_adapters():
    # modules_to_save: [lm_head] wraps the head (peft's ModulesToSaveWrapper): its frozen original and its
    # trained copy are plain Linear layers, and were converted, logits in float8; with r a multiple of 16
    # the adapters' rank-r matmuls were too (under peft's forward; the fused LoRA forward reads their
    # weights itself, so they were counted as float8 layers that never ran as such).
    from fastlm.engine.model import lora

    with torch.random.fork_rng(devices=[]):
        model = LlamaForCausalLM(llama(32).config)
    raw = {"model": {"lora": {"enabled": True, "r": 16, "modules_to_save": ["lm_head"]}}}
    adapted = lora.apply_lora(model, parse_train_params(raw).model.lora, gradient_checkpointing="off")
    keep = float8.module_filter(adapted)
    chosen = [name for name, module in adapted.named_modules() if name and keep(module, name)]
    assert len(chosen) == 7 and all(name.endswith("base_layer") for name in chosen), chosen


def test_apply_converts_through_torchao_with_the_filter(hopper, monkeypatch):
    converted: list[str] = []

    def convert(model, *, module_filter_fn):
        converted.extend(
            name for name, module in model.named_modules() if name and module_filter_fn(module, name)
        )
        return model

    monkeypatch.setattr(float8, "load_converter", lambda: convert)
    model = Tree()
    why = float8.apply_float8(model, "on", CUDA)
    assert converted == ["up", "block.0"] and "2 Linear layers" in why
    converted.clear()
    assert "off" in float8.apply_float8(model, "auto", torch.device("cpu")) and converted == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_on_is_refused_in_one_line_without_a_float8_gpu():
    assert parse_train_params({}).runtime.float8 == "auto"
    assert parse_train_params({"runtime": {"float8": False}}).runtime.float8 == "off"  # YAML's unquoted off
    with pytest.raises(ConfigError, match="train.runtime.float8.*8.9") as error:
        parse_train_params({"runtime": {"float8": "on"}})
    assert "\n" not in str(error.value)


def test_on_with_no_layer_to_convert_is_said_in_a_warning(hopper, monkeypatch, caplog):
    # a 4-bit base (QLoRA): its Linear layers are bitsandbytes' and the adapters are left out, so `on`
    # converted nothing, said only as "0 Linear layers in float8" at INFO
    monkeypatch.setattr(float8, "load_converter", lambda: lambda model, *, module_filter_fn: model)
    model = nn.Sequential(nn.Linear(10, 10))  # not a multiple of 16: nothing float8 can take
    caplog.clear()
    with caplog.at_level("WARNING", logger=float8.__name__):
        why = float8.apply_float8(model, "on", CUDA)
    warned = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert len(warned) == 1 and "no Linear layer" in warned[0] and "train.runtime.float8" in warned[0]
    assert warned[0] == why


def test_on_with_no_layer_to_convert_is_off_for_the_whole_run():
    # `on` with nothing float8 can take (a 4-bit base): the decision the run's compile choice (CUDA auto
    # compiles where float8 may train) and its recorded runtime.float8 follow said on, though no layer was
    # converted; the run is to train as with off
    on, why = float8.float8_decision("on", nn.Sequential(nn.Linear(10, 10)), CUDA)
    assert not on and "no Linear layer can take it" in why and "(on)" in why
