"""Timestamps of each verify batch across the router and the target, for `bench/verify_trace.py`.

With ``SSD_VERIFY_TRACE=PREFIX`` in its environment, a process appends one line per event to ``PREFIX.<pid>``:
``<event> <verify batch id> <seconds>``, on CLOCK_MONOTONIC (``time.monotonic``), which the processes of one host
share. The router writes ``router_send`` (a Verify left) and ``router_recv`` (its Outcomes arrived); the target
``target_recv``, ``compute_start``, ``compute_end`` and ``target_sent``. Three more lines carry a count in place of
the seconds (`count`): the target's ``sequences`` and ``positions`` (what it verified of that batch) and the router's
``active`` (the sequences it had running when it sent the batch). Unset (the default), each call site tests ``ON``
and does nothing else.
"""
from __future__ import annotations

import os
import time

ENV = "SSD_VERIFY_TRACE"
ON = bool(os.environ.get(ENV))
_file = None


def mark(event: str, batch_id: int, at: float | None = None) -> None:
    """One line: `event` for verify batch `batch_id`, at `at` (time.monotonic(); default now)."""
    global _file
    if _file is None:
        _file = open(f"{os.environ[ENV]}.{os.getpid()}", "a", buffering=1)
    _file.write(f"{event} {batch_id} {time.monotonic() if at is None else at:.6f}\n")


def count(event: str, batch_id: int, n: int) -> None:
    """One line: `event` for verify batch `batch_id`, with the count `n` where `mark` writes seconds."""
    mark(event, batch_id, float(n))
