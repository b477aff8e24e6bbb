"""Strict JSON for every file the project writes: a non-finite figure (an inf perplexity, a NaN loss) is no
JSON number, and Python's ``json`` writes it as ``Infinity`` / ``NaN``, which ``jq``, JavaScript's
``JSON.parse`` and any strict parser refuse.

The rule: such a value is written as ``null``, and a top-level object gains ``"non_finite_values"``, which
maps each one's place (its keys and list indices joined by ``/``, e.g. ``"test_perplexity"``,
``"history/3/loss"``) to what it was: ``"inf"``, ``"-inf"`` or ``"nan"``. ``loads`` / ``restore`` put the
floats back, so the project's own readers read the figure the run had (a null loss never reads as 0); a file
written before this rule (with ``NaN`` literals) still reads. MLflow's REST API (protobuf's JSON) writes such
values as the strings ``"NaN"`` / ``"Infinity"``, and HF Trainer's ``trainer_state.json`` writes the invalid
literals; null keeps every figure a number or null for a reader, and the note keeps what it was.
"""

from __future__ import annotations

import json
import math
import numbers
from typing import Any

NON_FINITE = "non_finite_values"
_SEPARATOR = "/"


def _name(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _finite(value: Any, place: str, found: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {
            key: _finite(item, f"{place}{_SEPARATOR}{key}" if place else str(key), found)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [
            _finite(item, f"{place}{_SEPARATOR}{index}" if place else str(index), found)
            for index, item in enumerate(value)
        ]
    if isinstance(value, numbers.Real) and not isinstance(value, bool | numbers.Integral):
        number = float(value)
        if not math.isfinite(number):
            found[place] = _name(number)
            return None
    return value


def finite(value: Any) -> Any:
    """``value`` with each non-finite float replaced by None and, on a top-level dict, its note
    (``NON_FINITE``; none when every figure is finite, an earlier note replaced)."""
    found: dict[str, str] = {}
    if isinstance(value, dict):
        value = {key: item for key, item in value.items() if key != NON_FINITE}
    cleaned = _finite(value, "", found)
    if found and isinstance(cleaned, dict):
        cleaned[NON_FINITE] = found
    return cleaned


def dumps(value: Any, **kwargs) -> str:
    """``json.dumps`` of ``finite(value)``, refusing any non-finite value left (never ``NaN`` in a file)."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)


def dump(value: Any, handle, **kwargs) -> None:
    """``json.dump`` of ``finite(value)`` into ``handle``; see ``dumps``."""
    handle.write(dumps(value, **kwargs))


def _put(target: Any, parts: list[str], number: float) -> None:
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if isinstance(target, list):
            if not part.isdigit() or int(part) >= len(target):
                return
            if last:
                target[int(part)] = number if target[int(part)] is None else target[int(part)]
                return
            target = target[int(part)]
        elif isinstance(target, dict):
            if part not in target:
                return
            if last:
                target[part] = number if target[part] is None else target[part]
                return
            target = target[part]
        else:
            return


def restore(value: Any) -> Any:
    """``value`` as read from a strict file, its noted non-finite figures put back as floats (and the note
    taken out); anything else unchanged."""
    if not isinstance(value, dict) or not isinstance(value.get(NON_FINITE), dict):
        return value
    notes = value.pop(NON_FINITE)
    for place, name in notes.items():
        if name in ("inf", "-inf", "nan"):
            _put(value, str(place).split(_SEPARATOR), float(name))
    return value


def loads(text: str | bytes) -> Any:
    """``json.loads`` of a file written by ``dumps`` (or an earlier one with ``NaN`` literals), its non-finite
    figures restored."""
    return restore(json.loads(text))


def load(handle) -> Any:
    """``loads`` of an open file's text."""
    return loads(handle.read())
