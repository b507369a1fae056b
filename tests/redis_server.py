"""A real redis-server on a free loopback port, for the tests that need Redis: start, SIGKILL, restart.

`needs_redis` marks a test (or module) that needs the binary: without it the test is skipped on a developer's
machine and fails under CI=true (tests/conftest.py turns every skip but CUDA's into a failure there)."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None,
                                 reason="redis-server is not installed (make setup installs Debian's redis-server "
                                        "as root; else apt-get install redis-server)")


def _candidate_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """port 0: a free port, picked again if another process takes it between the pick and redis' own bind."""

    def __init__(self, folder: Path, port: int = 0, persist: bool = False):
        self.folder, self.persist = Path(folder), persist
        self._fixed = bool(port)
        self.port = port or _candidate_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _spawn(self) -> bool:
        aof = ["--appendonly", "yes", "--appendfsync", "always"] if self.persist else ["--appendonly", "no"]
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      *aof, "--dir", str(self.folder)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False            # it could not bind (the port was taken meanwhile)
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return True
            except OSError:
                pass
            time.sleep(0.05)
        self.proc.kill()
        self.proc.wait(timeout=10)
        raise RuntimeError(f"redis-server did not answer PING on port {self.port} within 10 s")

    def start(self) -> RedisServer:
        """Starts it and waits until it answers PING. persist: an append-only file synced on every write (what
        survives a restart). A restart reuses the port it had."""
        for _ in range(1 if self._fixed else 5):
            if self._spawn():
                self._fixed = True      # a restart must come back on the same port
                return self
            self.port = _candidate_port()
        raise RuntimeError(f"redis-server could not bind a loopback port (last tried {self.port})")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
