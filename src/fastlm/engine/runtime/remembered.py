"""Measured runtime choices kept per machine, model and micro-batch shape (``runtime.precision: auto`` on a
CPU, ``probe.probe_runtime``; ``compile: auto``'s and ``float8: auto``'s timings too, under keys of their
own).

The probe times fp32 and bf16 on the run's first micro-batch and keeps bf16 at ``probe.MIN_SPEEDUP`` or
more. Where the two sit near that margin, run-to-run noise decided: the same command on the same data trained
in bf16 one time and in fp32 the next, with other losses. The first measurement is kept in a small JSON file
(the train node gives ``<train.checkpoint_dir>/runtime_choices.json``), under a key of everything that decides
the speed (:func:`choice_key`: the CPU, its thread count and kernel set, the torch build, the model's
parameters and the micro-batch shape); a later run with the same key trains in the same precision and says
where it came from. Another key (a new torch, another model or batch shape, more threads) is measured again;
deleting the file measures everything again. A file that cannot be read is measured over and written anew
(one warning); one that cannot be written leaves the run as measured (one warning). It is written once, when
the probe measures (before the first step), atomically (``temporary_files.write_file_atomically``). Two
trainings of other run names share it: each reads it, adds its entry and writes it under an exclusive lock
(``temporary_files.held_exclusively`` on ``.runtime_choices.json.lock`` beside it), so neither writes over the
other's entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from fastlm.engine.model.recompute import checkpointing_in_use
from fastlm.engine.observe import strict_json
from fastlm.engine.runtime.environment import Runtime
from fastlm.temporary_files import held_exclusively, write_file_atomically

log = logging.getLogger(__name__)

CHOICES_FILE = "runtime_choices.json"
VERSION = 1
# the micro-batch tensors whose shapes set the matmul sizes (the others follow from them)
SHAPED = ("input_ids", "decoder_input_ids")


def choice_key(runtime: Runtime, model: torch.nn.Module, batch: Mapping) -> dict:
    """What decides how fast a precision runs here: the device and CPU, threads, kernel set
    (``ATEN_CPU_CAPABILITY``), torch build, the model (its class, attention path, gradient checkpointing and
    every parameter's name, shape, dtype and trainability, hashed) and the micro-batch's shape; on CUDA also
    the GPU's name and the CUDA build (the file sits in ``train.checkpoint_dir``, which a shared filesystem
    gives nodes of other GPUs; a CPU's key is as it was)."""
    parameters = sorted(
        [name, list(param.shape), str(param.dtype).removeprefix("torch."), param.requires_grad]
        for name, param in model.named_parameters()
    )
    config = getattr(model, "config", None)
    checkpointing = checkpointing_in_use(model)  # which layers run their forward again in backward
    described = [
        type(model).__name__,
        getattr(config, "_attn_implementation", None),
        checkpointing,
        parameters,
    ]
    gpu = {"gpu": runtime.device_name, "cuda": runtime.cuda_version} if runtime.device.type == "cuda" else {}
    return {
        "device": runtime.device.type,
        **gpu,
        "cpu": _cpu_name(),
        "threads": runtime.num_threads,
        "kernels": os.environ.get("ATEN_CPU_CAPABILITY") or "default",
        "torch": runtime.torch_version,
        "model": hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16],
        "batch": {
            name: list(batch[name].shape) for name in SHAPED if isinstance(batch.get(name), torch.Tensor)
        },
    }


@dataclass(frozen=True)
class RememberedChoices:
    """The choices file at ``path`` (module docstring)."""

    path: Path

    def get(self, key: dict) -> dict | None:
        """The record kept under ``key`` (``precision``, ``reason``, ``measured``), or None."""
        record = self._entries(warn=True).get(_digest(key))
        return record if isinstance(record, dict) else None

    def put(self, key: dict, record: dict) -> None:
        """Keep ``record`` under ``key`` with the entries the file holds when it is written: read, merged and
        written atomically under the file's lock (another run's entry kept); a failure warns and changes
        nothing else."""
        measured = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with held_exclusively(self.path.with_name(f".{self.path.name}.lock")):
                entries = self._entries(warn=False)
                entries[_digest(key)] = {**record, "measured": measured, "key": key}
                text = strict_json.dumps(
                    {"version": VERSION, "choices": entries}, indent=1, ensure_ascii=False
                )
                write_file_atomically(self.path, lambda handle: handle.write(text))
        except OSError as error:
            log.warning(
                "runtime choice not kept in %s (%s: %s): the next run measures again",
                self.path,
                type(error).__name__,
                error,
            )

    def _entries(self, *, warn: bool) -> dict:
        try:
            stored = strict_json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            stored = error
        if isinstance(stored, dict) and stored.get("version") == VERSION:
            if isinstance(stored.get("choices"), dict):
                return dict(stored["choices"])
        if warn:
            log.warning(
                "%s cannot be read (%s): the runtime choice is measured again and the file written anew",
                self.path,
                stored if isinstance(stored, Exception) else "not a choices file of this version",
            )
        return {}


def _digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
