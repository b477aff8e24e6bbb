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

from fastlm.errors import ConfigError

MAX_LENGTH = 100
ACCEPTED = (
    f"1 to {MAX_LENGTH} letters, digits, '.', '_', '+' or '-' (letters of any script), starting "
    "with a letter or digit, not ending with '.', without '..' and not a Windows device name (con, "
    "prn, aux, nul, com0-9, lpt0-9)"
)
_FIRST = re.compile(r"[^\W_]")  # a letter (any script) or a digit
_CHARACTER = re.compile(r"[\w.+-]")
_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}


def validate_run_name(name) -> str:
    """``name`` when it is a safe folder name on every OS Kedro runs on, else one ConfigError line that says
    which rule it broke and what is accepted."""
    why = _refusal(name)
    if why is None:
        return name
    if isinstance(name, str):
        fix = f"rename it, e.g. --params run_name={_safe_version(name) or 'lora-r16'}."
    else:  # --params (and YAML) read 123 as a number, true as a boolean; 007 as 7, 1.50 as 1.5
        from fastlm.parameters import written_text

        text = written_text("run_name", name)
        if text is None:  # the number read may not be the text typed: it is not shown as that text
            fix = (
                "give a name with a letter, e.g. --params run_name=run-<name>, or quote the name as written "
                'so that it stays text: --params \'run_name="<name as written>"\' (run_name: "<name as '
                'written>" in a parameters file).'
            )
        else:
            fix = (
                f"give a name with a letter, e.g. --params run_name=run-{text}, or quote it so that it stays "
                f'text: --params \'run_name="{text}"\' (run_name: "{text}" in a parameters file).'
            )
    shown = repr(name[: MAX_LENGTH + 10]) if isinstance(name, str) else str(name)[: MAX_LENGTH + 10]
    raise ConfigError(
        f"run_name {shown} is not a safe folder name: {why}. A run name names the checkpoint, "
        f"model and report folders of the run: {ACCEPTED}.",
        fix=fix,
    )


def _refusal(name) -> str | None:
    """Why ``name`` is not a safe run name (the first rule it breaks), or None."""
    if isinstance(name, bool):
        return f"{name} is a boolean, not text (--params and YAML read true or false as one)"
    if isinstance(name, int | float):
        return (
            f"{name!r} is a number ({type(name).__name__}), not text (--params and YAML read 123, 1.5 or "
            "1e3 as one)"
        )
    if not isinstance(name, str):
        return f"it is a {type(name).__name__}, not text"
    if not name:
        return "it is empty"
    if len(name) > MAX_LENGTH:
        return f"it is {len(name)} characters long"
    if not _FIRST.match(name[0]):
        return f"it starts with {_character(name[0])}"
    bad = next((character for character in name if not _CHARACTER.fullmatch(character)), None)
    if bad is not None:
        return f"it contains {_character(bad)}"
    if ".." in name:
        return "it contains '..'"
    if name.endswith("."):
        return "it ends with '.'"
    if name.split(".")[0].lower() in _RESERVED:
        return f"{name} is a device name on Windows"
    return None


def _character(character: str) -> str:
    return "' ' (a space)" if character == " " else repr(character)


def _safe_version(name: str) -> str | None:
    """``name`` with what is refused replaced or dropped, when that leaves a safe name."""
    safe = re.sub(r"\.{2,}", ".", re.sub(r"[^\w.+-]+", "-", name))
    safe = re.sub(r"^[\W_]+", "", safe)[:MAX_LENGTH].rstrip(".")
    return safe if safe and _refusal(safe) is None else None


def default_run_name(
    pipeline_names: Sequence[str] | None, now: dt.datetime | None = None, launch_id: str | None = None
) -> str:
    """The pipeline names and the local time, e.g. ``train-20261123-041428`` (``main`` for the default).

    ``launch_id``: an id every process of one launch shares (torchrun's rendezvous id), used instead of the
    time so that all ranks agree on the name.
    """
    names = [("main" if name == "__default__" else name) for name in (pipeline_names or ["__default__"])]
    suffix = (
        f"torchrun-{launch_id[:8]}" if launch_id else (now or dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    )
    return f"{'+'.join(names)}-{suffix}"


def resolve_run_name(
    given,
    pipeline_names: Sequence[str] | None,
    checkpoint_base: Path,
    *,
    resume: str,
    trains: bool,
    now: dt.datetime | None = None,
    launch_id: str | None = None,
) -> str:
    """The run's name: ``given`` (validated); else, for a training run with ``resume: auto``, the newest
    interrupted run under ``checkpoint_base``; else :func:`default_run_name`."""
    if given is not None:
        return validate_run_name(given)
    if trains and resume == "auto":
        from fastlm.engine.checkpoint.discovery import unfinished_runs  # reads checkpoints: torch

        interrupted = unfinished_runs(checkpoint_base)
        if interrupted:
            return interrupted[0].name
    return validate_run_name(default_run_name(pipeline_names, now, launch_id))
