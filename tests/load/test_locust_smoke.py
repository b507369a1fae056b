"""The load suite runs headless against a local stack with no failures and writes its summary.

CI runs 20 users for 60 s (the issue's smoke run); `-m slow` adds a short 4-user run.
"""
import csv
import subprocess
import sys
from pathlib import Path

import pytest

from ssd.launcher import Stack, StackConfig

LOCUSTFILE = Path(__file__).with_name("locustfile.py")


@pytest.fixture(scope="module")
def stack(default_models, tmp_path_factory):
    cfg = StackConfig(mode="ssd", log_dir=tmp_path_factory.mktemp("load-logs"), max_batch=16, target_cpus="0",
                      draft_cpus="1", threads=1)
    with Stack(cfg) as s:
        yield s


def run_locust(stack, out: Path, users: int, seconds: int, max_tokens: int = 16) -> dict:
    prefix = out / "run"
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
           "-u", str(users), "-r", str(users), "-t", f"{seconds}s", "--stop-timeout", "60",
           "--host", f"http://{stack.http_address}", "--grpc-address", stack.grpc_address,
           "--max-tokens", str(max_tokens), "--csv", str(prefix)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(f"{prefix}_stats.csv") as f:
        stats = {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}
    with open(f"{prefix}_ssd.csv") as f:
        summary = {(r["api"], r["metric"]): r for r in csv.DictReader(f)}
    return {"stats": stats, "summary": summary, "stderr": proc.stderr}


def check(result: dict) -> None:
    stats, summary = result["stats"], result["summary"]
    assert stats[("", "Aggregated")]["Failure Count"] == "0", result["stderr"][-2000:]
    assert int(stats[("gRPC", "Generate (stream)")]["Request Count"]) > 0
    assert int(stats[("POST", "/v1/chat/completions (stream)")]["Request Count"]) > 0
    for api in ("grpc", "http"):
        for metric in ("ttft_ms", "itl_ms", "e2e_ms", "tokens_per_round"):
            row = summary[(api, metric)]
            assert int(row["count"]) > 0 and 0 < float(row["p50"]) <= float(row["p99"]), row
        assert float(summary[(api, "tokens_per_round")]["mean"]) >= 1.0
    assert float(summary[("all", "tokens_per_s")]["mean"]) > 0


@pytest.mark.slow
def test_short_load_run_has_no_failures(stack, tmp_path):
    check(run_locust(stack, tmp_path, users=4, seconds=20))


def test_twenty_users_for_a_minute_have_no_failures(stack, tmp_path):
    check(run_locust(stack, tmp_path, users=20, seconds=60))
