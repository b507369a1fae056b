"""`die_with_launcher`: a process that `ssd.cli.launcher` started ends when the launcher does (`ssd.cli`'s `main`
calls it first; no grpc, no torch here)."""
from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["DIE_WITH_PARENT_ENV", "die_with_launcher"]

DIE_WITH_PARENT_ENV = "SSD_DIE_WITH_PARENT"   # the launcher's pid, for the children it starts


def die_with_launcher() -> None:
    """In a child the launcher started (DIE_WITH_PARENT_ENV set): SIGTERM this process when the launcher's thread
    that started it ends, and end now if the launcher is already gone. A no-op anywhere else; the variable is
    removed, so what this process starts in turn does not inherit it."""
    parent = os.environ.pop(DIE_WITH_PARENT_ENV, "")
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != int(parent):   # it ended before the prctl: no signal will come
        raise SystemExit(f"the launcher (pid {parent}) that started this process has ended")
