"""Where a verify batch's round goes, by process: a fresh stack (`ssd bench`'s pinning) runs modes at batch sizes
with SSD_VERIFY_TRACE set (ssd/trace.py), and each run's verify batches are split into the router's send to the
target's receipt (`zmq_in`), the target's queue before its compute (`queue`), the compute (`compute`), the
target's reply out (`send`), on to the router (`zmq_out`), and the router's turn from an outcome to its next verify
(`turn`, mean and median: the time the target waits on the router). Milliseconds, one JSON line per run. Each line
also says how the run's sequences were batched: the verify batches by how many sequences they held (`sequences`),
their mean positions (`positions`), the share of the target's compute spent on batches holding fewer sequences
than the run's fullest (`partial_compute`: a run's ramp, or cohorts out of step), and the share spent on batches
holding fewer than the router had running (`split_compute`: cohorts out of step alone; a ramp has fewer running):

    python bench/verify_trace.py --batches 1,16 --modes ar,ssd-auto [--out bench/results/verify_trace.jsonl]

(`bench/results/verify_trace_hold.jsonl`: 6ae75d5, which holds a pass's events until its sends are out, against
ecbd47b, 2026-12-06. `bench/results/verify_trace_batching.jsonl`: c86ba94's trace, lines labelled `cold` (a fresh
stack at batch 8), `bench-order` (batches 4, 8 and 16, pinned runs first as in `ssd bench`; these two before the
`active` count), `split` (with `split_compute`; its adaptive lines ran with a probe interval per batch-size
bucket, not committed) and `k1` (ar, sd1 and ssd1 at batch 8, 547e664), 2026-12-06.)
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, ".")   # the checkout being measured, not this file's
from ssd import trace  # noqa: E402

PHASES = (("zmq_in", "router_send", "target_recv"), ("queue", "target_recv", "compute_start"),
          ("compute", "compute_start", "compute_end"), ("send", "compute_end", "target_sent"),
          ("zmq_out", "target_sent", "router_recv"))


def read_events(prefix: str) -> dict[int, dict[str, float]]:
    """batch id -> event -> seconds, from every PREFIX.<pid> file (the first mark of an event per batch)."""
    events: dict[int, dict[str, float]] = defaultdict(dict)
    for path in glob.glob(f"{prefix}.*"):
        for line in Path(path).read_text().splitlines():
            name, batch_id, at = line.split()
            events[int(batch_id)].setdefault(name, float(at))
    return events


def split(events: dict[int, dict[str, float]], start: float, end: float) -> dict:
    """The phases (ms, means) of the batches the router sent within [start, end] and traced end to end, and the
    router's turn from each one's outcome to the next batch's send (mean and median)."""
    names = {name for _, a, b in PHASES for name in (a, b)}
    ids = sorted(b for b, ev in events.items() if names <= ev.keys() and start <= ev["router_send"] <= end)
    if not ids:
        return {"batches": 0}
    out = {"batches": len(ids)}
    for phase, a, b in PHASES:
        out[phase] = round(1000 * statistics.mean(events[i][b] - events[i][a] for i in ids), 3)
    turns = [1000 * (events[n]["router_send"] - events[p]["router_recv"]) for p, n in zip(ids, ids[1:])]
    turns = [t for t in turns if t >= 0]
    if turns:
        out["turn"], out["turn_median"] = round(statistics.mean(turns), 3), round(statistics.median(turns), 3)
    counted = [i for i in ids if {"sequences", "positions"} <= events[i].keys()]
    if counted:
        seqs = {i: int(events[i]["sequences"]) for i in counted}
        out["sequences"] = {str(n): c for n, c in sorted(Counter(seqs.values()).items())}
        out["positions"] = round(statistics.mean(events[i]["positions"] for i in counted), 2)
        compute = {i: events[i]["compute_end"] - events[i]["compute_start"] for i in counted}
        fullest = max(seqs.values())
        total = max(sum(compute.values()), 1e-12)
        out["partial_compute"] = round(sum(compute[i] for i in counted if seqs[i] < fullest) / total, 3)
        if all("active" in events[i] for i in counted):
            out["split_compute"] = round(sum(compute[i] for i in counted if seqs[i] < events[i]["active"]) / total, 3)
    return out


def main(label: str, batches, modes, new_tokens: int, out: Path | None) -> None:
    prefix = os.path.join(tempfile.mkdtemp(prefix="verify-trace-"), "t")
    os.environ[trace.ENV] = prefix   # the stack's processes inherit it; this one marks nothing
    from ssd.bench.stack import run_mode
    from ssd.cli.launcher import Stack, StackConfig
    from ssd.client.sync import Client
    from ssd.prompts import PROMPTS_BY_KIND

    prompts_all = [p for _, p in PROMPTS_BY_KIND]
    cfg = StackConfig(mode="ssd", drafts=1, k=3, max_batch=max(batches), target_cpus="0", draft_cpus="1",
                      router_cpus="1", threads=1, log_dir=Path("bench/results/logs"))
    runs = []
    with Stack(cfg) as stack, Client(stack.grpc_address, timeout=3600) as client:
        client.generate(prompts_all[0], chat=True, max_tokens=4, mode="ssd")   # warm-up
        for b in batches:
            prompts = [prompts_all[i % len(prompts_all)] for i in range(max(8, b))]
            for mode in modes:
                base, pin = (mode.rstrip("0123456789"), int(mode[-1])) if mode[-1].isdigit() else (mode, 3)
                t0 = time.monotonic()
                r = run_mode(client, prompts, base, b, new_tokens, pin)
                runs.append((b, mode, round(r["tok_s"], 2), t0, time.monotonic()))
    events = read_events(prefix)
    lines = [{"label": label, "batch": b, "mode": mode, "tok_s": tok_s, **split(events, t0, t1)}
             for b, mode, tok_s, t0, t1 in runs]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    print(text, end="")
    if out is not None:
        with out.open("a") as f:
            f.write(text)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("label", nargs="?", default="run")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--modes", default="ar,ssd-auto")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    main(a.label, [int(x) for x in a.batches.split(",")], a.modes.split(","), a.new_tokens, a.out)
