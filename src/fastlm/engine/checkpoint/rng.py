"""The random-number generator states a checkpoint saves and restores, so a resumed run draws the same numbers
(dropout, data order) as an uninterrupted one.

The torch CPU state and every CUDA device's state are tensors (``rng.pt``, loaded with ``weights_only=True``);
the Python ``random`` and NumPy global states are plain JSON lists (``trainer_state.json``), so nothing needs
pickle. Those are rank 0's; a run of several processes also keeps every rank's states, in rank order, in
``rng.pt``'s ``ranks`` entry (:func:`rank_rng_state`: each rank draws its own numbers, for dropout or noise
over micro-batches of its own lengths), and each rank restores its own (:func:`states_of_rank`).
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)


def torch_rng_state() -> dict:
    """The torch CPU RNG state and, when CUDA is available, every CUDA device's (``rng.pt``)."""
    rng: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def host_rng_state() -> dict:
    """The Python and NumPy global RNG states as JSON values (``trainer_state.json``'s ``rng`` entry)."""
    return {"python": _python_rng_state(), "numpy": _numpy_rng_state()}


def rank_rng_state() -> dict:
    """This process's RNG states as an entry of ``rng.pt``'s ``ranks`` list: :func:`torch_rng_state`'s
    tensors and :func:`host_rng_state` as a JSON string (``weights_only`` loads strings, not NumPy)."""
    return {**torch_rng_state(), "host": json.dumps(host_rng_state())}


def states_of_rank(
    torch_states: dict, host_states: dict, *, rank: int, world_size: int, saved_world_size: int, where: object
) -> tuple[dict, dict]:
    """The torch and host states ``rank`` of ``world_size`` processes restores from a checkpoint's
    (``rng.pt``'s and ``trainer_state.json``'s, rank 0's): its own where the checkpoint kept every rank's
    and was written by as many processes; rank 0's otherwise (one process; another number of processes,
    whose ranks read other data than the saved ones). A checkpoint of as many processes written before
    every rank's states were kept: rank 0's, with one warning (on rank 0) that the ranks after it draw
    other numbers than the uninterrupted run; ``where`` names the checkpoint in it."""
    ranks = torch_states.get("ranks")
    if world_size > 1 and isinstance(ranks, list) and len(ranks) == world_size == saved_world_size:
        mine = ranks[rank]
        return mine, json.loads(mine["host"])
    if world_size > 1 and ranks is None and saved_world_size == world_size and rank == 0:
        log.warning(
            "%s holds rank 0's random states only (written by an earlier fastlm): every rank continues from "
            "them, so ranks 1 to %d draw other numbers (dropout, noise) than the uninterrupted run did",
            where,
            world_size - 1,
        )
    return torch_states, host_states


def restore_rng_states(torch_states: dict, host_states: dict) -> None:
    """Set the torch, CUDA, Python and NumPy RNGs to the saved states (:func:`torch_rng_state`,
    :func:`host_rng_state`); a state that does not fit raises whatever the RNG raises, for the caller to
    name."""
    torch.set_rng_state(torch_states["torch"])
    _set_cuda_rng_states(torch_states.get("cuda"))
    _set_python_rng_state(host_states["python"])
    _set_numpy_rng_state(host_states["numpy"])


def _set_cuda_rng_states(states: list[torch.Tensor] | None) -> None:
    if not states or not torch.cuda.is_available():
        return
    count = torch.cuda.device_count()
    if len(states) != count:
        log.warning("checkpoint has %d CUDA RNG states, this machine %d devices", len(states), count)
    for index, cuda_state in enumerate(states[:count]):
        torch.cuda.set_rng_state(cuda_state.cpu(), index)


def _python_rng_state() -> dict:
    version, internal, gauss_next = random.getstate()
    return {"version": version, "internal": list(internal), "gauss_next": gauss_next}


def _set_python_rng_state(saved: dict) -> None:
    random.setstate((saved["version"], tuple(saved["internal"]), saved["gauss_next"]))


def _numpy_rng_state() -> dict:
    return _to_json(np.random.get_state(legacy=False))


def _set_numpy_rng_state(saved: dict) -> None:
    np.random.set_state(_from_json(saved))


def _to_json(value: Any) -> Any:
    """NumPy arrays and scalars to plain JSON values (arrays tagged so that :func:`_from_json` restores
    them)."""
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": value.dtype.str}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(key): _to_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_to_json(item) for item in value]
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, dict):
        if "__ndarray__" in value:
            return np.asarray(value["__ndarray__"], dtype=np.dtype(value["dtype"]))
        return {key: _from_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_from_json(item) for item in value]
    return value
