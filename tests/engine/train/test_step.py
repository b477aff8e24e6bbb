"""One optimizer step: ``train_step``'s update equals AdamW's first step written out by hand on the
token-mean loss's gradients, and it reports the loss sum, the target count and the rate it used."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from fastlm.engine.train.step import Optimization, train_step
from tests.support.tolerances import OTHER_FP32_KERNEL_GRAD, OTHER_FP32_MODEL, TRAINED_FP32_WEIGHTS
from tests.support.toy_training import VOCAB, toy_model

pytestmark = pytest.mark.kernels

LR, BETAS, EPS, DECAY = 1e-3, (0.9, 0.95), 1e-8, 0.1


def _batch() -> dict:
    input_ids = torch.randint(2, VOCAB, (2, 10), generator=torch.Generator().manual_seed(3))
    labels = input_ids.clone()
    labels[0, :4] = -100  # a prompt left out of the loss
    return {"input_ids": input_ids, "labels": labels}


def _optimization(model) -> Optimization:
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=DECAY)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    return Optimization(model, optimizer, scheduler, torch.amp.GradScaler("cpu", enabled=False), math.inf)


def test_one_step_is_adamw_first_step_on_the_token_mean_gradient():
    """Two comparisons, each with the tolerance of its own computation: the gradients the optimizer saw
    against a plain backward of the token-mean loss, and the update against AdamW's first step written out on
    those same gradients (on the hand backward's gradients, an entry within ~eps of zero flips g / |g| from
    one CPU kernel set to another)."""
    model, batch = toy_model(), _batch()
    by_hand = copy.deepcopy(model)
    logits = by_hand(input_ids=batch["input_ids"]).logits
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), batch["labels"][:, 1:].reshape(-1))
    loss.backward()
    targets = int((batch["labels"][:, 1:] != -100).sum())
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", compile=False, num_threads=1))
    opt = _optimization(model)
    seen = {}
    opt.optimizer.register_step_pre_hook(
        lambda optimizer, args, kwargs: seen.update(
            {id(p): p.grad.clone() for group in optimizer.param_groups for p in group["params"]}
        )
    )

    result = train_step(model, [batch], opt, runtime=runtime)

    assert result.target_tokens == targets and result.lr == LR
    torch.testing.assert_close(result.loss_sum / targets, loss.detach(), **OTHER_FP32_MODEL)
    for (name, after), before in zip(model.named_parameters(), by_hand.parameters(), strict=True):
        grad = seen[id(after)]
        torch.testing.assert_close(grad, before.grad, **OTHER_FP32_KERNEL_GRAD, msg=name)
        # AdamW's first step: bias-corrected m / sqrt(v) is g / |g|, decoupled weight decay first
        expected = before.detach() * (1 - LR * DECAY) - LR * grad / (grad.abs() + EPS)
        torch.testing.assert_close(after.detach(), expected, **TRAINED_FP32_WEIGHTS, msg=name)
        assert after.grad is None  # gradients are zeroed (set to None) after the step


def test_the_fused_head_is_chosen_once_and_every_step_runs_that_one(monkeypatch):
    import fastlm.engine.train.step as step_module
    from fastlm.engine.config import parse_train_params
    from fastlm.engine.model.accumulation import FusedHead

    params = parse_train_params({"loss": {"fused_linear": True}, "runtime": {"float8": "off"}})
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", compile=False, num_threads=1))
    model = toy_model()
    opt = step_module.make_optimization(model, params, runtime, total_steps=3)
    assert isinstance(opt.fused_head, FusedHead)
    assert opt.fused_head.head is model.get_output_embeddings() and opt.fused_head.kernel == "fastlm"
    seen, accumulate = [], step_module.accumulate_gradients

    def recording(*args, **kwargs):
        seen.append(kwargs["fused_head"])
        return accumulate(*args, **kwargs)

    monkeypatch.setattr(step_module, "accumulate_gradients", recording)
    for _ in range(2):
        train_step(model, [_batch()], opt, runtime=runtime)
    assert len(seen) == 2 and all(head is opt.fused_head for head in seen)
