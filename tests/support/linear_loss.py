"""Inputs shared by the tests of the fused linear cross-entropy (ours and the liger contract): a head's
hidden states, weight, bias and targets (a prompt and padding ignored), a packed completion-only batch, a tiny
Llama, and one training step's loss and gradients."""

import torch

from tests.support.tiny_models import llama_config

TOKENS, HIDDEN, VOCAB = 37, 16, 301
RANK = 4  # a LoRA head's
IGNORE = -100


def inputs(dtype=torch.float32, bias=True):
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(TOKENS, HIDDEN, generator=generator).to(dtype)
    weight = (torch.randn(VOCAB, HIDDEN, generator=generator) / HIDDEN**0.5).to(dtype)
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=generator)
    targets[3:9] = IGNORE  # a prompt
    targets[-4:] = IGNORE  # padding
    return (
        hidden,
        weight,
        (torch.randn(VOCAB, generator=generator) * 0.1).to(dtype) if bias else None,
        targets,
    )


def loss_and_grads(function, hidden, weight, bias, targets, **kwargs):
    leaves = [x.clone().requires_grad_() if x is not None else None for x in (hidden, weight, bias)]
    loss = function(leaves[0], leaves[1], targets, leaves[2], **kwargs)
    (loss / 5).backward()
    return loss.detach(), [leaf.grad if leaf is not None else None for leaf in leaves]


PACKED_LAYOUT = ((12, 8), (7, 0), (15, 11), (5, 2), (9, 6), (3, 0))  # (length, prompt length) per sample


def packed_batch(vocab: int, attn: str = "sdpa", layout=PACKED_LAYOUT):
    """Packed rows with prompts (completion-only labels) and the target positions the collator marks;
    ``layout``: each sample's (length, prompt length), another layout another batch shape."""
    from fastlm.engine.data import PackedCollator
    from fastlm.engine.data.packing import TokenBudget
    from fastlm.engine.model.attention.inputs import to_device

    generator = torch.Generator().manual_seed(3)
    features = [
        {"input_ids": torch.randint(3, vocab, (n,), generator=generator).tolist(), "prompt_length": p}
        for n, p in layout
    ]
    collator = PackedCollator(
        pad_id=0,
        budget=TokenBudget(row_length=20, rows_per_batch=4),
        pad_to_multiple_of=8,
        attention_mask_format="none",
    )
    return to_device(collator(features), torch.device("cpu"), attn)


def tiny_llama(vocab: int = VOCAB, **config):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config(vocab=vocab, hidden=32, positions=128, **config))
    model.config._attn_implementation = "sdpa"
    return model


def step_loss_and_grads(model, batches, **kwargs):
    from fastlm.engine.model.accumulation import accumulate_gradients

    model.zero_grad(set_to_none=True)
    loss_sum, targets = accumulate_gradients(model, batches, **kwargs)
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss_sum / targets, grads


def lora_head_model(kind: str = "peft", dropout: float = 0.0, base_dtype=torch.float32, **config):
    """A tiny Llama (frozen weights in ``base_dtype``) whose LoRA adapters include the LM head, peft's forward
    (``peft``) or fastlm's (``fastlm``: ``lora.apply_lora``, fused forward and shared-input groups, fp32
    adapters), each B drawn at random (peft's zeros would leave every A without a gradient)."""
    from peft import LoraConfig, get_peft_model

    from tests.support.lora_checks import nonzero_lora_b

    targets = ["q_proj", "v_proj", "lm_head"]
    if kind == "fastlm":
        from fastlm.engine.config import parse_train_params
        from fastlm.engine.model import lora

        raw = {"enabled": True, "r": RANK, "target_modules": targets, "dropout": dropout, **config}
        model = lora.apply_lora(
            tiny_llama(),
            parse_train_params({"model": {"lora": raw}}).model.lora,
            gradient_checkpointing="off",
        )
    else:
        model = get_peft_model(
            tiny_llama().to(base_dtype),
            LoraConfig(r=RANK, target_modules=targets, lora_dropout=dropout, **config),
        )
    nonzero_lora_b(model)
    return model


def seeded_step(model, batches, **kwargs):
    """One training step's loss and gradients, the LoRA dropout masks drawn from one seed."""
    torch.manual_seed(11)
    return step_loss_and_grads(model, batches, **kwargs)


def cuda_step_against_ours(kernel: str, vocab: int = VOCAB, precision: str = "fp32"):
    """One optimizer step of a tiny Llama whose fused head runs ``kernel`` (``train.loss.
    fused_linear_kernel``) on a "CUDA" run (its stand-in module in place), against the same step with ours on
    CPU, both at ``precision``: (the step's fused-head choice, its result, ours)."""
    import copy
    import dataclasses

    from fastlm.engine.config import parse_train_params
    from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
    from fastlm.engine.train.step import make_optimization, train_step

    raw = {
        "loss": {"fused_linear": True, "fused_linear_kernel": kernel},
        "model": {"liger": "off"},
        "runtime": {"float8": "off", "compile": False, "precision": precision},
    }
    ours_raw = {**raw, "loss": {"fused_linear": True, "fused_linear_kernel": "fastlm"}}
    cpu = setup_runtime(RuntimeConfig(device="cpu", precision=precision, compile=False))
    model = tiny_llama(vocab)
    twin = copy.deepcopy(model)
    cuda = dataclasses.replace(cpu, device=torch.device("cuda"))
    opt = make_optimization(model, parse_train_params(raw), cuda, total_steps=2)
    reference = make_optimization(twin, parse_train_params(ours_raw), cpu, total_steps=2)
    assert reference.fused_head.kernel == "fastlm"
    batches = [packed_batch(vocab)]
    return (
        opt,
        train_step(model, batches, opt, runtime=cpu),
        train_step(twin, batches, reference, runtime=cpu),
    )
