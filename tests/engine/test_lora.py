"""LoRA on a local tiny Llama checkpoint (saved with save_pretrained, no hub): adapters only train, the
completion-only packed path is kept, checkpoints resume, the adapter saves and merges to the same logits."""

import json

import numpy as np
import pytest
import torch
from demo_data.texts import make_texts

from fastlm.corpus.prompts import tokenize_pairs
from fastlm.engine import lora
from fastlm.engine.checkpoint import latest_checkpoint
from fastlm.engine.config import parse_train_params
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.loop import train
from fastlm.engine.model import build_model
from fastlm.engine.optim import make_adamw
from fastlm.engine.runtime import RuntimeConfig, setup_runtime
from fastlm.errors import ConfigError
from tests.support.tiny_llama import llama_style_tokenizer, save_tiny_llama
from tests.support.tolerances import MERGED_ADAPTER_ATOL

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too

MAX_LENGTH = 48


@pytest.fixture(scope="module")
def texts():
    return make_texts(240, seed=5, profile="demo")


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, texts):
    return save_tiny_llama(tmp_path_factory.mktemp("base"), llama_style_tokenizer(texts))


@pytest.fixture(scope="module")
def tokenizer(base_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(base_dir, local_files_only=True)


@pytest.fixture(scope="module")
def pairs(texts, tokenizer) -> TokenSequences:
    prompts = [f"{a}\n\nSummary:" for a in texts[:120]]
    tokens = tokenize_pairs(prompts, texts[120:240], tokenizer, max_length=MAX_LENGTH)
    return TokenSequences(tokens.values, tokens.offsets, tokens.prompt_lengths)


def model_params(base_dir, **lora_overrides):
    return {"name_or_path": str(base_dir), "lora": {"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0,
                                                    **lora_overrides}}


def train_params(tmp_path, base_dir, **overrides):
    raw = {"model": model_params(base_dir), "batching": {"mode": "packed", "micro_batch_size": 4},
           "optimizer": {"lr": 2e-2, "warmup_steps": 1}, "max_steps": 8, "log_every": 2, "eval_every": None,
           "save_every": 4, "checkpoint_dir": str(tmp_path / "ckpt"), "quiet": True,
           "runtime": {"device": "cpu", "precision": "fp32"}, **overrides}
    return parse_train_params(raw)


def test_auto_targets_are_the_projections_and_only_adapters_train(base_dir, tokenizer):
    params = parse_train_params({"model": model_params(base_dir)}).model
    model = build_model(params, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    adapted = {name.split(".")[-4] for name in trainable}  # ...q_proj.lora_A.default.weight
    assert adapted == set(lora.DEFAULT_TARGETS["llama"])
    counts = lora.parameter_counts(model)
    assert counts["trainable_parameters"] == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert 0 < counts["trainable_share"] < 0.5 and counts["total_parameters"] > counts["trainable_parameters"]
    optimizer = make_adamw(model, lr=1e-3)
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in model.parameters() if p.requires_grad}
    assert lora.target_modules(type("M", (), {"config": type("C", (), {"model_type": "bert"})})(), "auto") == "all-linear"


def test_lora_is_refused_without_a_pretrained_base_and_4bit_without_cuda(base_dir, tokenizer):
    scratch = parse_train_params({"model": {"lora": {"enabled": True}}}).model
    with pytest.raises(ConfigError, match="train.model.name_or_path is null"):
        build_model(scratch, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    if not torch.cuda.is_available():
        quantized = parse_train_params({"model": model_params(base_dir, load_in_4bit=True)}).model
        with pytest.raises(ConfigError, match="train.model.lora.load_in_4bit is true but a CUDA GPU") as error:
            build_model(quantized, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
        assert "\n" not in str(error.value)
    wrong = parse_train_params({"model": model_params(base_dir, target_modules=["no_such_layer"])}).model
    with pytest.raises(ConfigError, match="target_modules"):
        build_model(wrong, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")


def test_lora_training_with_completion_only_packed_data_learns_resumes_and_merges(tmp_path, base_dir, tokenizer,
                                                                                  pairs):
    params = train_params(tmp_path, base_dir, model={**model_params(base_dir), "gradient_checkpointing": True})
    runtime = setup_runtime(RuntimeConfig(**params.runtime.model_dump(), seed=0))
    model = build_model(params.model, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    frozen_before = {name: p.detach().clone() for name, p in model.named_parameters() if not p.requires_grad}
    result = train(model, pairs, pairs, params=params, runtime=runtime, pad_id=tokenizer.eos_token_id,
                   max_length=MAX_LENGTH, attn="sdpa")
    losses = [record["loss"] for record in result.history]
    assert result.summary["batching"] == "packed" and losses[-1] < losses[0]
    assert all(torch.equal(p, frozen_before[name]) for name, p in result.model.named_parameters()
               if not p.requires_grad)
    assert latest_checkpoint(tmp_path / "ckpt").name.endswith("8")
    import safetensors.torch

    saved = safetensors.torch.load_file(str(latest_checkpoint(tmp_path / "ckpt") / "model.safetensors"))
    trainable = {name for name, p in result.model.named_parameters() if p.requires_grad}
    assert set(saved) == trainable and all("lora_" in name for name in saved)  # no copy of the frozen base

    # Resume: a fresh run with max_steps 8 continues from the step-8 checkpoint and changes nothing.
    again = build_model(params.model, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa")
    resumed = train(again, pairs, None, params=params, runtime=runtime, pad_id=tokenizer.eos_token_id,
                    max_length=MAX_LENGTH, attn="sdpa")
    for (name, p), (_, q) in zip(result.model.named_parameters(), resumed.model.named_parameters(), strict=True):
        assert torch.equal(p, q), name

    # Save as the catalog does (adapter + tokenizer), merge, and compare logits with the adapter model.
    out = tmp_path / "adapter"
    result.model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base_dir.resolve()) and not (out / "config.json").exists()
    merged = lora.merge_adapter(out)
    merged.save_pretrained(tmp_path / "merged")
    from transformers import AutoModelForCausalLM

    full = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", local_files_only=True).eval()
    result.model.eval()
    ids = torch.as_tensor(np.asarray(pairs[0], dtype=np.int64))[None]
    with torch.no_grad():
        expected = result.model(input_ids=ids).logits
        torch.testing.assert_close(full(input_ids=ids).logits, expected, rtol=0, atol=MERGED_ADAPTER_ATOL)
        base = AutoModelForCausalLM.from_pretrained(base_dir, local_files_only=True).eval()
        assert not torch.allclose(base(input_ids=ids).logits, expected, atol=MERGED_ADAPTER_ATOL)  # it did something
