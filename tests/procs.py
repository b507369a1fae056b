"""Process helpers shared by the tests that start and kill real processes."""
from __future__ import annotations


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (one nobody reaped has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
