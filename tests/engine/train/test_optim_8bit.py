"""train.optimizer.name: bitsandbytes' 8-bit and paged 8-bit AdamW get optim.py's parameter groups and
hyper-parameters (a fake module records them); without bitsandbytes the name is refused in one line before
anything runs, and paged states without CUDA; on CPU bitsandbytes' own 8-bit AdamW trains, checkpoints its
uint8 states and resumes (its CPU backend)."""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import shutil
import sys
import types

import pytest
import torch
from torch import nn

from fastlm.engine.config import parse_train_params
from fastlm.engine.train import optim
from fastlm.errors import ConfigError
from tests.support.packages import hide_package


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
def test_paged_states_are_refused_in_one_line_without_cuda():
    """Paging moves the states between GPU and host memory: there is nothing to page on a CPU."""
    with pytest.raises(ConfigError, match="train.optimizer.name.*paged_adamw_8bit.*CUDA") as error:
        parse_train_params({"optimizer": {"name": "paged_adamw_8bit"}})
    assert "\n" not in str(error.value) and "adamw_8bit" in str(error.value)


@pytest.mark.parametrize("name", ["adamw_8bit", "paged_adamw_8bit"])
def test_8bit_optimizers_are_refused_in_one_line_without_bitsandbytes(monkeypatch, name):
    hide_package(monkeypatch, "bitsandbytes")
    with pytest.raises(ConfigError, match=f"train.optimizer.name.*{name}.*bitsandbytes") as error:
        parse_train_params({"optimizer": {"name": name}})
    assert "\n" not in str(error.value) and "pip install" in str(error.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the version rule is for machines without CUDA")
def test_bitsandbytes_before_its_cpu_backend_is_refused_in_one_line(monkeypatch):
    pytest.importorskip("bitsandbytes", reason="the dev install brings it: pip install -e .[dev]")
    real_version = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "0.45.5" if name == "bitsandbytes" else real_version(name)
    )
    with pytest.raises(ConfigError, match="bitsandbytes 0.45.5 has no CPU backend") as error:
        parse_train_params({"optimizer": {"name": "adamw_8bit"}})
    assert "\n" not in str(error.value) and "bitsandbytes>=0.50" in str(error.value)


@pytest.mark.kernels  # compares two computations (8-bit and fp32 states): other CPU kernel sets too
def test_adamw_8bit_trains_resumes_and_follows_adamw_on_cpu(tmp_path):
    """bitsandbytes' 8-bit AdamW on CPU (its CPU backend, 0.50 on): the matrices' moments are uint8 in the
    checkpoint (tensors under 4,096 elements keep 32-bit moments, bitsandbytes' ``min_8bit_size``), the toy
    run learns as AdamW does (block-wise 8-bit moments round each update by about 1/127 of its block's
    largest moment: the final loss within 5 % of AdamW's), and a run resumed from its step-6 checkpoint ends
    with the weights of the run it continues (the same computation)."""
    pytest.importorskip("bitsandbytes", reason="the dev install brings it: pip install -e .[dev]")
    from transformers import LlamaForCausalLM

    from tests.support.tiny_models import llama_config
    from tests.support.toy_training import EOS, VOCAB, run_toy, toy_params

    def model():  # 64 x 128 MLP matrices: 8-bit moments
        torch.manual_seed(0)
        shape = llama_config(vocab=VOCAB, hidden=64, positions=64, eos_token_id=EOS, pad_token_id=EOS)
        return LlamaForCausalLM(shape)

    steps = {"max_steps": 12, "eval_every": None, "log_every": 4, "save_every": 6}
    eight = toy_params(tmp_path / "8bit", optimizer={"name": "adamw_8bit"}, **steps)
    result = run_toy(eight, model=model())
    saved = torch.load(
        tmp_path / "8bit" / "checkpoints" / "checkpoint-00000012" / "optimizer.pt", weights_only=False
    )
    tensors = [v for state in saved["state"].values() for v in state.values()]
    tensors += [v for t in tensors if isinstance(t, dict) for v in t.values()]  # bitsandbytes nests them
    dtypes = {str(t.dtype) for t in tensors if torch.is_tensor(t)}
    assert "torch.uint8" in dtypes, dtypes
    reference = run_toy(toy_params(tmp_path / "fp32", **steps), model=model())
    losses, reference_losses = [r["loss"] for r in result.history], [r["loss"] for r in reference.history]
    assert losses[-1] < 0.8 * losses[0], losses
    assert abs(losses[-1] - reference_losses[-1]) < 0.05 * reference_losses[-1], (losses, reference_losses)
    shutil.rmtree(tmp_path / "8bit" / "checkpoints" / "checkpoint-00000012")
    resumed = run_toy(
        toy_params(tmp_path / "8bit", optimizer={"name": "adamw_8bit"}, resume="auto", **steps), model=model()
    )
    assert resumed.summary["resumed_from_step"] == 6, resumed.summary.get("resumed_from")
    for (name, p), q in zip(result.model.named_parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q), name
