"""Unequal micro-batches of one optimizer step and a tiny Llama, shared by the tests of the loss
(``model.loss``) and of gradient accumulation (``model.accumulation``): right-padded rows with very unequal
target counts, the one batch they make together, and the gradients a step left in a model."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from fastlm.engine.data.schema import IGNORE_INDEX, count_target_tokens

VOCAB = 300
SEQ_LEN = 16


def tiny_llama() -> LlamaForCausalLM:
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=VOCAB,
        max_position_embeddings=128,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    return model.eval()  # no dropout; gradients still flow


def make_batch(rows: list[tuple[int, int]], generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Right-padded rows; a (length, prompt) row has its ``prompt`` first labels masked, as in SFT."""
    input_ids = torch.zeros(len(rows), SEQ_LEN, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), SEQ_LEN, dtype=torch.long)
    labels = torch.full((len(rows), SEQ_LEN), IGNORE_INDEX)
    for i, (length, prompt) in enumerate(rows):
        tokens = torch.randint(1, VOCAB, (length,), generator=generator)
        input_ids[i, :length] = tokens
        attention_mask[i, :length] = 1
        labels[i, prompt:length] = tokens[prompt:]
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "labels": labels,
        "num_target_tokens": int(count_target_tokens(labels)),  # what the collator provides
    }


def unequal_micro_batches() -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    layouts = [[(16, 0), (15, 2)], [(5, 0), (4, 3)], [(12, 6), (9, 0)]]  # very unequal target counts
    return [make_batch(rows, generator) for rows in layouts]


def concatenate(batches: list[dict]) -> dict:
    full = {key: torch.cat([b[key] for b in batches]) for key in ("input_ids", "attention_mask", "labels")}
    full["num_target_tokens"] = sum(b["num_target_tokens"] for b in batches)
    return full


def gradients(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()
