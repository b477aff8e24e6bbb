"""CPU accounting shared by the benchmark scripts: how busy the machine and this run's children were."""

from __future__ import annotations

import os
import resource
from pathlib import Path


def children_cpu_s() -> float:
    """User + system CPU seconds of every reaped descendant (a child and, through it, its workers)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def own_and_children_cpu_s() -> float:
    """User + system CPU seconds of this process and its reaped descendants (a tokenizer's fork pool)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def busy_cpu_s() -> float:
    """Busy CPU seconds of the whole machine so far (all cores), from /proc/stat (0 where unavailable)."""
    try:
        fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    steal = fields[7] if len(fields) > 7 else 0
    guest = sum(fields[8:10])  # already counted in user/nice
    return (sum(fields) - idle - steal - guest) / os.sysconf("SC_CLK_TCK")
