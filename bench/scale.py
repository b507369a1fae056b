"""Scale benchmark: SSD at batch 8 and 16 with 1 and 2 draft replicas, through real processes.

For each draft count a fresh stack (router, one target pinned to CPU 0, the drafts sharing CPU 1, one torch
thread each) runs the same prompts in ssd mode; hit rate, late-entry rate and tokens/s come from the router's
totals (see ssd/bench/stack.py). On a 2-core machine a second draft replica cannot get a core of its own, so
this measures the pool's mechanics and its contention, not the gain a second GPU would bring.

    python bench/scale.py [--new-tokens 64] [--prompts 16] [--batches 8,16] [--drafts 1,2]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ssd.bench.stack import run_mode  # noqa: E402
from ssd.cli.launcher import Stack, StackConfig  # noqa: E402
from ssd.client import Client  # noqa: E402
from ssd.prompts import PROMPTS_BY_KIND  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "scale.json"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--batches", default="8,16")
    ap.add_argument("--drafts", default="1,2")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    prompts = [p for _, p in PROMPTS_BY_KIND[:args.prompts]]
    rows = {}
    for n in (int(d) for d in args.drafts.split(",")):
        cfg = StackConfig(mode="ssd", drafts=n, max_batch=max(batches), target_cpus="0", draft_cpus="1", threads=1,
                          log_dir=RESULTS.parent / "logs")
        with Stack(cfg) as stack, Client(stack.grpc_address, timeout=3600) as client:
            client.generate(prompts[0], chat=True, max_tokens=4)
            for b in batches:
                r = run_mode(client, prompts, "ssd", b, args.new_tokens)
                rows[f"drafts={n},batch={b}"] = {k: r[k] for k in ("tok_s", "hit_rate", "late_rate", "acceptance",
                                                                    "tokens_per_round", "draft_round_s",
                                                                    "verify_s_per_batch", "backups")}
                print(f"drafts {n} batch {b}: {r['tok_s']:.1f} tok/s, hit {r['hit_rate']:.2f}, "
                      f"late {r['late_rate']:.2f}, draft round {1000 * r['draft_round_s']:.0f} ms", flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "new_tokens": args.new_tokens,
                                   "prompts": args.prompts, "cores": "target cpu 0; all drafts share cpu 1",
                                   "rows": rows}, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
