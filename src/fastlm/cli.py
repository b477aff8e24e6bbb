"""Project CLI: Kedro's own ``run``, with user errors reported as one line and a non-zero exit.

Kedro picks up ``cli`` from ``<package>.cli`` and lets its commands override the built-in ones.
``--pipeline=NAME`` (singular, what most users type) is accepted as ``--pipelines=NAME`` without a
deprecation warning.
"""

from __future__ import annotations

import importlib.util
import logging
import pkgutil
import sys

import click
from kedro.framework.cli.project import run as kedro_run

import fastlm.pipelines
from fastlm.errors import ConfigError, FastlmError, find_user_error
from fastlm.redaction import redact_text


@click.group(name="fastlm")
def cli() -> None:
    """fastlm project commands."""


def _run(**kwargs):
    if kwargs.get("pipeline") and not kwargs.get("pipelines"):
        kwargs["pipelines"] = [name.strip() for name in kwargs["pipeline"].split(",") if name.strip()]
        kwargs["pipeline"] = None
    try:
        return kedro_run.callback(**kwargs)
    except Exception as exc:  # noqa: BLE001 - re-raised unless it is a user error
        user_error = find_user_error(exc) or _pipeline_selection_error(exc, kwargs.get("pipelines") or [])
        if user_error is None:
            raise
        logging.shutdown()
        click.secho(f"fastlm: error: {redact_text(str(user_error))}", fg="red", err=True)
        sys.exit(user_error.exit_code)


def _pipeline_selection_error(exc: Exception, names: list[str]) -> FastlmError | None:
    """Kedro's ValueErrors for an unknown or empty pipeline, as one line."""
    message = str(exc)
    unknown = [name for name in names if importlib.util.find_spec(f"fastlm.pipelines.{name}") is None]
    if unknown and isinstance(exc, ImportError | ValueError):
        known = sorted(info.name for info in pkgutil.iter_modules(fastlm.pipelines.__path__) if info.ispkg)
        return ConfigError(f"unknown pipeline {', '.join(unknown)!r}.", fix=f"use one of: {', '.join(known)}.")
    if not isinstance(exc, ValueError):
        return None
    if "Pipeline contains no nodes" in message:
        return ConfigError(
            f"pipeline {', '.join(names) or '__default__'!r} has no nodes in this version of fastlm (or none left "
            "after your --tags/--nodes filters).",
            fix="run `kedro run --pipeline=split`, or check the filters.",
        )
    return None


run = click.Command(
    name="run",
    params=list(kedro_run.params),
    callback=_run,
    help=kedro_run.help,
    short_help=kedro_run.short_help,
)
cli.add_command(run)
