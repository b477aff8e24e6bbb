"""Build the model: a local pretrained directory (offline), a hub id (opt-in), or a tiny Llama config.

A pretrained folder goes through ``fastlm.engine.model.pretrained``: it trains as what its config says it is
(a causal LM, or an encoder-decoder model such as BART or T5), with every weight it holds, or is refused with
one line.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from fastlm.engine.config import ModelParams
from fastlm.engine.model import adapter_folder, lora, pretrained
from fastlm.engine.model.attention import kernels  # noqa: F401  (registers torch_varlen and sdpa_varlen)
from fastlm.engine.model.attention.choice import choose_attention
from fastlm.engine.model.attention.windows import enable_packed_windows
from fastlm.engine.model.recompute import enable_checkpointing, resolve_policy
from fastlm.errors import ConfigError

log = logging.getLogger(__name__)
PARAM = "train.model.name_or_path"


def build_model(params: ModelParams, tokenizer, *, max_length: int, attn_implementation: str):
    """The model, in fp32 (LoRA: frozen base in ``lora.base_dtype``, adapters fp32), training mode, with the
    KV cache off; vocabulary and positions checked."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if params.lora.enabled:  # before any weights load: a LoRA set-up this machine cannot run is one line
        lora.check_supported(params)
    base = None  # the pretrained folder (or hub id) the weights come from
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
        base = _local_or_hub(params)
        checkpoint = pretrained.inspect_checkpoint(
            params.name_or_path, base, trust_remote_code=params.trust_remote_code
        )
        model = pretrained.load_pretrained(
            checkpoint,
            allow_new_weights=params.allow_new_weights,
            trust_remote_code=params.trust_remote_code,
            attn_implementation=attn_implementation,
            **load,
        )
        frozen = params.lora.enabled and not pretrained.embedding_module_names(model) <= set(
            params.lora.modules_to_save or ()
        )
        pretrained.fit_vocabulary(
            checkpoint, model, tokenizer, resize=params.resize_embeddings, frozen_embeddings=frozen
        )
    _check_fits(model, max_length)
    enable_packed_windows(model, max_length=max_length)  # packed samples longer than a local layer's window
    model.config.use_cache = False  # a cache is useless in training and turns off packed-sample detection
    policy = resolve_policy(params.gradient_checkpointing)
    enable_checkpointing(model, policy)
    if params.lora.enabled:
        model = lora.apply_lora(model, params.lora, gradient_checkpointing=policy)
        if base is not None and Path(base).is_dir():  # saved with the adapter, checked where it is merged
            adapter_folder.remember_base(model, base)
    counts = lora.parameter_counts(model)
    log.info(
        "Model %s: %s parameters (%s trainable), attention %s, gradient checkpointing %s",
        params.name_or_path or "llama (from config)",
        f"{counts['total_parameters']:,}",
        f"{counts['trainable_parameters']:,}",
        attn_implementation,
        policy,
    )
    return model.train()


def model_attention(
    params: ModelParams, device: torch.device, precision: str | None = None, *, row_length: int | None = None
) -> str:
    """``train.model.attn_implementation`` for this model here: ``auto`` among the paths the class it
    trains supports, for rows of at most ``row_length`` tokens (``BatchingParams.longest_row``;
    ``attention.choice.choose_attention``)."""
    model_class, config = pretrained.trained_class_and_config(params.name_or_path, params.trust_remote_code)
    return choose_attention(
        params.attn_implementation,
        device,
        precision,
        model_class=model_class,
        config=config,
        row_length=row_length,
    )


def _local_or_hub(params: ModelParams) -> str:
    source = params.name_or_path
    local = Path(source).expanduser()
    if local.is_dir():  # absolute: a LoRA adapter's config names its base folder, loadable from anywhere
        return str(local.resolve())
    if local.is_absolute() or source.startswith((".", "~")) or local.exists() or not params.allow_download:
        raise ConfigError(
            f"{PARAM} = {source!r} is not a model directory"
            + ("" if local.is_absolute() or source.startswith((".", "~")) else " and downloads are off")
            + ".",
            fix=f"point {PARAM} at a save_pretrained folder, or set train.model.allow_download: true "
            "for a hub id.",
        )
    return source


def _check_fits(model, max_length: int) -> None:
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and max_length > limit:
        raise ConfigError(
            f"split.max_length = {max_length} exceeds the model's max_position_embeddings ({limit}).",
            fix=f"set split.max_length <= {limit} and rerun `kedro run --pipeline=split`.",
        )
