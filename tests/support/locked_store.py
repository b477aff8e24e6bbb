"""An MLflow SQLite store written by another command at the same time: chosen writes of ``MlflowClient`` are
refused once each with SQLite's ``database is locked`` (as after SQLite's own wait), then go through."""

from __future__ import annotations

import sqlite3
from collections import Counter


def store_locked_once(monkeypatch, *names: str) -> list[str]:
    """The ``MlflowClient`` methods ``names`` (``create_run``, ``log_batch``, ``set_terminated``...) raise
    ``database is locked`` on their first call, and a name given twice again on its first call after one that
    went through (the next run's write); the list of those refused so far, in order."""
    import mlflow

    client_class, refused, left, last_refused = mlflow.MlflowClient, [], Counter(names), set()

    def locked_once(name):
        real = getattr(client_class, name)

        def write(self, *args, **kwargs):
            if left[name] and name not in last_refused:
                left[name] -= 1
                last_refused.add(name)
                refused.append(name)
                raise sqlite3.OperationalError("database is locked")
            last_refused.discard(name)
            return real(self, *args, **kwargs)

        return write

    for name in left:
        monkeypatch.setattr(client_class, name, locked_once(name))
    return refused
