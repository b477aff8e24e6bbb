"""train.optimizer.name: bitsandbytes' 8-bit and paged 8-bit AdamW get optim.py's parameter groups and
hyper-parameters; without CUDA and bitsandbytes the name is refused in one line before anything runs.

bitsandbytes needs CUDA, so its optimizers are a fake module here: what is checked is the calling contract
(the class each name picks and the arguments it gets), not the 8-bit update (benchmarks/gpu_speed.py)."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest
import torch
from torch import nn

from fastlm.engine.config import parse_train_params
from fastlm.engine.train import optim
from fastlm.errors import ConfigError


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.linear = nn.Linear(8, 8)
        self.frozen = nn.Linear(8, 8, bias=False)
        self.frozen.weight.requires_grad_(False)


@pytest.fixture
def fake_bitsandbytes(monkeypatch):
    """A ``bitsandbytes`` module whose optimizer classes record their arguments, and a CUDA that is there."""
    made: list = []

    class Recording(torch.optim.Optimizer):
        def __init__(self, params, **kwargs) -> None:
            super().__init__(params, {"lr": kwargs["lr"]})
            self.kwargs = kwargs
            made.append(self)

    module = types.ModuleType("bitsandbytes")
    module.__spec__ = importlib.machinery.ModuleSpec("bitsandbytes", None)
    module.optim = types.SimpleNamespace(
        AdamW8bit=type("AdamW8bit", (Recording,), {}), PagedAdamW8bit=type("PagedAdamW8bit", (Recording,), {})
    )
    monkeypatch.setitem(sys.modules, "bitsandbytes", module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return made


@pytest.mark.parametrize(
    ("name", "cls"), [("adamw_8bit", "AdamW8bit"), ("paged_adamw_8bit", "PagedAdamW8bit")]
)
def test_8bit_optimizers_get_the_decay_groups_and_hyper_parameters(fake_bitsandbytes, name, cls):
    settings = parse_train_params(
        {"optimizer": {"name": name, "lr": 3e-4, "weight_decay": 0.05, "beta2": 0.99, "eps": 1e-6}}
    ).optimizer
    model = Small()
    optimizer = optim.make_optimizer(model, settings)
    assert type(optimizer).__name__ == cls and fake_bitsandbytes == [optimizer]
    assert optimizer.kwargs == {"lr": 3e-4, "betas": (0.9, 0.99), "eps": 1e-6}
    groups = {group["name"]: group for group in optimizer.param_groups}
    expected = {group["name"]: group for group in optim.parameter_groups(model, 0.05) if group["params"]}
    assert groups.keys() == expected.keys() == {"decay", "no_decay"}
    for key, group in groups.items():  # the same tensors and decay rule as AdamW: frozen ones left out
        assert [id(p) for p in group["params"]] == [id(p) for p in expected[key]["params"]]
        assert group["weight_decay"] == expected[key]["weight_decay"]
    assert groups["decay"]["weight_decay"] == 0.05 and groups["no_decay"]["weight_decay"] == 0.0


def test_adamw_is_the_default_and_stays_torch():
    settings = parse_train_params({}).optimizer
    assert settings.name == "adamw"
    assert isinstance(optim.make_optimizer(Small(), settings), torch.optim.AdamW)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
@pytest.mark.parametrize("name", ["adamw_8bit", "paged_adamw_8bit"])
def test_8bit_optimizers_are_refused_in_one_line_without_cuda_and_bitsandbytes(name):
    with pytest.raises(ConfigError, match=f"train.optimizer.name.*{name}.*CUDA") as error:
        parse_train_params({"optimizer": {"name": name}})
    assert "\n" not in str(error.value) and "adamw" in str(error.value)
