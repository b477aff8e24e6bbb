"""AdamW parameter groups: decay on weight matrices only; fused/foreach kernel choice."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from fastlm.engine.train.optim import make_adamw, parameter_groups


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.linear = nn.Linear(8, 8, bias=True)
        self.norm = nn.LayerNorm(8)
        self.frozen = nn.Linear(8, 8, bias=False)
        self.frozen.weight.requires_grad_(False)


def names(model: nn.Module, params: list[nn.Parameter]) -> set[str]:
    ids = {id(p) for p in params}
    return {name for name, p in model.named_parameters() if id(p) in ids}


def by_name(groups: list[dict]) -> dict[str, dict]:
    return {group["name"]: group for group in groups}


def test_decay_only_on_weight_matrices_not_embeddings_by_default():
    model = Small()
    groups = by_name(parameter_groups(model, weight_decay=0.1))
    assert names(model, groups["decay"]["params"]) == {"linear.weight"}
    no_decay = {"embed.weight", "linear.bias", "norm.weight", "norm.bias"}
    assert names(model, groups["no_decay"]["params"]) == no_decay
    assert groups["decay"]["weight_decay"] == 0.1
    assert groups["no_decay"]["weight_decay"] == 0.0


def test_embeddings_decay_on_request():
    model = Small()
    groups = by_name(parameter_groups(model, weight_decay=0.1, decay_embeddings=True))
    assert names(model, groups["decay"]["params"]) == {"linear.weight", "embed.weight"}


@pytest.mark.parametrize("tied", [False, True])
def test_llama_groups_cover_every_trainable_parameter_once(tied):
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=100,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    with torch.random.fork_rng(devices=[]):  # leave the global RNG as it was
        model = LlamaForCausalLM(config)
    groups = by_name(parameter_groups(model, weight_decay=0.1))
    decay, no_decay = names(model, groups["decay"]["params"]), names(model, groups["no_decay"]["params"])

    assert decay.isdisjoint(no_decay)
    assert len(groups["decay"]["params"]) + len(groups["no_decay"]["params"]) == len(list(model.parameters()))
    assert all(name.endswith("norm.weight") or name == "model.embed_tokens.weight" for name in no_decay)
    assert "model.embed_tokens.weight" in no_decay
    assert ("lm_head.weight" in decay) is not tied  # a tied head is the embedding, counted once
    assert {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"} <= decay


def test_make_adamw_on_cpu_uses_foreach_and_steps():
    model = Small()
    optimizer = make_adamw(model, lr=1e-3, weight_decay=0.05)
    assert optimizer.defaults["foreach"] is True
    assert not optimizer.defaults["fused"]
    assert [g["name"] for g in optimizer.param_groups] == ["decay", "no_decay"]
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.05, 0.0]
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.95)

    before = model.linear.weight.detach().clone()
    model.linear(model.embed(torch.tensor([1, 2]))).sum().backward()
    optimizer.step()
    assert not torch.equal(before, model.linear.weight)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_make_adamw_on_cuda_is_fused():
    optimizer = make_adamw(Small().cuda(), lr=1e-3)
    assert optimizer.defaults["fused"] is True
