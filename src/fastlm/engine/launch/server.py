"""What the launcher's forkserver imports first, before the engine (``workers._server_or_spawn``).

The server is a fresh interpreter: without the launcher's logging settings, what third-party modules log
while the engine is imported (torchao reporting each optional kernel its build lacks, torch's deprecation
notes) would print at every run, where the launcher's settings (a ``kedro`` project's conf/logging.yml)
silence it. The launcher hands its loggers' levels over in ``LEVELS_VARIABLE`` (removed here, so that no
worker inherits it); importing this module sets them, and the server imports the engine after it.

The server ignores SIGTERM and SIGHUP. A stop sent to the whole process group (Slurm's cancel, a pre-emption,
``timeout``, a closed terminal) reaches it too, and the launcher's agent watches its workers through the
server's pipes: with the server dead, the agent took every worker for ended, neither waited for them to save
their step nor stopped them, and they trained on, orphaned. The server still ends with its launcher (its pipe
from the launcher closes); each worker puts the default handlers back (``workers._worker``).
"""

from __future__ import annotations

import json
import logging
import os
import signal

LEVELS_VARIABLE = "FASTLM_WORKER_SERVER_LOG_LEVELS"


def logger_levels() -> dict[str, int]:
    """This process's loggers that have a level of their own (the root's included), by name."""
    loggers = {"": logging.getLogger()}
    loggers.update(
        (name, logger)
        for name, logger in logging.root.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    )
    return {name: logger.level for name, logger in loggers.items() if logger.level != logging.NOTSET}


def _apply_levels(levels: dict[str, int]) -> None:
    for name, level in levels.items():
        logging.getLogger(name or None).setLevel(level)


SERVER_IGNORES = (signal.SIGTERM, signal.SIGHUP)

_handed = os.environ.pop(LEVELS_VARIABLE, None)
if _handed is not None:  # imported by the launcher's forkserver as it starts (the launcher imports it too)
    _apply_levels(json.loads(_handed))
    for _signum in SERVER_IGNORES:
        signal.signal(_signum, signal.SIG_IGN)
