"""The messages a module logs during a test: in-process Kedro sessions reset the logging configuration, so a
module's ``log`` is replaced by a standalone logger whose records are kept."""

from __future__ import annotations

import logging


def module_log_lines(monkeypatch, module) -> list[str]:
    """The messages ``module.log`` logs from now on (formatted), in order."""
    lines: list[str] = []
    logger = logging.Logger(f"captured-{module.__name__}")
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger.addHandler(handler)
    monkeypatch.setattr(module, "log", logger)
    return lines
