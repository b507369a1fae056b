"""`ssd.cli.launcher.Stack`: services bind port 0 themselves and the stack uses what they report; supervision restarts
a worker on its addresses and gives up at the restart limit; bound files are written whole or not at all."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from ssd.cli import launcher
from ssd.cli.launcher import GaveUp, Stack, StackConfig, exit_reason
from ssd.client import Client
from ssd.control import describe
from ssd.service_config import bound_host_port, read_bound_file, write_bound_file
from tests.procs import alive


def test_bound_file_is_replaced_whole_and_missing_reads_as_none(tmp_path):
    path = tmp_path / "bound.json"
    assert read_bound_file(path) is None
    write_bound_file(path, {"grpc_address": "127.0.0.1:1"})
    write_bound_file(path, {"grpc_address": "127.0.0.1:2"})
    assert read_bound_file(path) == {"grpc_address": "127.0.0.1:2", "pid": os.getpid()}
    assert os.listdir(tmp_path) == ["bound.json"]  # no temporary file left behind
    write_bound_file(None, {"grpc_address": "x"})   # no file asked for: nothing written
    assert bound_host_port("[::]:0", 4321) == "[::]:4321" and bound_host_port("127.0.0.1:0", 80) == "127.0.0.1:80"


def test_exit_reason_names_the_signal_or_the_code():
    assert exit_reason(-signal.SIGKILL) == "signal SIGKILL"
    assert exit_reason(2) == "exit code 2"


def test_every_address_is_the_one_its_service_bound_on_port_0(default_models, tmp_path, monkeypatch):
    def no_pick():
        raise AssertionError("the launcher picked a port for a service")

    monkeypatch.setattr(launcher, "free_port", no_pick)
    cfg = StackConfig(mode="ssd", drafts=2, max_batch=2, threads=1, log_dir=tmp_path / "logs")
    with Stack(cfg) as stack, Client(stack.grpc_address, timeout=120) as client:
        for name, p in stack.procs.items():   # each service was told port 0 and bound it itself
            role = name.rstrip("0123456789")
            flags = ("--grpc-address", "--http-address") if role == "router" else ("--data-address",
                                                                                    "--control-address")
            for flag in flags:
                assert p.args[p.args.index(flag) + 1].endswith(":0"), (name, flag)
        reported = {name: json.loads(stack.bound_file(name).read_text()) for name in stack.procs}
        assert reported["router"]["grpc_address"] == stack.grpc_address
        assert reported["router"]["http_address"] == stack.http_address
        assert [reported["target"]["data_address"]] == stack.target_data
        assert [reported["target"]["control_address"]] == stack.target_control
        assert [reported[f"draft{i}"]["data_address"] for i in range(2)] == stack.draft_data
        assert [reported[f"draft{i}"]["control_address"] for i in range(2)] == stack.draft_control
        assert all(not a.endswith(":0") for a in stack.target_data + stack.draft_data + stack.draft_control)
        assert {name: info["pid"] for name, info in reported.items()} == {n: p.pid for n, p in stack.procs.items()}
        info = client.server_info()
        assert list(info.targets) == stack.target_data and sorted(info.drafts) == sorted(stack.draft_data)
        assert describe(stack.draft_control[1]).data_address == stack.draft_data[1]


def test_supervise_restarts_a_worker_on_its_addresses_then_gives_up_at_the_limit(default_models, tmp_path):
    cfg = StackConfig(mode="ssd", max_batch=2, threads=1, log_dir=tmp_path / "logs", restart=True, max_restarts=1,
                      restart_backoff=0.1)
    with Stack(cfg) as stack:
        data, control, first = stack.draft_data[0], stack.draft_control[0], stack.procs["draft0"].pid
        failure: list[BaseException] = []

        def watch():
            try:
                stack.supervise(poll=0.05)
            except GaveUp as e:
                failure.append(e)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            stack.kill("draft0")
            deadline = time.monotonic() + 180   # back on the same addresses, as a new process
            while stack.procs["draft0"].pid == first or read_bound_file(stack.bound_file("draft0")) is None:
                assert time.monotonic() < deadline and not failure, failure or "the draft was not restarted"
                time.sleep(0.05)
            second = stack.procs["draft0"].pid
            assert read_bound_file(stack.bound_file("draft0"))["pid"] == second
            assert (stack.draft_data[0], stack.draft_control[0]) == (data, control)
            assert describe(control).pid == second
            stack.kill("draft0")   # its second exit in a row: over max_restarts=1
            watcher.join(timeout=30)
            assert not watcher.is_alive(), "supervise did not give up"
        finally:
            stack.request_stop()
            watcher.join(timeout=30)
    assert len(failure) == 1
    assert f"draft0 (pid {second}) exited with signal SIGKILL after 1 restarts in a row" in str(failure[0])
    assert "restart limit (1) reached" in str(failure[0])


def test_without_restart_a_child_exit_ends_supervision(default_models, tmp_path):
    stack = Stack(StackConfig(mode="ssd", extra={"draft": ["--no-such-flag"]}, log_dir=tmp_path / "logs"))
    with pytest.raises(GaveUp, match=r"did not become ready: draft0 \(pid \d+\) exited with exit code 2"):
        stack.start(timeout=120)
    assert all(p.poll() is not None for p in stack.procs.values())


CHILD = "import time; from ssd.cli.parent import die_with_launcher; die_with_launcher(); time.sleep(60)"
# a "launcher" that starts CHILD the way Stack._spawn does, prints its pid and ends at once
LAUNCHER = ("import os, subprocess, sys; from ssd.cli.parent import DIE_WITH_PARENT_ENV; "
            "p = subprocess.Popen([sys.executable, '-c', sys.argv[1]], "
            "env=dict(os.environ, **{DIE_WITH_PARENT_ENV: str(os.getpid())})); print(p.pid, flush=True); "
            "import time; time.sleep(1.0)")


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")
def test_a_child_ends_when_its_launcher_does_without_a_preexec_fn(monkeypatch, tmp_path):
    """The child asks for SIGTERM at its launcher's death itself (`die_with_launcher`): `_spawn` passes no
    `preexec_fn`, with which `Popen` must `fork()` and run gRPC's fork handlers (one hung a CI run), and a child
    of a launcher that has ended is gone soon after."""
    out = subprocess.run([sys.executable, "-c", LAUNCHER, CHILD], capture_output=True, text=True, timeout=60)
    child = int(out.stdout.split()[0])
    deadline = time.monotonic() + 20
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child), "the child outlived its launcher"

    seen = {}

    class Spy:
        def __init__(self, cmd, **kw):
            seen.update(kw)
            self.pid = 1

    monkeypatch.setattr(launcher.subprocess, "Popen", Spy)
    stack = Stack(StackConfig(mode="ar", log_dir=tmp_path))
    stack._spawn("target", "target", 0, ["target"])
    assert seen.get("preexec_fn") is None and seen["env"][launcher.DIE_WITH_PARENT_ENV] == str(os.getpid())


def test_die_with_launcher_is_a_no_op_outside_a_launcher_and_ends_an_orphan(monkeypatch):
    from ssd.cli import parent

    monkeypatch.delenv(parent.DIE_WITH_PARENT_ENV, raising=False)
    parent.die_with_launcher()   # not started by a launcher: nothing happens
    monkeypatch.setenv(parent.DIE_WITH_PARENT_ENV, str(os.getppid() + 1))   # a launcher that is not our parent
    try:
        with pytest.raises(SystemExit, match="has ended"):
            parent.die_with_launcher()
    finally:
        import ctypes
        ctypes.CDLL("libc.so.6").prctl(1, 0)   # this test process asked for a parent-death signal: clear it
    assert parent.DIE_WITH_PARENT_ENV not in os.environ
