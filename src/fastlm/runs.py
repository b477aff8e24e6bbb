"""Run names: one name per ``kedro run`` for the MLflow run, the checkpoint folder, the per-run model and
report copies and the report title.

``run_name`` is a top-level parameter (``--params run_name=lora-r16``). Without one the name is the pipeline
and a timestamp (``train-20261123-041428``, ``main-…`` for the default pipeline), except that a run which
trains with ``train.resume: auto`` takes the name of the newest interrupted run (a run folder whose newest
checkpoint stopped before that run's total), so the same command run again continues it. The hooks resolve
the name once, before any node runs (``fastlm.hooks.RunNameHook``).

Kedro-free: the hook passes the pipeline names and the checkpoint folder in.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from pathlib import Path

from fastlm.engine.checkpoint import unfinished_runs
from fastlm.errors import ConfigError

MAX_LENGTH = 100
_SAFE = re.compile(r"^[^\W_][\w.+-]*$")  # letters (any script), digits, then also . _ + -
_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}


def validate_run_name(name) -> str:
    """``name`` when it is a safe folder name on every OS Kedro runs on, else one ConfigError line."""
    text = name if isinstance(name, str) else repr(name)
    if (not isinstance(name, str) or not _SAFE.match(name) or len(name) > MAX_LENGTH or name.endswith(".")
            or ".." in name or name.split(".")[0].lower() in _RESERVED):
        raise ConfigError(
            f"run_name {text[:MAX_LENGTH + 10]!r} is not a safe folder name (it names the checkpoint, model and "
            "report folders of the run).",
            fix=f"use up to {MAX_LENGTH} letters, digits, '.', '_', '+' or '-', starting with a letter or digit, "
            "e.g. --params run_name=lora-r16.")
    return name


def default_run_name(pipeline_names: Sequence[str] | None, now: dt.datetime | None = None,
                     launch_id: str | None = None) -> str:
    """The pipeline names and the local time, e.g. ``train-20261123-041428`` (``main`` for the default).

    ``launch_id``: an id every process of one launch shares (torchrun's rendezvous id), used instead of the time
    so that all ranks agree on the name.
    """
    names = [("main" if name == "__default__" else name) for name in (pipeline_names or ["__default__"])]
    suffix = f"torchrun-{launch_id[:8]}" if launch_id else (now or dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    return f"{'+'.join(names)}-{suffix}"


def resolve_run_name(given, pipeline_names: Sequence[str] | None, checkpoint_base: Path, *, resume: str,
                     trains: bool, now: dt.datetime | None = None, launch_id: str | None = None) -> str:
    """The run's name: ``given`` (validated); else, for a training run with ``resume: auto``, the newest
    interrupted run under ``checkpoint_base``; else :func:`default_run_name`."""
    if given is not None:
        return validate_run_name(given)
    if trains and resume == "auto":
        interrupted = unfinished_runs(checkpoint_base)
        if interrupted:
            return interrupted[0].name
    return validate_run_name(default_run_name(pipeline_names, now, launch_id))
