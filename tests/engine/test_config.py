"""The training parameters' schema: an empty config parses to the documented defaults, and each bad value,
unknown key or contradiction is one ConfigError line naming the parameter and the fix."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import BaseModel

from fastlm.engine.config import TrainParams, parse_train_params
from fastlm.errors import ConfigError


def test_empty_parameters_are_the_defaults():
    params = parse_train_params({})
    assert params == TrainParams()
    assert (params.max_steps, params.log_every, params.save_every, params.keep_last) == (None, 10, 200, 2)
    assert params.resume == "auto" and params.batching.mode == "packed"


def test_nested_values_are_parsed_and_typed():
    params = parse_train_params(
        {"optimizer": {"lr": "3e-4"}, "max_steps": 5, "early_stopping": {"patience": 2}}
    )
    assert params.optimizer.lr == 3e-4 and params.max_steps == 5 and params.early_stopping.patience == 2


@pytest.mark.parametrize(
    ("raw", "named", "fix"),
    [
        ({"max_steps": 0}, "train.max_steps = 0", "--params train.max_steps=<value>"),
        ({"optimizer": {"lr": "fast"}}, "train.optimizer.lr = 'fast'", "set train.optimizer.lr"),
        ({"bogus": 1}, "unknown parameter train.bogus", "remove or correct it"),
        ({"eval_every": None, "early_stopping": {"patience": 2}}, "train.early_stopping", "train.eval_every"),
        ({"seed": 2**64}, "train.seed = 18446744073709551616", "--params train.seed=<value>"),
        ({"data_seed": 2**64}, "train.data_seed = 18446744073709551616", "--params train.data_seed=<value>"),
        ({"data_seed": -1}, "train.data_seed = -1", "--params train.data_seed=<value>"),
        ({"data_seed": "x"}, "train.data_seed = 'x'", "train.data_seed"),
    ],
    ids=[
        "out-of-range",
        "not-a-number",
        "unknown-key",
        "early-stop-without-evaluations",
        "seed-past-2**64",
        "data-seed-past-2**64",
        "data-seed-negative",
        "data-seed-not-a-number",
    ],
)
def test_a_bad_parameter_is_one_line_naming_it_and_the_fix(raw, named, fix):
    with pytest.raises(ConfigError) as raised:
        parse_train_params(raw)
    message = str(raised.value)
    assert named in message and fix in message.split("Fix:")[1] and "\n" not in message


def test_the_largest_seed_taken_seeds_torch_and_the_data_order():
    """torch's generators take seeds below 2**64: a larger train.seed is refused when parsed, not by torch
    half-way through the set-up."""
    seed = parse_train_params({"seed": 2**64 - 1}).seed
    torch.Generator().manual_seed(seed)
    assert np.random.default_rng((seed, 0)).integers(2**62) >= 0


def test_the_data_order_follows_train_seed_unless_train_data_seed_is_set():
    """``train.data_seed`` (the Hugging Face Trainer's ``data_seed``): null draws the data order from
    ``train.seed`` as before it existed; an int (the same 0 .. 2**64 - 1) draws it alone."""
    assert parse_train_params({"seed": 7}).order_seed == 7
    assert parse_train_params({"seed": 7, "data_seed": None}).order_seed == 7
    params = parse_train_params({"seed": 7, "data_seed": 2**64 - 1})
    assert params.order_seed == 2**64 - 1 and params.seed == 7


@pytest.mark.parametrize(
    "raw",
    [
        {"model": {"liger": "on"}, "runtime": {"device": "cpu"}},
        {"optimizer": {"in_backward": True}, "runtime": {"param_dtype": "fp32"}},
        {"optimizer": {"in_backward": True, "grad_clip": None}, "runtime": {"param_dtype": "fp32"}},
        {
            "optimizer": {"in_backward": True, "grad_clip": None},
            "runtime": {"param_dtype": "fp32"},
            "distributed": {"strategy": "ddp"},
        },
        {"loss": {"fused_linear_kernel": "cce", "label_smoothing": 0.1}},
    ],
    ids=[
        "liger-on-a-cpu",
        "in-backward-with-grad-clip",
        "in-backward-fp32-weights",
        "in-backward-fp32-weights-distributed-given",
        "cce-label-smoothing",
    ],
)
def test_a_contradiction_between_parameters_never_asks_for_a_key_that_does_not_exist(raw):
    """A check across groups says in its message what to change: its fix names no ``<group>.<key>`` of a
    group that is not at fault, and each parameter it asks to set is a value (a leaf), not a group."""
    with pytest.raises(ConfigError) as raised:
        parse_train_params(raw)
    message = str(raised.value)
    assert "<key>" not in message and "Fix:" in message and "\n" not in message
    asked = re.findall(r"\btrain(?:\.\w+)+", message.split("Fix:")[1])
    assert asked and all(_is_a_value(name) for name in asked), message
    assert "Params(" not in message  # no group shown as its object


def _is_a_value(name: str) -> bool:
    """Whether ``train.<group>.<key>`` names one parameter of TrainParams (not a group, not unknown)."""
    model: Any = TrainParams
    for part in name.split(".")[1:]:
        fields = getattr(model, "model_fields", {})
        if part not in fields:
            return False
        model = fields[part].annotation
    return not (isinstance(model, type) and issubclass(model, BaseModel))


FSDP_CUDA_GRAPHS = {
    "distributed": {"strategy": "fsdp"},
    "runtime": {"compile_mode": "reduce-overhead", "compile_scope": "layers"},  # device auto: a GPU
}
FSDP_IN_BACKWARD = {
    "distributed": {"strategy": "fsdp"},
    "optimizer": {"in_backward": True, "grad_clip": None},
    "runtime": {"param_dtype": "fp32"},
}


@pytest.mark.parametrize("launched", ["nproc_per_node", "torchrun"])
def test_the_checks_across_processes_count_the_processes_a_step_spans(monkeypatch, launched):
    """Under torchrun ``nproc_per_node`` stays 1 and the environment's world size is the processes a step
    spans: FSDP2 with CUDA graphs is refused there as under ``nproc_per_node: 2``, and ``in_backward`` with
    fp32 weights, which FSDP2's fp32 shards update, is let through there as under it."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    nproc = {"nproc_per_node": 2} if launched == "nproc_per_node" else {}
    if launched == "torchrun":
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "2")
    graphs = {**FSDP_CUDA_GRAPHS, "distributed": {**FSDP_CUDA_GRAPHS["distributed"], **nproc}}
    with pytest.raises(ConfigError) as raised:
        parse_train_params(graphs)
    assert "reduce-overhead is not wired for strategy fsdp" in str(raised.value)
    in_backward = {**FSDP_IN_BACKWARD, "distributed": {**FSDP_IN_BACKWARD["distributed"], **nproc}}
    assert parse_train_params(in_backward).optimizer.in_backward
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process (an agent of one, or none): nothing is sharded
    if launched == "torchrun":
        assert parse_train_params(graphs).distributed.strategy == "fsdp"
        with pytest.raises(ConfigError, match="in_backward updates the fp32 masters"):
            parse_train_params(in_backward)


