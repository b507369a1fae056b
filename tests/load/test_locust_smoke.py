"""The locust suite shipped in the package (ssd/bench/locustfile.py, run as `ssd bench locust`): its HTTP user
against a fake OpenAI server that sends no `ssd` field (whole streams timed, ITL per token from the usage count),
both users headless against a local stack with no failures, the file inside the built wheel, and the command's
error without locust.

CI runs 20 users for 60 s against the stack (the issue's smoke run); `-m slow` adds a short 4-user run.
"""
import asyncio
import csv
import json
import os
import subprocess
import sys
import threading
import urllib.request
import zipfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from aiohttp import web

from ssd.cli import bench as bench_cli
from ssd.cli.launcher import Stack, StackConfig
from tests.fake_openai import CHUNKS, FIRST_DELAY, N_TOKENS, fake_app

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stack(default_models, tmp_path_factory):
    """The default pair (the distilled feature draft) in ssd with K fixed at 3: every round speculates, so the
    run's tokens per round and cache hits show whether speculation served the load."""
    cfg = StackConfig(mode="ssd", log_dir=tmp_path_factory.mktemp("load-logs"), max_batch=16, target_cpus="0",
                      draft_cpus="1", threads=1, draft_model=default_models["draft"],
                      extra={"router": ["--adaptive", "false"]})
    with Stack(cfg) as s:
        yield s


def run_locust(out: Path, host: str, users: int, seconds: int, *extra: str, max_tokens: int = 16) -> dict:
    """`ssd bench locust` headless, as a user runs it: locust's final statistics ({(type, name): entry}, from
    --json-file; its _stats.csv is written on a timer and may miss the last streams) and the suite's summary."""
    prefix = out / "run"
    cmd = [sys.executable, "-m", "ssd.cli", "bench", "locust", "--headless", "--only-summary",
           "-u", str(users), "-r", str(users), "-t", f"{seconds}s", "--stop-timeout", "60", "--host", host,
           "--max-tokens", str(max_tokens), "--csv", str(prefix), "--json-file", str(prefix), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120, cwd=out,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = {(e["method"], e["name"]): e for e in json.loads(Path(f"{prefix}.json").read_text())}
    with open(f"{prefix}_ssd.csv") as f:
        summary = {(r["api"], r["metric"]): r for r in csv.DictReader(f)}
    return {"stats": stats, "summary": summary, "stderr": proc.stderr}


@contextmanager
def serving(app: web.Application):
    """`app` on 127.0.0.1 in a thread of its own; yields its base URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(60)
        loop.close()


def test_http_user_times_whole_streams_per_token_from_a_server_without_ssd_stats(tmp_path):
    """The fake server sends the headers and a role chunk at once, content after FIRST_DELAY in pieces of 1, 1, 3
    and 1 tokens, usage, and no `ssd` field: the stream's time covers every piece, ITL counts tokens, not pieces."""
    with serving(fake_app(with_ssd=False)) as url:
        r = run_locust(tmp_path, url, 2, 6, "OpenAIUser")
    stats, summary = r["stats"], r["summary"]
    streams = stats[("POST", "/v1/chat/completions (stream)")]
    n = streams["num_requests"]
    assert n > 0 and sum(e["num_failures"] for e in stats.values()) == 0, r["stderr"][-2000:]
    assert ("GET", "/v1/models") not in stats          # not a request of the load
    gaps = sum(g for _, g in CHUNKS)
    # to the last token, not to the headers (which came at once)
    assert streams["min_response_time"] >= 1000 * (FIRST_DELAY + gaps) * 0.95
    assert float(summary[("http", "e2e_ms")]["p50"]) >= 1000 * (FIRST_DELAY + gaps) * 0.95
    assert float(summary[("http", "ttft_ms")]["p50"]) >= 1000 * FIRST_DELAY * 0.95
    assert stats[("TTFT", "http")]["min_response_time"] >= 1000 * FIRST_DELAY * 0.95
    assert int(summary[("http", "ttft_ms")]["count"]) == n == stats[("TTFT", "http")]["num_requests"]
    # tokens from usage (6), not pieces (4); one ITL per token after the first: 5 per stream, not 3
    assert float(summary[("http", "output_tokens")]["mean"]) == N_TOKENS
    assert int(summary[("http", "itl_ms")]["count"]) == n * (N_TOKENS - 1)
    assert float(summary[("http", "tpot_ms")]["p50"]) >= 1000 * gaps / (N_TOKENS - 1) * 0.95
    assert ("http", "tokens_per_round") not in summary   # nothing invented where the server sends no stats
    assert float(summary[("all", "tokens_per_s")]["mean"]) > 0


def router_counters(stack, name: str) -> dict[str, float]:
    """A counter of the router's /metrics, by its label set."""
    text = urllib.request.urlopen(f"http://{stack.http_address}/metrics", timeout=30).read().decode()
    return {line.split("{", 1)[1].split("}", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith(name + "{")}


def check(result: dict, max_tokens: int) -> None:
    stats, summary = result["stats"], result["summary"]
    assert sum(e["num_failures"] for e in stats.values()) == 0, result["stderr"][-2000:]
    counts = {"grpc": stats[("gRPC", "Generate (stream)")]["num_requests"],
              "http": stats[("POST", "/v1/chat/completions (stream)")]["num_requests"]}
    for api, n in counts.items():
        assert n > 0
        for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "tokens_per_round"):
            row = summary[(api, metric)]
            assert int(row["count"]) > 0 and 0 < float(row["p50"]) <= float(row["p99"]), row
        assert int(summary[(api, "e2e_ms")]["count"]) == n
        assert float(summary[(api, "output_tokens")]["mean"]) == max_tokens     # --ignore-eos
        # per token: every token after a stream's first piece has its gap (the pieces are fewer: tokens per round > 1)
        assert n < int(summary[(api, "itl_ms")]["count"]) <= n * (max_tokens - 1), api
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


def on_stack(stack, tmp_path, users: int, seconds: int) -> None:
    before = counters_now(stack)
    check(run_locust(tmp_path, f"http://{stack.http_address}", users, seconds, "--grpc-address", stack.grpc_address,
                     "--ignore-eos"), max_tokens=16)
    check_speculated(stack, before)


@pytest.mark.slow
def test_short_load_run_has_no_failures_and_speculates(stack, tmp_path):
    on_stack(stack, tmp_path, users=4, seconds=20)


def test_twenty_users_for_a_minute_have_no_failures_and_speculate(stack, tmp_path):
    on_stack(stack, tmp_path, users=20, seconds=60)


def test_the_wheel_carries_the_locustfile(tmp_path):
    """`pip install .` (the Dockerfile's) installs the suite: it is in the built wheel, where `ssd bench locust`
    finds it (beside ssd.bench)."""
    cfg = tmp_path / "build.cfg"
    cfg.write_text(f"[build]\nbuild_base = {tmp_path / 'build'}\n[egg_info]\negg_base = {tmp_path}\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path / "dist"), str(ROOT)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "DIST_EXTRA_CONFIG": str(cfg)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheel, = (tmp_path / "dist").glob("ssd-*.whl")
    assert "ssd/bench/locustfile.py" in zipfile.ZipFile(wheel).namelist()
    assert bench_cli.LOCUSTFILE == ROOT / "ssd" / "bench" / "locustfile.py"


def test_without_locust_the_command_says_how_to_get_it(monkeypatch, capsys):
    monkeypatch.setattr(bench_cli.importlib.util, "find_spec", lambda name: None)
    assert bench_cli.run_locust(["--headless"]) == 2
    assert "pip install 'ssd[load]'" in capsys.readouterr().err
