"""The project's pipelines, one sub-package each (nodes and their wiring).

Imported first in a worker process of Kedro's ParallelRunner, whose tasks name the nodes here: a worker
that was spawned (``KEDRO_MP_CONTEXT=spawn`` or ``forkserver`` on Linux, the default on macOS) sets up the
project's settings here. Kedro's own set-up of such a worker needs the project's package name, which a
spawned worker does not inherit (None there), so it never ran: the worker had none of the project's hooks,
no secret masking of its log records, and the plugins' own hooks in their place (kedro-mlflow's logged each
node's parameters unmasked into the run). The package name stays unset: Kedro's set-up, were it to run,
hands the logging configuration object to itself (a self-referring configuration: the worker's next task
fails).
"""

from __future__ import annotations

import multiprocessing
import sys


def set_up_a_spawned_parallel_runner_worker() -> None:
    """In a spawned or forkserver-started worker of Kedro's ParallelRunner (its ``Task`` class is unpickled
    before the node it runs) with no project set up: the project's settings and pipelines, as
    ``kedro.framework.project.configure_project`` sets them (the logging is conf/logging.yml's already).
    Nothing in the main process, a forked worker (the parent's set-up) or another child process (the
    training workers, which import the train nodes without Kedro's runner)."""
    if multiprocessing.parent_process() is None or "kedro.runner.task" not in sys.modules:
        return
    from kedro.framework import project

    package = __name__.split(".")[0]
    if project.PACKAGE_NAME is None and not project.settings.configured:
        project.settings.configure(f"{package}.settings")
        project.pipelines.configure(f"{package}.pipeline_registry")


set_up_a_spawned_parallel_runner_worker()
