"""A run's throughput from its logging-window records: one definition, used by the engine's summary and by
every table of the report (no torch, no pandas: reporting and notebooks import it cheaply)."""

from __future__ import annotations

import math


def timed_rate(records, key: str = "real_tokens_per_s") -> float | None:
    """THE throughput of a run (``key``: real_tokens_per_s, tokens_per_s or samples_per_s) over its timed
    steps.

    ``records`` are the logging-window records (dicts with ``step``, ``step_time_s`` and ``key``). Each
    process's first window (its first step alone: warm-up, compilation; marked ``warmup``, the history's first
    row in a history without the mark) is left out unless that leaves nothing; each other window counts with
    its duration (its steps x its mean step time), so the figure is total amount over total time, not a mean
    of window rates (a last, partial window weighs what it lasted). Every table, the diagnosis, the summary
    and the run comparison use this one function. ``None`` when nothing was measured.
    """
    records = list(records)
    indices = timed_windows(records) or range(len(records))
    amount = seconds = 0.0
    for index in indices:
        record = records[index]
        rate, step_time = record.get(key), record.get("step_time_s")
        if rate is None or step_time is None or not math.isfinite(rate) or not math.isfinite(step_time):
            continue
        steps = record["step"] - records[index - 1]["step"] if index > 0 else record["step"]
        duration = max(int(steps), 1) * step_time
        amount, seconds = amount + rate * duration, seconds + duration
    return amount / seconds if seconds > 0 else None


def timed_windows(records) -> list[int]:
    """The indices of the windows the throughput counts: all but the first and those marked ``warmup`` (a
    resumed process's first step); empty when none is left."""
    return [index for index, record in enumerate(records) if index > 0 and not _is_warmup(record)]


def _is_warmup(record: dict) -> bool:
    mark = record.get("warmup")
    return mark is not None and mark == mark and bool(mark)  # NaN (a row of an older history): not marked
