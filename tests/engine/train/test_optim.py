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


def test_make_adamw_on_cpu_is_fused_and_steps():
    """torch's fused AdamW has a CPU kernel: one pass over each parameter and its states, where the
    multi-tensor (foreach) kernels make several; 5.0x faster on 0.47 B fp32 parameters on a 2-core CPU
    (benchmarks/optimizer_step.py), the foreach step being 40 % of a full fine-tune's CPU step on the 3B
    shape (1 layer)."""
    model = Small()
    optimizer = make_adamw(model, lr=1e-3, weight_decay=0.05)
    assert optimizer.defaults["fused"] is True
    assert not optimizer.defaults["foreach"]
    assert [g["name"] for g in optimizer.param_groups] == ["decay", "no_decay"]
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.05, 0.0]
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.95)

    before = model.linear.weight.detach().clone()
    model.linear(model.embed(torch.tensor([1, 2]))).sum().backward()
    optimizer.step()
    assert not torch.equal(before, model.linear.weight)


@pytest.mark.kernels  # the fused and the multi-tensor AdamW: two computations of one update
def test_the_fused_cpu_update_is_the_multi_tensor_one_within_fp32_rounding():
    """Three AdamW steps with the same gradients through both kernels give the same weights to within a few
    fp32 roundings of the update (each step adds lr * m / (sqrt(v) + eps), computed in another order)."""
    from tests.support.tolerances import OTHER_FP32_KERNEL

    models = [Small(), Small()]
    models[1].load_state_dict(models[0].state_dict())
    start = models[0].linear.weight.detach().clone()
    fused = make_adamw(models[0], lr=1e-2)
    groups = [g for g in parameter_groups(models[1], weight_decay=0.1) if g["params"]]
    foreach = torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        trained = [p for p in models[0].parameters() if p.requires_grad]
        grads = [torch.randn(p.shape, generator=generator) for p in trained]
        for model, optimizer in zip(models, (fused, foreach), strict=True):
            for p, g in zip([p for p in model.parameters() if p.requires_grad], grads, strict=True):
                p.grad = g.clone()
            optimizer.step()
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(a, b, **OTHER_FP32_KERNEL)
    assert fused.defaults["fused"] and not models[0].linear.weight.equal(start)  # it trained


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_make_adamw_on_cuda_is_fused():
    optimizer = make_adamw(Small().cuda(), lr=1e-3)
    assert optimizer.defaults["fused"] is True


def lora_model():
    from fastlm.engine.config import LoraParams
    from fastlm.engine.model.lora import apply_lora
    from tests.support.tiny_models import llama_config

    torch.manual_seed(0)
    base = LlamaForCausalLM(llama_config(vocab=64, hidden=32, positions=32, num_hidden_layers=1))
    return apply_lora(base, LoraParams(enabled=True, r=4, use_dora=True), gradient_checkpointing=False)


def test_loraplus_trains_the_b_matrices_at_ratio_times_the_rate_through_the_schedule():
    """``train.model.lora.loraplus_lr_ratio`` (LoRA+: B learns ``ratio`` times faster than A): the B
    matrices in a group of their own with that learning-rate scale, decayed as the other matrices, and the
    1-D trainable parameters (DoRA's magnitudes) at that scale undecayed, as peft's
    ``create_loraplus_optimizer`` groups them; A as before; the schedule keeps the ratio at every step,
    warm-up and decay included, through the training run's own optimizer set-up."""
    from fastlm.engine.config import parse_train_params
    from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
    from fastlm.engine.train.step import make_optimization

    model = lora_model()
    groups = by_name(parameter_groups(model, 0.1, lora_b_ratio=16.0))
    assert names(model, groups["lora_b"]["params"]) == {
        name for name, p in model.named_parameters() if "lora_B" in name
    }
    assert groups["lora_b"]["lr_scale"] == 16.0 and groups["lora_b"]["weight_decay"] == 0.1
    assert all("lora_A" in name for name in names(model, groups["decay"]["params"]))
    assert not groups["no_decay"]["params"]
    magnitudes = names(model, groups["lora_b_no_decay"]["params"])
    assert magnitudes and all("magnitude" in name for name in magnitudes)
    assert groups["lora_b_no_decay"]["lr_scale"] == 16.0 and groups["lora_b_no_decay"]["weight_decay"] == 0
    plain = by_name(parameter_groups(model, 0.1))  # off by default
    assert set(plain) == {"decay", "no_decay"} and names(model, plain["no_decay"]["params"]) == magnitudes
    raw = {
        "model": {"name_or_path": "base", "lora": {"enabled": True, "loraplus_lr_ratio": 16}},
        "optimizer": {"lr": 1e-3, "warmup_steps": 2},
        "runtime": {"float8": "off"},
    }
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", compile=False, num_threads=1))
    opt = make_optimization(model, parse_train_params(raw), runtime, total_steps=6)
    for _ in range(6):
        rates = {group["name"]: group["lr"] for group in opt.optimizer.param_groups}
        assert rates["lora_b"] == pytest.approx(16 * rates["decay"], rel=1e-12) and rates["decay"] > 0
        assert rates["lora_b_no_decay"] == rates["lora_b"]
        opt.optimizer.step()
        opt.scheduler.step()


