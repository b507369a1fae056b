"""`--cpus`: the affinity every service takes (ssd.cpus), checked as a flag before anything loads, and applied to
a real router process (the one `ssd up --pin` now pins beside the drafts)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ssd.cpus import parse_cpus, pin

ROOT = Path(__file__).resolve().parents[1]


def test_parse_cpus_reads_lists_and_names_what_is_wrong():
    last = max(os.sched_getaffinity(0))
    assert parse_cpus(str(last)) == {last}
    assert parse_cpus(f"{last}, {last}") == {last}
    for bad in ("", "a", "0-1", "1,", "-1"):
        with pytest.raises(ValueError, match="CPU numbers separated by commas"):
            parse_cpus(bad)
    with pytest.raises(ValueError, match="CPU 4096 is not available"):
        parse_cpus("4096")


def test_pin_of_nothing_leaves_the_affinity_alone():
    before = os.sched_getaffinity(0)
    pin("")
    assert os.sched_getaffinity(0) == before


@pytest.mark.parametrize("role", ["router", "target", "draft"])
def test_a_bad_cpus_flag_is_a_flag_error_for_every_service(role):
    out = subprocess.run([sys.executable, "-m", "ssd.cli", role, "--cpus", "4096"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "--cpus '4096': CPU 4096 is not available" in out.stderr


def test_the_router_runs_on_the_cpus_it_is_given(default_models, tmp_path):
    cpu, bound = max(os.sched_getaffinity(0)), tmp_path / "router.json"
    # no worker answers at this address: the router binds, then waits for a Ready (long enough to look at it)
    p = subprocess.Popen([sys.executable, "-m", "ssd.cli", "router", "--cpus", str(cpu), "--mode", "ar",
                          "--targets", "tcp://127.0.0.1:9", "--grpc-address", "127.0.0.1:0",
                          "--http-address", "127.0.0.1:0", "--model", str(default_models["target"]),
                          "--ready-timeout", "60", "--bound-file", str(bound)],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        allowed, deadline = None, time.monotonic() + 30
        while time.monotonic() < deadline and p.poll() is None:
            if bound.is_file():   # bound: its threads (gRPC, ZeroMQ, HTTP) exist
                tasks = Path(f"/proc/{p.pid}/task")
                allowed = {_allowed(tasks / t / "status") for t in os.listdir(tasks)}
                break
            time.sleep(0.2)
        assert p.poll() is None, p.stderr.read().decode()
        assert allowed == {str(cpu)}, "every thread of the router on the CPU it was given"
    finally:
        p.kill()
        p.wait()


def _allowed(status: Path) -> str:
    return next(line.split()[1] for line in status.read_text().splitlines() if line.startswith("Cpus_allowed_list:"))