@pytest.mark.parametrize("launched", ["nproc_per_node", "torchrun"])
def test_bitsandbytes_8bit_adamw_under_fsdp2_is_refused_in_one_line(monkeypatch, launched):
    """bitsandbytes' 8-bit AdamW updates plain tensors and FSDP2's parameters are DTensors: its first
    step failed in every worker (``NotImplementedError: Operator bitsandbytes.optimizer_update_32bit.default
    does not have a sharding strategy registered``) after the launch and the model's set-up. Refused when
    parsed, in the processes a step spans (``nproc_per_node`` or torchrun's); DDP and one process keep it."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    nproc = {"nproc_per_node": 2} if launched == "nproc_per_node" else {}
    if launched == "torchrun":
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "2")
    raw = {"optimizer": {"name": "adamw_8bit"}, "distributed": {"strategy": "fsdp", **nproc}}
    with pytest.raises(ConfigError) as raised:
        parse_train_params(raw)
    message = str(raised.value)
    assert "\n" not in message and "train.optimizer.name" in message and "adamw_8bit" in message
    assert "strategy" in message and "fsdp" in message and "Fix:" in message
    assert (
        parse_train_params({**raw, "distributed": {"strategy": "ddp", **nproc}}).optimizer.name
        == "adamw_8bit"
    )
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process: nothing is sharded
    if launched == "torchrun":
        assert parse_train_params(raw).distributed.strategy == "fsdp"


@pytest.mark.parametrize("optimizer", [{"warmup_ratio": 0.1}, {"warmup_steps": 20, "warmup_ratio": 0.1}])
def test_a_warmup_ratio_beside_warmup_steps_left_at_its_default_is_taken(optimizer):
    """The conf sets ``warmup_steps: 20`` (the default), so a ``warmup_ratio`` given over it is the
    Trainer's: the warmup is then derived from the run's planned steps."""
    settings = parse_train_params({"optimizer": optimizer}).optimizer
    assert settings.warmup_ratio == 0.1 and settings.warmup_steps == 20


def test_a_warmup_ratio_with_another_warmup_steps_is_refused_in_one_line_naming_both():
    with pytest.raises(ConfigError) as raised:
        parse_train_params({"optimizer": {"warmup_steps": 50, "warmup_ratio": 0.1}})
    message = str(raised.value)
    assert "train.optimizer.warmup_steps" in message and "warmup_ratio" in message and "\n" not in message
    assert "Fix:" in message


@pytest.mark.parametrize("ratio", [1.0, -0.1])
def test_a_warmup_ratio_outside_zero_to_one_is_refused(ratio):
    with pytest.raises(ConfigError, match="train.optimizer.warmup_ratio"):
        parse_train_params({"optimizer": {"warmup_ratio": ratio}})
