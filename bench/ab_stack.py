"""SSD against SD at K = 3 on a fresh stack of the code in the current folder, batches 8 and 16 (ssd, sd, ssd at
each: the first SSD run lets the fan-out policy settle at that batch), one JSON line per run. Alternating stacks
of two commits gives an A/B in which the machine's drift hits both alike:

    git worktree add /tmp/before <commit>
    for v in after before before after; do (cd $([ $v = after ] && echo . || echo /tmp/before) &&
        PYTHONPATH=$PWD python /path/to/bench/ab_stack.py $v); done > ab.jsonl

(`bench/results/round_cap_ab.jsonl`: the fan-out round cap, 8d63c2e against 52559b8, 2026-12-04.)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, ".")   # the checkout being measured, not this file's
from ssd.bench.stack import run_mode  # noqa: E402
from ssd.cli.launcher import Stack, StackConfig  # noqa: E402
from ssd.client.sync import Client  # noqa: E402
from ssd.prompts import PROMPTS_BY_KIND  # noqa: E402


def main(label: str, batches=(8, 16), new_tokens: int = 96) -> None:
    prompts_all = [p for _, p in PROMPTS_BY_KIND]
    # `ssd bench`'s pinning, spelled out here: the older checkout of an A/B has no shared helper to call
    cfg = StackConfig(mode="ssd", drafts=1, k=3, max_batch=max(batches), target_cpus="0", draft_cpus="1",
                      router_cpus="1", threads=1, log_dir=Path("bench/results/logs"))
    with Stack(cfg) as stack, Client(stack.grpc_address, timeout=3600) as client:
        client.generate(prompts_all[0], chat=True, max_tokens=4, mode="ssd")   # warm-up
        for b in batches:
            prompts = [prompts_all[i % len(prompts_all)] for i in range(max(8, b))]
            for mode in ("ssd", "sd", "ssd"):
                r = run_mode(client, prompts, mode, b, new_tokens, 3)
                print(json.dumps({"label": label, "batch": b, "mode": mode, "tok_s": round(r["tok_s"], 2),
                                  "verify": round(r["verify_s_per_batch"], 4), "draft": round(r["draft_round_s"], 4),
                                  "hit": round(r["hit_rate"], 3)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "run")