def test_loraplus_without_lora_is_refused_in_one_line():
    from fastlm.engine.config import parse_train_params
    from fastlm.errors import ConfigError

    with pytest.raises(ConfigError, match="loraplus_lr_ratio") as error:
        parse_train_params({"model": {"lora": {"enabled": False, "loraplus_lr_ratio": 16}}})
    assert "\n" not in str(error.value)


def test_loraplus_trains_an_adapted_embeddings_b_at_the_ratio_and_groups_the_rest_as_peft():
    """An adapted embedding (``target_modules`` naming ``embed_tokens``: peft's ``lora_embedding_A`` and
    ``lora_embedding_B``) under LoRA+ follows LoRA+'s rule: its B (r -> hidden, the side a linear adapter's
    B is on) at the ratio, its A at the base rate, both decayed as the other adapter matrices. Every other
    trainable tensor gets the rate relative to the base and the decay peft's ``create_loraplus_optimizer``
    gives it; peft's one difference is its embedding group, both embedding adapters at the absolute
    ``loraplus_lr_embedding`` (1e-6 by default)."""
    from peft.optimizers import create_loraplus_optimizer

    from fastlm.engine.config import LoraParams
    from fastlm.engine.model.lora import apply_lora
    from tests.support.toy_training import toy_model

    lr, ratio = 2.0**-10, 16.0  # powers of two: the rates' quotients are exact
    targets = ["q_proj", "v_proj", "embed_tokens"]
    lora = LoraParams(enabled=True, r=4, target_modules=targets, loraplus_lr_ratio=ratio)
    model = apply_lora(toy_model(), lora, gradient_checkpointing=False)
    trained = {name: param for name, param in model.named_parameters() if param.requires_grad}

    def rates(optimizer) -> dict[str, tuple[float, float]]:
        """Each trainable tensor's (rate / base rate, weight decay), by name."""
        names_of = {id(param): name for name, param in trained.items()}
        return {
            names_of[id(param)]: (group["lr"] / lr, group["weight_decay"])
            for group in optimizer.param_groups
            for param in group["params"]
        }

    optimizer = make_adamw(model, lr=lr, weight_decay=0.1, lora_b_ratio=ratio)
    assert sum(len(group["params"]) for group in optimizer.param_groups) == len(trained)  # each once
    ours = rates(optimizer)
    expected = {
        "lora_embedding_A": (1.0, 0.1),
        "lora_embedding_B": (ratio, 0.1),
        "lora_A": (1.0, 0.1),
        "lora_B": (ratio, 0.1),
    }
    kinds = {name: next(kind for kind in expected if kind in name.split(".")) for name in trained}
    assert sorted(set(kinds.values())) == sorted(expected)
    assert ours == {name: expected[kind] for name, kind in kinds.items()}

    peft = rates(
        create_loraplus_optimizer(
            model, torch.optim.AdamW, lr=lr, loraplus_lr_ratio=ratio, loraplus_weight_decay=0.1
        )
    )
    embedding = {name for name, kind in kinds.items() if kind.startswith("lora_embedding_")}
    assert len(embedding) == 2 and len(trained) > 2
    assert {name: peft[name] for name in trained if name not in embedding} == {
        name: ours[name] for name in trained if name not in embedding
    }
    assert {peft[name] for name in embedding} == {(1e-6 / lr, 0.1)}
