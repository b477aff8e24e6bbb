"""Gradient checkpointing policies (off / selective / full / auto): the same loss and gradients, less
activation memory kept for the backward the more layers recompute, and ``true``/``false`` read as full/off."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from fastlm.engine.config import parse_train_params
from fastlm.engine.model.recompute import (
    checkpointed_layers,
    checkpointing_in_use,
    enable_checkpointing,
    resolve_policy,
)
from fastlm.errors import ConfigError
from tests.support.tolerances import OTHER_FP32_KERNEL_GRAD, OTHER_FP32_MODEL

pytestmark = pytest.mark.kernels  # recomputed forwards are compared with a tolerance

LAYERS = 4


def tiny_llama() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="sdpa",
        use_cache=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return LlamaForCausalLM(config).train()


def saved_bytes_and_grads(policy: str):
    """The loss, the gradients and the bytes autograd keeps for the backward (each storage once), measured
    with ``saved_tensors_hooks`` around the forward: what the activations cost on any device, CPU included."""
    model = tiny_llama()
    model.config.use_cache = False
    enable_checkpointing(model, policy)
    ids = torch.randint(0, 96, (2, 48), generator=torch.Generator().manual_seed(1))
    storages: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    return loss.detach(), grads, sum(storages.values()), model


def test_policies_keep_loss_and_gradients_and_save_less_memory_in_order():
    results = {policy: saved_bytes_and_grads(policy) for policy in ("off", "selective", "full")}
    loss_off, grads_off, bytes_off, _ = results["off"]
    for policy in ("selective", "full"):
        loss, grads, _, _ = results[policy]
        torch.testing.assert_close(loss, loss_off, **OTHER_FP32_MODEL)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, grads_off[name], **OTHER_FP32_KERNEL_GRAD, msg=name)
    assert bytes_off > results["selective"][2] > results["full"][2]
    assert checkpointed_layers(results["off"][3]) == []
    assert checkpointed_layers(results["selective"][3]) == [0, 2]  # every other decoder layer
    assert checkpointed_layers(results["full"][3]) == list(range(LAYERS))


def test_a_policy_can_be_switched_on_the_same_model():
    model = tiny_llama()
    enable_checkpointing(model, "full")
    enable_checkpointing(model, "selective")
    assert checkpointed_layers(model) == [0, 2]
    enable_checkpointing(model, "off")
    assert checkpointed_layers(model) == []


@pytest.mark.parametrize(
    ("raw", "policy"),
    [(True, "full"), (False, "off"), ("selective", "selective"), ("auto", "auto"), ("full", "full")],
)
def test_the_parameter_reads_booleans_as_full_and_off(raw, policy):
    model = parse_train_params({"model": {"gradient_checkpointing": raw}}).model
    assert model.gradient_checkpointing == policy


def test_auto_is_off_until_tune_writes_a_policy_and_unknown_values_are_one_line():
    assert resolve_policy("auto") == "off" and resolve_policy("selective") == "selective"
    with pytest.raises(ConfigError, match="train.model.gradient_checkpointing") as error:
        parse_train_params({"model": {"gradient_checkpointing": "some"}})
    assert "\n" not in str(error.value)


def test_the_policy_in_use_is_read_from_the_layers():
    model = tiny_llama()
    assert checkpointing_in_use(model) == ("off", f"0 of {LAYERS}")
    enable_checkpointing(model, "selective")
    assert checkpointing_in_use(model) == ("selective", f"{LAYERS // 2} of {LAYERS}")
    enable_checkpointing(model, "full")
    assert checkpointing_in_use(model) == ("full", f"{LAYERS} of {LAYERS}")
    model.model.layers[1].gradient_checkpointing = False  # layers 0, 2, 3: no policy of ours
    assert checkpointing_in_use(model) == ("partial", f"{LAYERS - 1} of {LAYERS}")
