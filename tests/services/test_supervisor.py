"""`ssd up` as a real subprocess supervises its children like a small Deployment.

- A draft SIGKILLed mid-generation is restarted on its addresses; every open stream finishes with the tokens of
  in-process AR, and the router takes the restarted draft back (a later SD request at a pinned K speculates again).
- SIGINT and SIGTERM stop it: every child is gone and `ssd up` has exited 0 within 10 s, even with a stream
  open (the router would drain it for 30 s: the launcher SIGKILLs it after its grace).
- A child that keeps exiting ends `ssd up` with exit status 1 and a message naming it and the restart limit.
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from ssd.client import Client, SSDError
from ssd.control import describe
from tests.procs import alive

STARTED = re.compile(r"ssd up: started (\S+) \(pid (\d+)\)")
BOUND = re.compile(r"ssd up: (\S+) \(pid (\d+)\) is on data (\S+), control (\S+)")
READY = re.compile(r"^ready: gRPC (\S+),")


class Up:
    """`ssd up --port 0 --http-port 0 FLAGS` with its stderr (its own lines and its children's) read by a thread."""

    def __init__(self, *flags: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "ssd.cli", "up", "--port", "0", "--http-port", "0",
                                      *flags], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: re.Pattern, timeout: float = 300, after: int = 0) -> re.Match:
        """The first match of `pattern` among stderr lines from index `after` on, waiting up to `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.lines[after:]:
                if m := pattern.search(line):
                    return m
            assert self.proc.poll() is None, f"ssd up exited {self.proc.returncode}:\n" + self.tail()
            assert time.monotonic() < deadline, f"no line matched {pattern.pattern}:\n" + self.tail()
            time.sleep(0.1)

    def children(self) -> dict[int, str]:
        """pid -> name of every child `ssd up` said it started."""
        return {int(m[2]): m[1] for line in self.lines if (m := STARTED.search(line))}

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.lines[-n:])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.children():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def up_factory(default_models):
    ups: list[Up] = []

    def make(*flags: str) -> Up:
        ups.append(Up(*flags))
        return ups[-1]

    yield make
    for up in ups:
        up.close()


def test_draft_sigkilled_mid_generation_is_restarted_and_streams_finish_unchanged(up_factory, chat_prompts,
                                                                                   ar_reference, assert_speculated):
    up = up_factory("--mode", "ssd")
    address = up.wait_for(READY)[1]
    draft = up.wait_for(BOUND)
    assert draft[1] == "draft0"
    pid, data, control = int(draft[2]), draft[3], draft[4]
    client = Client(address, timeout=300, max_retries=0)  # a failed stream must not pass as a retried one
    assert client.server_info().drafts == [data]
    outputs: dict[int, list[int]] = {}
    errors: list[Exception] = []

    def run(i):
        try:
            outputs[i] = client.generate(chat_prompts[i], max_tokens=32, ignore_eos=True, mode="ssd").token_ids
        except SSDError as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120   # kill it while it holds sequences mid-generation
    while describe(control).active_sequences == 0:
        assert time.monotonic() < deadline and not outputs, "the draft never held a sequence"
        time.sleep(0.02)
    seen = len(up.lines)
    os.kill(pid, signal.SIGKILL)
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert [outputs[i] for i in range(4)] == ar_reference[:4]
    assert up.wait_for(re.compile(r"draft0 \(pid %d\) exited with signal SIGKILL; restart 1 of 5" % pid), 30, seen)
    again = up.wait_for(BOUND, 300, seen)
    assert (again[1], again[3], again[4]) == ("draft0", data, control) and int(again[2]) != pid
    deadline = time.monotonic() + 120   # the router takes the draft back on its old address
    while client.server_info().drafts != [data]:
        assert time.monotonic() < deadline, "the router did not take the restarted draft back:\n" + up.tail()
        time.sleep(0.2)
    # K pinned: the draft is back if it answers and its tokens are accepted. The adaptive K measured the target
    # and the draft while the restart shared this host's cores with them, and may rightly run a 16-token request at
    # K = 0 until its next probe (a CI run saw no drafted token accepted, 2026-12-05).
    later = client.generate(chat_prompts[0], max_tokens=16, ignore_eos=True, mode="sd", k=3)
    assert later.token_ids == ar_reference[0][:16]
    assert later.stats.rounds > 0
    assert_speculated([later], "sd")
    assert up.proc.poll() is None
    client.close()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_stops_every_child_within_10_s_and_exits_0(up_factory, chat_prompts, sig):
    up = up_factory("--mode", "ssd")
    address = up.wait_for(READY)[1]
    children = up.children()
    assert sorted(children.values()) == ["draft0", "router", "target"]
    client = Client(address, timeout=300, max_retries=0)
    # A long stream is open when the signal comes: the router alone would drain it for --drain-timeout (30 s).
    def long_stream():
        try:
            client.generate(chat_prompts[0], max_tokens=1500, ignore_eos=True)
        except SSDError:  # the stop ends it
            pass

    stream = threading.Thread(target=long_stream, daemon=True)
    stream.start()
    deadline = time.monotonic() + 60
    while client.server_info().active_requests == 0:
        assert time.monotonic() < deadline, "the stream never started"
        time.sleep(0.05)
    up.proc.send_signal(sig)
    signalled = time.monotonic()
    while up.proc.poll() is None or any(alive(pid) for pid in children):
        assert time.monotonic() - signalled < 10, (f"after {sig.name}: ssd up {up.proc.poll()}, children alive "
                                                   f"{[n for p, n in children.items() if alive(p)]}\n" + up.tail())
        time.sleep(0.05)
    assert up.proc.returncode == 0, up.tail()
    client.close()


def test_a_child_that_keeps_exiting_ends_ssd_up_with_the_restart_limit(up_factory):
    up = up_factory("--mode", "ssd", "--draft-args=--no-such-flag", "--max-restarts", "2", "--restart-backoff",
                    "0.1")
    try:
        up.proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail("ssd up did not give up:\n" + up.tail())
    up._reader.join(timeout=10)
    assert up.proc.returncode == 1, up.tail()
    restarts = [line for line in up.lines if re.search(r"draft0 \(pid \d+\) exited with exit code 2; restart", line)]
    assert len(restarts) == 2, up.tail()
    assert any(re.search(r"draft0 \(pid \d+\) exited with exit code 2 after 2 restarts in a row; restart limit "
                         r"\(2\) reached", line) for line in up.lines), up.tail()
    assert not [name for pid, name in up.children().items() if alive(pid)]
