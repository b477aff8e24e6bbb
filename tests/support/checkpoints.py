"""Checkpoint test helpers shared by tests/engine/checkpoint: a tiny Llama trained two steps, saved with a
known trainer state (the ``trained`` fixture in that folder's conftest builds it)."""

from __future__ import annotations

import random

import numpy as np
import torch

from fastlm.engine.checkpoint.files import save_checkpoint
from tests.support.tiny_models import CHECKPOINT_VOCAB as VOCAB
from tests.support.tiny_models import checkpoint_llama, optimizer_and_scheduler

STATE = {
    "step": 2,
    "epoch": 0,
    "position": 17,
    "history": [{"step": 1, "loss": 4.5}],
    "config_digest": "ab12",
}


def batch(seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(seed))


def train_step(model, optimizer, scheduler, input_ids: torch.Tensor) -> None:
    loss = model(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def draw_rngs() -> tuple:
    return torch.rand(4).tolist(), [random.random() for _ in range(3)], np.random.rand(4).tolist()


def save(root, step, model, optimizer, scheduler, **kwargs):
    return save_checkpoint(
        root,
        step,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        state={**STATE, "step": step},
        **kwargs,
    )


def steps_on_disk(root) -> list[str]:
    return sorted(path.name for path in root.iterdir())


def trained_llama():
    """A tiny Llama with its AdamW and schedule after two steps (the state a checkpoint saves)."""
    model = checkpoint_llama()
    optimizer, scheduler = optimizer_and_scheduler(model)
    for seed in range(2):
        train_step(model, optimizer, scheduler, batch(seed))
    return model, optimizer, scheduler
