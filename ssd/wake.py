"""`Wake`: a pipe whose read end a ZeroMQ poll watches, so another thread can end that poll at once.

A thread that owns sockets and sleeps in `zmq.Poller.poll` registers `Wake.fd`; any thread calls `set()` to end
the current (or next) poll, and the owner calls `clear()` after waking, before it looks at what was queued for it.
Queue first, then `set()`: whatever is queued before the owner's `clear()` is seen in that pass, anything queued
after it leaves a byte in the pipe and ends the next poll. Used by the router's loop (a submit or an abort) and by
a worker's data-plane thread (a reply the compute loop queued). Plain Python: the router imports it.
"""
from __future__ import annotations

import os

__all__ = ["Wake"]


class Wake:
    """A pipe whose read end the owner polls: `set()` from any thread ends the owner's current poll."""

    def __init__(self):
        self.fd, self._write = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._write, False)

    def set(self) -> None:
        try:
            os.write(self._write, b"\0")
        except OSError:   # full (the owner is awake already), or closed (the owner has ended)
            pass

    def clear(self) -> None:
        try:
            while os.read(self.fd, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        write, self._write = self._write, -1
        if write >= 0:   # once: a number closed twice may by then be another file's
            os.close(self.fd)
            os.close(write)
