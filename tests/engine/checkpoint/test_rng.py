"""RNG states: what a checkpoint saves restores torch, Python and NumPy so they draw the same numbers again,
and the host states are plain JSON (nothing needs pickle)."""

from __future__ import annotations

import json
import random

import numpy as np
import torch

from fastlm.engine.checkpoint.rng import host_rng_state, restore_rng_states, torch_rng_state


def _draw() -> tuple:
    return torch.rand(3).tolist(), [random.random() for _ in range(3)], np.random.rand(3).tolist()


def test_restored_states_draw_the_same_numbers_again():
    torch.manual_seed(1), random.seed(2), np.random.seed(3)
    _draw()
    saved_torch, saved_host = torch_rng_state(), json.loads(json.dumps(host_rng_state()))
    first = _draw()
    assert _draw() != first  # the generators moved on
    restore_rng_states(saved_torch, saved_host)
    assert _draw() == first


def test_the_host_state_is_json_and_the_torch_state_a_tensor():
    host = host_rng_state()
    assert json.loads(json.dumps(host)) == host
    assert set(host) == {"python", "numpy"}
    assert isinstance(torch_rng_state()["torch"], torch.Tensor)
