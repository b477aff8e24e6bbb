"""A machine without an installed package, as far as imports and ``importlib.util.find_spec`` see."""

from __future__ import annotations

import importlib.util
import sys


def hide_package(monkeypatch, name: str) -> None:
    """``name`` is not importable for the rest of the test: out of ``sys.modules``, no spec found."""
    monkeypatch.delitem(sys.modules, name, raising=False)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda module, *a: None if module == name else real_find_spec(module, *a)
    )
