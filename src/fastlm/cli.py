"""Project CLI: Kedro's own ``run``, with user errors reported as one line and a non-zero exit.

Kedro picks up ``cli`` from ``<package>.cli`` and lets its commands override the built-in ones.
``--pipeline=NAME`` (singular, what most users type) is accepted as ``--pipelines=NAME`` without a
deprecation warning.
"""

from __future__ import annotations

import logging
import sys

import click
from kedro.framework.cli.project import run as kedro_run

from fastlm.errors import find_user_error


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
        user_error = find_user_error(exc)
        if user_error is None:
            raise
        logging.shutdown()
        click.secho(f"fastlm: error: {user_error}", fg="red", err=True)
        sys.exit(user_error.exit_code)


run = click.Command(
    name="run",
    params=list(kedro_run.params),
    callback=_run,
    help=kedro_run.help,
    short_help=kedro_run.short_help,
)
cli.add_command(run)
