"""The load suite runs headless against a local stack with no failures and writes its summary.

CI runs 20 users for 60 s (the issue's smoke run); `-m slow` adds a short 4-user run.
"""
import csv
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from ssd.cli.launcher import Stack, StackConfig

LOCUSTFILE = Path(__file__).with_name("locustfile.py")


@pytest.fixture(scope="module")
def stack(default_models, tmp_path_factory):
    """The default pair (the distilled feature draft) in ssd with K fixed at 3: every round speculates, so the
    run's tokens per round and cache hits show whether speculation served the load."""
    cfg = StackConfig(mode="ssd", log_dir=tmp_path_factory.mktemp("load-logs"), max_batch=16, target_cpus="0",
                      draft_cpus="1", threads=1, draft_model=default_models["draft"],
                      extra={"router": ["--adaptive", "false"]})
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


def router_counters(stack, name: str) -> dict[str, float]:
    """A counter of the router's /metrics, by its label set."""
    text = urllib.request.urlopen(f"http://{stack.http_address}/metrics", timeout=30).read().decode()
    return {line.split("{", 1)[1].split("}", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith(name + "{")}


def check(result: dict) -> None:
    stats, summary = result["stats"], result["summary"]
    assert stats[("", "Aggregated")]["Failure Count"] == "0", result["stderr"][-2000:]
    assert int(stats[("gRPC", "Generate (stream)")]["Request Count"]) > 0
    assert int(stats[("POST", "/v1/chat/completions (stream)")]["Request Count"]) > 0
    for api in ("grpc", "http"):
        for metric in ("ttft_ms", "itl_ms", "e2e_ms", "tokens_per_round"):
            row = summary[(api, metric)]
            assert int(row["count"]) > 0 and 0 < float(row["p50"]) <= float(row["p99"]), row
        # without speculation every round commits exactly one token; the feature draft's accepted drafts add more
        assert float(summary[(api, "tokens_per_round")]["mean"]) > 1.1, summary[(api, "tokens_per_round")]
    assert float(summary[("all", "tokens_per_s")]["mean"]) > 0


def check_speculated(stack, before: tuple[dict, dict]) -> None:
    """The run's rounds accepted drafted tokens and took speculations from the cache (router /metrics)."""
    accepted_now, lookups_now = counters_now(stack)
    accepted = sum(accepted_now.values()) - sum(before[0].values())
    hits = lookups_now.get('result="hit"', 0.0) - before[1].get('result="hit"', 0.0)
    assert accepted > 0 and hits > 0, (accepted, hits)


def counters_now(stack) -> tuple[dict, dict]:
    return router_counters(stack, "ssd_spec_accepted_tokens_total"), router_counters(stack, "ssd_cache_lookups_total")


@pytest.mark.slow
def test_short_load_run_has_no_failures_and_speculates(stack, tmp_path):
    before = counters_now(stack)
    check(run_locust(stack, tmp_path, users=4, seconds=20))
    check_speculated(stack, before)


def test_twenty_users_for_a_minute_have_no_failures_and_speculate(stack, tmp_path):
    before = counters_now(stack)
    check(run_locust(stack, tmp_path, users=20, seconds=60))
    check_speculated(stack, before)
