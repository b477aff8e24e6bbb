"""Build the causal LM: a local pretrained directory (offline), a hub id (opt-in), or a tiny Llama config."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import torch

from fastlm.engine import lora
from fastlm.engine.config import ModelParams
from fastlm.errors import ConfigError

log = logging.getLogger(__name__)
PARAM = "train.model.name_or_path"
# The collator's 4D attention mask format each attention implementation needs (see data.packing).
MASK_FORMATS = {"sdpa": "bool", "eager": "additive", "flash_attention_2": "none"}


def enable_checkpointing(model) -> None:
    """Activation (gradient) checkpointing, non-reentrant, through the API of the installed transformers."""
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x: the other name is deprecated
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def choose_attention(requested: str, device: torch.device) -> str:
    """``auto``: flash-attention varlen on CUDA when the package is installed, else SDPA."""
    if requested != "auto":
        return requested
    if device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def build_model(params: ModelParams, tokenizer, *, max_length: int, attn_implementation: str):
    """The model, in fp32 (LoRA: frozen base in ``lora.base_dtype``, adapters fp32), training mode, with the KV
    cache off; vocabulary and positions checked."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if params.lora.enabled:  # before any weights load: a LoRA set-up this machine cannot run is one line
        lora.check_supported(params)
    if params.name_or_path is None:
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=params.hidden_size,
            intermediate_size=params.intermediate_size,
            num_hidden_layers=params.num_hidden_layers,
            num_attention_heads=params.num_attention_heads,
            num_key_value_heads=params.num_key_value_heads or params.num_attention_heads,
            max_position_embeddings=max(max_length, 512),
            tie_word_embeddings=params.tie_word_embeddings,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            attn_implementation=attn_implementation,
        )
        model = LlamaForCausalLM(config)
    else:
        load = lora.load_kwargs(params.lora) if params.lora.enabled else {"dtype": torch.float32}
        model = AutoModelForCausalLM.from_pretrained(
            _local_or_hub(params), trust_remote_code=params.trust_remote_code,
            attn_implementation=attn_implementation, **load,
        )
    _check_fits(model, tokenizer, max_length)
    model.config.use_cache = False  # a cache is useless in training and turns off packed-sample detection
    if params.gradient_checkpointing:
        enable_checkpointing(model)
    if params.lora.enabled:
        model = lora.apply_lora(model, params.lora, gradient_checkpointing=params.gradient_checkpointing)
    counts = lora.parameter_counts(model)
    log.info("Model %s: %s parameters (%s trainable), attention %s", params.name_or_path or "llama (from config)",
             f"{counts['total_parameters']:,}", f"{counts['trainable_parameters']:,}", attn_implementation)
    return model.train()


def _local_or_hub(params: ModelParams) -> str:
    source = params.name_or_path
    local = Path(source).expanduser()
    if local.is_dir():  # absolute: a LoRA adapter's config names its base folder, loadable from anywhere
        return str(local.resolve())
    if local.is_absolute() or source.startswith((".", "~")) or local.exists() or not params.allow_download:
        raise ConfigError(
            f"{PARAM} = {source!r} is not a model directory"
            + ("" if local.is_absolute() or source.startswith((".", "~")) else " and downloads are off") + ".",
            fix=f"point {PARAM} at a save_pretrained folder, or set train.model.allow_download: true for a hub id.",
        )
    return source


def _check_fits(model, tokenizer, max_length: int) -> None:
    vocab = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > vocab:
        raise ConfigError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's embedding has {vocab}: "
            "tokenizer and model vocabularies disagree.",
            fix="tokenize with the model's own tokenizer (split.tokenizer.source: <model folder>) and rerun "
            "`kedro run --pipeline=split`.",
        )
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and max_length > limit:
        raise ConfigError(
            f"split.max_length = {max_length} exceeds the model's max_position_embeddings ({limit}).",
            fix=f"set split.max_length <= {limit} and rerun `kedro run --pipeline=split`.",
        )
