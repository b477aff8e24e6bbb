"""The forkserver's first import (``launch.server``): the launcher's logging levels, set before the engine is
imported, so that what third-party imports log is silenced in the server as in the launcher."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

from fastlm.engine.launch.server import LEVELS_VARIABLE, logger_levels


def test_the_launchers_levels_are_handed_over_and_set_before_anything_heavy_is_imported(monkeypatch):
    monkeypatch.setattr(logging.getLogger("fastlm.test.server"), "level", logging.ERROR)
    levels = logger_levels()
    assert levels["fastlm.test.server"] == logging.ERROR and "" in levels  # the root's too
    probe = (
        "import logging, os, sys; import fastlm.engine.launch.server as server; "
        "print(logging.getLogger('torchao').level, logging.getLogger().level, "
        "server.LEVELS_VARIABLE in os.environ, 'torch' in sys.modules)"
    )
    env = {**os.environ, LEVELS_VARIABLE: json.dumps({"torchao": logging.ERROR, "": logging.INFO})}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    # set, the variable removed (no worker inherits it), and nothing imported yet that could have logged
    assert done.stdout.split() == [str(logging.ERROR), str(logging.INFO), "False", "False"]


def test_the_server_ignores_a_stop_sent_to_the_process_group_and_the_launcher_does_not():
    """Started as the launcher's forkserver (the levels handed over), the server ignores SIGTERM and SIGHUP:
    the agent watches the workers through its pipes, so it must outlive a signal to the whole group. The
    launcher importing the same module keeps its handlers."""
    probe = (
        "import signal; import fastlm.engine.launch.server; "
        "print(*(signal.getsignal(s) is signal.SIG_IGN for s in (signal.SIGTERM, signal.SIGHUP)))"
    )
    as_server = {**os.environ, LEVELS_VARIABLE: "{}"}
    launcher = {name: value for name, value in os.environ.items() if name != LEVELS_VARIABLE}
    outputs = [
        subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
        for env in (as_server, launcher)
    ]
    assert [done.stdout.split() for done in outputs] == [["True", "True"], ["False", "False"]], outputs
