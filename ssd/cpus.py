"""CPU affinity for a service process (`--cpus`): which cores its threads may run on.

On a small CPU machine the target is the round's critical path: every other process that lands on its core
lengthens every verify. `ssd up --pin` gives the target core 0 and the drafts and the router core 1 (the
router's work is short and arrives while the target verifies; on the target's core it measurably slowed every
verify of an SSD round, docs/benchmarks.md).
"""
from __future__ import annotations

import os

__all__ = ["parse_cpus", "pin"]


def parse_cpus(text: str) -> set[int]:
    """'0' or '0,2,3' -> {0, 2, 3}; ValueError that names what is wrong."""
    cpus = set()
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ValueError(f"--cpus {text!r}: expected CPU numbers separated by commas, e.g. '0' or '0,1'")
        cpus.add(int(part))
    available = os.sched_getaffinity(0)
    missing = sorted(cpus - available)
    if missing:
        raise ValueError(f"--cpus {text!r}: CPU {', '.join(map(str, missing))} is not available to this process "
                         f"(available: {','.join(map(str, sorted(available)))})")
    return cpus


def pin(text: str) -> None:
    """Restrict this process to the CPUs of `text`: every thread it has now (an import may have started some, and
    Linux sets affinity per thread) and, by inheritance, every thread it starts later; empty: no change."""
    if not text:
        return
    cpus = parse_cpus(text)
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:   # no procfs: the calling thread's affinity is what can be set
        threads = [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:   # a thread that has just ended
            pass
