"""Load benchmark: the locust suite (ssd/bench/locustfile.py, `ssd bench locust`) headless at 1, 8 and 32 users.

One stack (router, target pinned to CPU 0, draft to CPU 1, one torch thread each, SSD mode, max batch 16) serves
every level in turn; each level runs streaming gRPC users (the SDK) for a fixed time, greedy chat completions of
mixed prompts with exactly `--max-tokens` tokens each (`--ignore-eos`). From each level's `_ssd.csv` summary:
p50/p99 TTFT, p50/p99 ITL (per token), p50 end-to-end latency, mean tokens per round, completed requests,
failures and total tokens/s. Results: bench/results/load.json, and a markdown table on stdout.

    python bench/load.py [--users 1,8,32] [--seconds 45] [--max-tokens 32] [--api GrpcUser|OpenAIUser|both]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ssd.cli.launcher import Stack, StackConfig  # noqa: E402

LOCUSTFILE = ROOT / "ssd" / "bench" / "locustfile.py"
RESULTS = ROOT / "bench" / "results" / "load.json"


def run_level(stack: Stack, users: int, seconds: int, max_tokens: int, classes: list[str], out: Path) -> dict:
    prefix = out / f"u{users}"
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
           "-u", str(users), "-r", str(users), "-t", f"{seconds}s", "--stop-timeout", "120",
           "--host", f"http://{stack.http_address}", "--grpc-address", stack.grpc_address,
           "--max-tokens", str(max_tokens), "--ignore-eos", "--csv", str(prefix), *classes]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if not Path(f"{prefix}_ssd.csv").exists():
        raise RuntimeError(f"locust failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(f"{prefix}_ssd.csv") as f:
        s = {(r["api"], r["metric"]): r for r in csv.DictReader(f)}
    with open(f"{prefix}_stats.csv") as f:
        agg = next(r for r in csv.DictReader(f) if r["Name"] == "Aggregated")
    apis = sorted({api for api, _ in s if api != "all"})

    def pooled(metric: str, stat: str) -> float:   # the worst API's figure when both run
        return round(max(float(s[(a, metric)][stat]) for a in apis if (a, metric) in s), 1)

    return {"users": users, "seconds": seconds, "apis": apis,
            "requests": sum(int(s[(a, "e2e_ms")]["count"]) for a in apis if (a, "e2e_ms") in s),
            "failures": int(agg["Failure Count"]),
            "ttft_ms_p50": pooled("ttft_ms", "p50"), "ttft_ms_p99": pooled("ttft_ms", "p99"),
            "itl_ms_p50": pooled("itl_ms", "p50"), "itl_ms_p99": pooled("itl_ms", "p99"),
            "e2e_ms_p50": pooled("e2e_ms", "p50"),
            "tokens_per_round": round(min(float(s[(a, "tokens_per_round")]["mean"]) for a in apis
                                          if (a, "tokens_per_round") in s), 3),
            "tokens_per_s": round(float(s[("all", "tokens_per_s")]["mean"]), 2)}


def markdown(rows: list[dict]) -> str:
    lines = ["| users | requests | failures | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | E2E p50 (ms) "
             "| tokens/round | tokens/s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['users']} | {r['requests']} | {r['failures']} | {r['ttft_ms_p50']:.0f} / "
                     f"{r['ttft_ms_p99']:.0f} | {r['itl_ms_p50']:.0f} / {r['itl_ms_p99']:.0f} | "
                     f"{r['e2e_ms_p50']:.0f} | {r['tokens_per_round']:.2f} | {r['tokens_per_s']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", default="1,8,32")
    ap.add_argument("--seconds", type=int, default=45)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--api", default="GrpcUser", choices=["GrpcUser", "OpenAIUser", "both"])
    args = ap.parse_args()
    classes = [] if args.api == "both" else [args.api]
    cfg = StackConfig(mode="ssd", max_batch=16, target_cpus="0", draft_cpus="1", threads=1,
                      log_dir=RESULTS.parent / "logs")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, Stack(cfg) as stack:
        for users in (int(u) for u in args.users.split(",")):
            row = run_level(stack, users, args.seconds, args.max_tokens, classes, Path(tmp))
            rows.append(row)
            print(f"{users} users: {row}", flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "mode": "ssd", "max_batch": 16,
                                   "max_tokens": args.max_tokens, "api": args.api,
                                   "cores": "target cpu 0, draft cpu 1, one torch thread each",
                                   "load_average_at_end": round(os.getloadavg()[0], 2), "rows": rows},
                                  indent=2) + "\n")
    print(markdown(rows))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
