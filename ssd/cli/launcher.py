"""`ssd up`: router, target and draft(s) as separate processes on loopback, supervised like a small Deployment.

Each service is its own `python -m ssd.cli <role>` process. Ports: every service binds its own sockets, on port 0
unless `StackConfig.grpc_port` / `http_port` name the router's, and reports what it bound in its `--bound-file`;
`Stack` reads those files (it never picks a port for a service) and starts the routers with the workers' concrete
addresses. A restarted child gets the concrete addresses of its previous run, so routers reconnect to it.

Supervision (`Stack.supervise`, what `ssd up` runs): a child that exits while no stop was requested is logged
(name, pid, exit code or signal, restart count) and, with `StackConfig.restart` on, started again on the same
addresses after a back-off (`restart_backoff`, doubling per restart, at most MAX_BACKOFF_S). A router rides out a
worker's restart (the worker's sequences run on backup speculation meanwhile); a restarted router keeps its
addresses but not its running requests. A child that dies `max_restarts` times in a row (each run shorter than
STABLE_S), or any child with `restart` off, ends supervision with `GaveUp`, which says who and why. Nothing
is restarted outside `start` and `supervise`: tests kill and restart workers by hand (`kill`, `start_draft`).

Stopping: `request_stop()` only sets a flag (safe in a signal handler): `start` then raises `Stopped` and
`supervise` returns. `stop()` sends SIGTERM to every child and SIGKILL to those left after a grace period.
Children also get SIGTERM when the thread that started them ends (prctl PR_SET_PDEATHSIG), so a killed launcher
leaves no orphans. The child asks for it itself (`die_with_launcher`, the first thing `ssd.cli` does, told the
launcher's pid in DIE_WITH_PARENT_ENV), not a `preexec_fn`: with one, `Popen` has to `fork()` the launcher, which
runs every library's fork handlers first, and gRPC's waited forever for a client channel's threads in a test
process (a restart that hung a CI run in `fork`). Without one it uses `vfork`, which runs none.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ssd.cli.parent import DIE_WITH_PARENT_ENV
from ssd.control import wait_serving
from ssd.service_config import read_bound_file

log = logging.getLogger("ssd.launcher")

MAX_BACKOFF_S = 10.0  # the longest wait before a restart
STABLE_S = 60.0       # a child that ran this long before it exited starts its restart count afresh


def free_port() -> int:
    """A port that was free a moment ago: for tests' own listeners, never for a service (which binds port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exit_reason(returncode: int) -> str:
    """'exit code 2' or 'signal SIGKILL' for a Popen returncode."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


class GaveUp(RuntimeError):
    """A child exited and is not restarted: supervision is off, or the child reached its restart limit."""


class Stopped(RuntimeError):
    """`start` was interrupted by `request_stop()`."""


@dataclass(slots=True)
class StackConfig:
    mode: str = "ssd"
    drafts: int = 1
    targets: int = 1
    models_dir: Path | None = None
    target_model: Path | None = None
    draft_model: Path | None = None
    grpc_port: int = 0                 # 0 = the router binds a free port and reports it
    http_port: int = 0                 # 0 = the router binds a free port and reports it
    k: int = 3
    backup: str = "jit"
    max_batch: int = 16
    device: str = ""                   # the workers' --device: cpu, cuda or cuda:N (empty = the services' default)
    dtype: str = ""                    # the workers' --dtype: float32, bfloat16 or float16 (empty = default)
    host: str = "127.0.0.1"            # the interface the routers' gRPC and HTTP bind (workers stay on loopback)
    target_cpus: str = ""              # e.g. "0": pin the target
    draft_cpus: str = ""               # e.g. "1": pin the drafts
    router_cpus: str = ""              # e.g. "1": pin the routers (off the target's CPUs: it is the critical path)
    threads: int = 0
    log_dir: Path | None = None        # service logs (default: inherit stderr)
    redis_url: str = ""                # workers register there and the router discovers them (else static)
    routers: int = 1                   # routers sharing the workers (more than one needs state_redis_url)
    state_redis_url: str = ""          # the routers' request-state journal (resumable streams)
    extra: dict[str, list[str]] = field(default_factory=dict)  # more flags per role
    restart: bool = False              # start/supervise restart a child that exits (else it ends them: GaveUp)
    max_restarts: int = 5              # restarts in a row of one child (each run under STABLE_S) before GaveUp
    restart_backoff: float = 0.5       # seconds before a child's first restart; doubles with each restart


@dataclass(slots=True)
class _Child:
    role: str                          # target, draft or router
    index: int
    started: float                     # time.monotonic() of the current run
    restarts: int = 0                  # restarts in a row (reset after a run of STABLE_S)
    due: float | None = None           # when it exited and awaits a restart: the time of that restart
    reported: bool = False             # its bound file of the current run was read


class Stack:
    def __init__(self, cfg: StackConfig):
        self.cfg = cfg
        self.procs: dict[str, subprocess.Popen] = {}
        if cfg.routers > 1 and not cfg.state_redis_url:
            raise ValueError("several routers need a request-state Redis (state_redis_url)")
        # Until a service reports its bound file these hold the addresses it was asked to bind (port 0: any).
        host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host  # an IPv6 literal
        self.grpc_addresses = [f"{host}:{cfg.grpc_port if i == 0 else 0}" for i in range(cfg.routers)]
        self.http_addresses = [f"{host}:{cfg.http_port if i == 0 else 0}" for i in range(cfg.routers)]
        self.target_data = ["tcp://127.0.0.1:0" for _ in range(cfg.targets)]
        self.draft_data = ["tcp://127.0.0.1:0" for _ in range(cfg.drafts if cfg.mode != "ar" else 0)]
        self.target_control = ["127.0.0.1:0" for _ in self.target_data]
        self.draft_control = ["127.0.0.1:0" for _ in self.draft_data]
        self.bound_dir = Path(tempfile.mkdtemp(prefix="ssd-stack-"))
        self._children: dict[str, _Child] = {}
        self._stop_requested = False
        self._logs = []

    @property
    def grpc_address(self) -> str:
        return self.grpc_addresses[0]

    @property
    def http_address(self) -> str:
        return self.http_addresses[0]

    # ---- processes --------------------------------------------------------------------------------
    def _spawn(self, name: str, role: str, index: int, args: list[str]) -> None:
        out = None
        if self.cfg.log_dir is not None:
            self.cfg.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.cfg.log_dir / f"{name}.log", "a" if name in self._children else "w")
            self._logs.append(out)
        self.bound_dir.mkdir(exist_ok=True)
        bound = self.bound_file(name)
        bound.unlink(missing_ok=True)  # what a previous run reported is no answer for this one
        cmd = [sys.executable, "-m", "ssd.cli", *args, *self.cfg.extra.get(role, []), "--bound-file", str(bound)]
        env = dict(os.environ, **{DIE_WITH_PARENT_ENV: str(os.getpid())})
        self.procs[name] = p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if out else None, env=env)
        child = self._children.get(name)
        if child is None:
            self._children[name] = _Child(role, index, time.monotonic())
        else:
            child.started, child.due, child.reported = time.monotonic(), None, False
        log.info("started %s (pid %d)", name, p.pid)

    def bound_file(self, name: str) -> Path:
        """Where child `name` reports the addresses it bound."""
        return self.bound_dir / f"{name}.json"

    def _common(self) -> list[str]:
        c = self.cfg
        args = ["--models-dir", str(c.models_dir)] if c.models_dir else []
        args += ["--redis-url", c.redis_url] if c.redis_url else []
        args += (["--device", c.device] if c.device else []) + (["--dtype", c.dtype] if c.dtype else [])
        return args + (["--threads", str(c.threads)] if c.threads else [])

    def start_target(self, i: int = 0) -> None:
        """Start target `i` (again: on the addresses it reported before). Returns at once; `start_router` waits
        for its bound file."""
        c = self.cfg
        args = ["target", "--data-address", self.target_data[i], "--control-address", self.target_control[i],
                "--max-seqs", str(c.max_batch), *self._common()]
        args += (["--model", str(c.target_model)] if c.target_model else [])
        args += (["--cpus", c.target_cpus] if c.target_cpus else [])
        self._spawn(f"target{i}" if i else "target", "target", i, args)

    def start_draft(self, i: int) -> None:
        """Start draft `i` (again: on the addresses it reported before). Returns at once."""
        c = self.cfg
        args = ["draft", "--data-address", self.draft_data[i], "--control-address", self.draft_control[i],
                "--max-seqs", str(c.max_batch), "--k", str(c.k), *self._common()]
        args += (["--model", str(c.draft_model)] if c.draft_model else [])
        args += (["--cpus", c.draft_cpus] if c.draft_cpus else [])
        self._spawn(f"draft{i}", "draft", i, args)

    def start_router(self, i: int = 0, timeout: float = 180.0) -> None:
        """Wait for every started worker's bound file, start router `i` with their addresses, and wait for its
        own bound file (it binds before it waits for the workers to be ready)."""
        self._await_bound([n for n, ch in self._children.items() if ch.role != "router"], timeout)
        name = f"router{i}" if i else "router"
        self._spawn(name, "router", i, self._router_args(i, timeout))
        self._await_bound([name], timeout)

    def _router_args(self, i: int, timeout: float) -> list[str]:
        c = self.cfg
        args = ["router", "--grpc-address", self.grpc_addresses[i], "--http-address", self.http_addresses[i],
                "--targets", ",".join(self.target_data),
                "--drafts", ",".join(self.draft_data), "--mode", c.mode, "--backup", c.backup,
                "--max-batch", str(c.max_batch), "--ready-timeout", str(timeout)]
        args += (["--models-dir", str(c.models_dir)] if c.models_dir else [])
        args += (["--model", str(c.target_model)] if c.target_model else [])
        args += (["--cpus", c.router_cpus] if c.router_cpus else [])
        args += (["--discovery", "redis", "--redis-url", c.redis_url] if c.redis_url else [])
        args += (["--state-redis-url", c.state_redis_url, "--router-id", f"router{i}"] if c.state_redis_url else [])
        return args

    def start(self, timeout: float = 180.0) -> "Stack":
        """Start every service and wait until each router serves; on failure stop them all and raise
        RuntimeError (`GaveUp` when a child exited; `Stopped` on `request_stop()`)."""
        try:
            for i in range(len(self.target_data)):
                self.start_target(i)
            for i in range(len(self.draft_data)):
                self.start_draft(i)
            for i in range(self.cfg.routers):
                self.start_router(i, timeout)
            deadline = time.monotonic() + timeout
            for address in self.grpc_addresses:
                while not wait_serving(address, timeout=1.0):
                    self._tend()
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the stack did not become ready (timeout {timeout:.0f} s); "
                                           f"see the service logs")
        except GaveUp as e:
            self.stop()
            raise GaveUp(f"the stack did not become ready: {e}") from None
        except BaseException:
            self.stop()
            raise
        return self

    # ---- bound addresses --------------------------------------------------------------------------
    def _collect(self, name: str) -> bool:
        """Read child `name`'s bound file into the stack's addresses; False while it has not written one."""
        child = self._children[name]
        if child.reported:
            return True
        info = read_bound_file(self.bound_file(name))
        if info is None:
            return False
        i = child.index
        if child.role == "router":
            self.grpc_addresses[i], self.http_addresses[i] = info["grpc_address"], info["http_address"]
            where = f"gRPC {info['grpc_address']}, HTTP {info['http_address'] or 'off'}"
        else:
            data, control = (self.target_data, self.target_control) if child.role == "target" else \
                (self.draft_data, self.draft_control)
            data[i], control[i] = info["data_address"], info["control_address"]
            where = f"data {info['data_address']}, control {info['control_address']}"
        child.reported = True
        log.info("%s (pid %d) is on %s", name, info["pid"], where)
        return True

    def _await_bound(self, names: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for name in names:
            while not self._collect(name):
                self._tend()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not report its addresses within {timeout:.0f} s; "
                                       f"see its log")
                time.sleep(0.05)

    # ---- supervision ------------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Make `start` raise `Stopped` and `supervise` return; only sets a flag, so a signal handler may call it."""
        self._stop_requested = True

    def supervise(self, poll: float = 0.2) -> None:
        """Watch the children until `request_stop()`: restart those that exit (StackConfig.restart) or raise
        `GaveUp`, which also ends a child's restarts after `max_restarts` in a row. Call after `start`."""
        while not self._stop_requested:
            self._tend()
            time.sleep(poll)

    def _tend(self) -> None:
        """One supervision step: note children that exited, restart those due; `Stopped`/`GaveUp` as above."""
        if self._stop_requested:
            raise Stopped("a stop was requested")
        now = time.monotonic()
        for name, child in self._children.items():
            p = self.procs[name]
            if p.poll() is None:
                self._collect(name)
                continue
            if child.due is None:  # a new exit
                why = f"{name} (pid {p.pid}) exited with {exit_reason(p.returncode)}"
                if not self.cfg.restart:
                    raise GaveUp(f"{why}; see its log")
                if now - child.started >= STABLE_S:
                    child.restarts = 0
                if child.restarts >= self.cfg.max_restarts:
                    raise GaveUp(f"{why} after {child.restarts} restarts in a row; restart limit "
                                 f"({self.cfg.max_restarts}) reached, giving up; see its log")
                delay = min(MAX_BACKOFF_S, self.cfg.restart_backoff * 2 ** child.restarts)
                child.restarts += 1
                child.due = now + delay
                log.warning("%s; restart %d of %d in %.1f s", why, child.restarts, self.cfg.max_restarts, delay)
            elif now >= child.due:
                self._restart(name, child)

    def _restart(self, name: str, child: _Child) -> None:
        if child.role == "target":
            self.start_target(child.index)
        elif child.role == "draft":
            self.start_draft(child.index)
        else:  # on the addresses it reported; its workers' are known
            self._spawn(name, "router", child.index, self._router_args(child.index, 180.0))

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        self.procs[name].send_signal(sig)

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM to every child, SIGKILL to those still running after `grace` seconds; waits for them all."""
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
        self._logs.clear()
        shutil.rmtree(self.bound_dir, ignore_errors=True)

    def __enter__(self) -> "Stack":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
