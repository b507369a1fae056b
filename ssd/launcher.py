"""`ssd up`: router, target and draft(s) as separate processes on loopback.

Each service is its own `python -m ssd.cli <role>` process with its own ports. Children get SIGTERM if this
process dies (prctl PR_SET_PDEATHSIG), and `Stack.stop` terminates them (SIGKILL after a grace period), so
Ctrl-C leaves no orphans. `Stack` is also what the tests and `ssd bench` use to run a real stack.
"""
from __future__ import annotations

import ctypes
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ssd.control import wait_serving


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass(slots=True)
class StackConfig:
    mode: str = "ssd"
    drafts: int = 1
    targets: int = 1
    models_dir: Path | None = None
    target_model: Path | None = None
    draft_model: Path | None = None
    grpc_port: int = 0                 # 0 = a free port
    http_port: int = 0                 # 0 = a free port
    k: int = 3
    backup: str = "jit"
    max_batch: int = 16
    target_cpus: str = ""              # e.g. "0": pin the target
    draft_cpus: str = ""               # e.g. "1": pin the drafts
    threads: int = 0
    log_dir: Path | None = None        # service logs (default: inherit stderr)
    redis_url: str = ""                # workers register there and the router discovers them (else static)
    routers: int = 1                   # routers sharing the workers (more than one needs state_redis_url)
    state_redis_url: str = ""          # the routers' request-state journal (resumable streams)
    extra: dict[str, list[str]] = field(default_factory=dict)  # more flags per role


class Stack:
    def __init__(self, cfg: StackConfig):
        self.cfg = cfg
        self.procs: dict[str, subprocess.Popen] = {}
        if cfg.routers > 1 and not cfg.state_redis_url:
            raise ValueError("several routers need a request-state Redis (state_redis_url)")
        self.grpc_addresses = [f"127.0.0.1:{(cfg.grpc_port if i == 0 else 0) or free_port()}"
                               for i in range(cfg.routers)]
        self.grpc_address = self.grpc_addresses[0]
        self.target_data = [f"tcp://127.0.0.1:{free_port()}" for _ in range(cfg.targets)]
        self.draft_data = [f"tcp://127.0.0.1:{free_port()}" for _ in range(cfg.drafts if cfg.mode != "ar" else 0)]
        self.http_addresses = [f"127.0.0.1:{(cfg.http_port if i == 0 else 0) or free_port()}"
                               for i in range(cfg.routers)]
        self.http_address = self.http_addresses[0]
        self.target_control = [f"127.0.0.1:{free_port()}" for _ in self.target_data]
        self.draft_control = [f"127.0.0.1:{free_port()}" for _ in self.draft_data]
        self._logs = []

    def _spawn(self, name: str, args: list[str]) -> None:
        out = None
        if self.cfg.log_dir is not None:
            self.cfg.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.cfg.log_dir / f"{name}.log", "w")
            self._logs.append(out)
        cmd = [sys.executable, "-m", "ssd.cli", *args]
        self.procs[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if out else None,
                                            preexec_fn=_die_with_parent)

    def _common(self) -> list[str]:
        c = self.cfg
        args = ["--models-dir", str(c.models_dir)] if c.models_dir else []
        args += ["--redis-url", c.redis_url] if c.redis_url else []
        return args + (["--threads", str(c.threads)] if c.threads else [])

    def start_target(self, i: int = 0) -> None:
        c = self.cfg
        args = ["target", "--data-address", self.target_data[i], "--control-address", self.target_control[i],
                "--max-seqs", str(c.max_batch), *self._common()]
        args += (["--model", str(c.target_model)] if c.target_model else [])
        args += (["--cpus", c.target_cpus] if c.target_cpus else [])
        self._spawn(f"target{i}" if i else "target", args + c.extra.get("target", []))

    def start_draft(self, i: int) -> None:
        c = self.cfg
        args = ["draft", "--data-address", self.draft_data[i], "--control-address", self.draft_control[i],
                "--max-seqs", str(c.max_batch), "--k", str(c.k), *self._common()]
        args += (["--model", str(c.draft_model)] if c.draft_model else [])
        args += (["--cpus", c.draft_cpus] if c.draft_cpus else [])
        self._spawn(f"draft{i}", args + c.extra.get("draft", []))

    def start(self, timeout: float = 180.0) -> "Stack":
        c = self.cfg
        for i in range(len(self.target_data)):
            self.start_target(i)
        for i in range(len(self.draft_data)):
            self.start_draft(i)
        for i in range(c.routers):
            self.start_router(i, timeout)
        deadline = time.monotonic() + timeout
        for address in self.grpc_addresses:
            while not wait_serving(address, timeout=1.0):
                dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
                if dead or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the stack did not become ready (exited: {dead or 'none'}; "
                                       f"timeout {timeout:.0f} s); see the service logs")
        return self

    def start_router(self, i: int = 0, timeout: float = 180.0) -> None:
        c = self.cfg
        args = ["router", "--grpc-address", self.grpc_addresses[i], "--http-address", self.http_addresses[i],
                "--targets", ",".join(self.target_data),
                "--drafts", ",".join(self.draft_data), "--mode", c.mode, "--backup", c.backup,
                "--max-batch", str(c.max_batch), "--ready-timeout", str(timeout)]
        args += (["--models-dir", str(c.models_dir)] if c.models_dir else [])
        args += (["--model", str(c.target_model)] if c.target_model else [])
        args += (["--discovery", "redis", "--redis-url", c.redis_url] if c.redis_url else [])
        args += (["--state-redis-url", c.state_redis_url, "--router-id", f"router{i}"] if c.state_redis_url else [])
        self._spawn(f"router{i}" if i else "router", args + c.extra.get("router", []))

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        self.procs[name].send_signal(sig)

    def stop(self, grace: float = 5.0) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in self._logs:
            f.close()

    def __enter__(self) -> "Stack":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
