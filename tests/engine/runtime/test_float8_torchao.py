"""torchao's own float8 layers, on CPU (torch's CPU ``_scaled_mm``): the contract the float8 probe and the
optimizer rely on, checked against the library rather than a stand-in (test_float8_probe.py's)."""

from __future__ import annotations

import pytest
import torch

from fastlm.engine.runtime import float8
from tests.support.toy_training import toy_model

torchao = pytest.importorskip("torchao")


def test_the_probes_swap_keeps_the_parameters_the_optimizer_was_made_with():
    model = toy_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)  # made before the probe converts (build.py)
    before = {name: param for name, param in model.named_parameters()}
    plain = {name: module for name, module in model.named_modules()}
    swap = float8.Float8Swap(model)  # torchao's convert_to_float8_training
    assert len(swap) == float8.float8_layers(model) == 14  # 7 projections x 2 layers; not the head
    assert all(type(module).__name__ == "Float8Linear" for module in swap.float8.values())
    assert {name: param for name, param in model.named_parameters()} == before  # the same objects
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    weight = model.model.layers[0].self_attn.q_proj.weight
    start = weight.detach().clone()
    model(input_ids=ids, labels=ids).loss.backward()
    assert weight.grad is not None and weight.grad.abs().sum() > 0  # float8's backward reaches it
    optimizer.step()
    assert not torch.equal(weight.detach(), start)  # the optimizer made before trains the float8 layer
    swap.use(False)
    assert all(module is plain[name] for name, module in model.named_modules())
    assert float8.float8_layers(model) == 0
