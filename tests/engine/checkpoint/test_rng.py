"""RNG states: what a checkpoint saves restores torch, Python and NumPy so they draw the same numbers again,
and the host states are plain JSON (nothing needs pickle)."""

from __future__ import annotations

import json
import random

import numpy as np
import torch

from fastlm.engine.checkpoint.rng import (
    host_rng_state,
    rank_rng_state,
    restore_rng_states,
    states_of_rank,
    torch_rng_state,
)


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


def _checkpoint_states(ranks: int | None) -> tuple[dict, dict]:
    """``rng.pt``'s and ``trainer_state.json``'s states as a run of ``ranks`` processes saves them (rank 0's,
    and every rank's under ``ranks``); None: as a checkpoint written before every rank's were kept."""
    torch_states, host = torch_rng_state(), host_rng_state()
    if ranks is not None:
        torch_states["ranks"] = []
        for rank in range(ranks):
            torch.manual_seed(100 + rank)
            torch_states["ranks"].append(rank_rng_state())
    return torch_states, host


def test_each_rank_restores_its_own_states(caplog):
    torch_states, host = _checkpoint_states(2)
    for rank in range(2):
        restore_rng_states(
            *states_of_rank(torch_states, host, rank=rank, world_size=2, saved_world_size=2, where="c")
        )
        torch.manual_seed(100 + rank)
        expected = torch.rand(3)
        restore_rng_states(
            *states_of_rank(torch_states, host, rank=rank, world_size=2, saved_world_size=2, where="c")
        )
        assert torch.equal(torch.rand(3), expected)
    assert not caplog.records


def test_an_earlier_checkpoint_of_several_ranks_restores_rank_0s_states_saying_so_once(caplog):
    """Round thirty-two: checkpoints written before every rank's states were kept still load; rank 0 says,
    in one line, that the other ranks continue from its states."""
    import logging

    caplog.set_level(logging.WARNING, logger="fastlm")
    torch_states, host = _checkpoint_states(None)
    for rank in range(2):
        got = states_of_rank(torch_states, host, rank=rank, world_size=2, saved_world_size=2, where="ckpt-4")
        assert got[0] is torch_states and got[1] is host
    (line,) = [record.getMessage() for record in caplog.records]
    assert "ckpt-4" in line and "rank 0's random states only" in line and "\n" not in line


def test_another_number_of_processes_restores_rank_0s_states_without_a_warning(caplog):
    torch_states, host = _checkpoint_states(2)
    for world in (1, 4):
        got = states_of_rank(torch_states, host, rank=0, world_size=world, saved_world_size=2, where="c")
        assert got[0] is torch_states and got[1] is host
    assert not caplog.records
