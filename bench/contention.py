"""Does the draft's speculation slow the target's verify? Two processes, as the services run with `ssd up --pin`:
a target verify loop on CPU 0 and a draft speculate loop on CPU 1 (default pair, one torch thread each), the
verify timed alone and with the draft busy beside it, alternately (alone, beside, alone, beside).

The draft runs its SSD round (glue, forks, K branch steps) at `--forks` forks per sequence (the router's budget
is 64 a round, split over the batch's sequences). Writes bench/results/contention.json, keyed by batch size.

    PYTHONPATH=. python bench/contention.py [--batch 1] [--forks 64] [--reps 30]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "contention.json"
K, PROMPT_LEN = 3, 64


def _target_loop(batch: int, reps: int, out, ready, go) -> None:
    sys.path.insert(0, str(ROOT))
    os.sched_setaffinity(0, {0})
    import torch

    from ssd import wire
    from ssd.engine.target import TargetWorker
    from ssd.models.loader import load_model
    from ssd.models.prepare import prepare_default_models
    from ssd.sampling import SamplingParams

    torch.set_num_threads(1)
    worker = TargetWorker(load_model(prepare_default_models()["target"]), batch, PROMPT_LEN + (reps + 8) * (K + 1))
    rng = random.Random(0)
    worker.prefill([(i, [rng.randrange(100, 9000) for _ in range(PROMPT_LEN)], SamplingParams())
                    for i in range(batch)])

    def verify():
        worker.verify([wire.VerifyItem(i, [rng.randrange(100, 1000) for _ in range(K)], None) for i in range(batch)])

    for _ in range(3):
        verify()
    ready.set()
    go.wait()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        verify()
        times.append(time.perf_counter() - t0)
    out.put(statistics.median(times))


def _draft_loop(batch: int, forks: int, out, ready, stop) -> None:
    sys.path.insert(0, str(ROOT))
    os.sched_setaffinity(0, {1})
    import torch

    from ssd.engine.draft import DraftParams, DraftWorker
    from ssd.models.loader import load_model
    from ssd.models.prepare import prepare_default_models
    from ssd.spec.fanout import default_fanout

    torch.set_num_threads(1)
    worker = DraftWorker(load_model(prepare_default_models()["draft"]), batch, 4096, K, default_fanout(K, forks))
    rng = random.Random(1)
    for i in range(batch):
        worker.add(i, [rng.randrange(100, 9000) for _ in range(PROMPT_LEN)], DraftParams())
    worker.speculate([(i, [7] * K) for i in range(batch)])
    ready.set()
    times = []
    while not stop.is_set():   # the same round again: the draft's cost, not its text
        t0 = time.perf_counter()
        worker.speculate([(i, [11, 12, 13]) for i in range(batch)])
        times.append(time.perf_counter() - t0)
    out.put(statistics.median(times))


def measure(batch: int, forks: int, reps: int, beside: bool) -> tuple[float, float | None]:
    ctx = mp.get_context("spawn")
    out_t, out_d = ctx.Queue(), ctx.Queue()
    ready_t, ready_d, go, stop = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Event()
    target = ctx.Process(target=_target_loop, args=(batch, reps, out_t, ready_t, go))
    target.start()
    draft = None
    if beside:
        draft = ctx.Process(target=_draft_loop, args=(batch, forks, out_d, ready_d, stop))
        draft.start()
        ready_d.wait()
    ready_t.wait()
    go.set()
    verify_s = out_t.get()
    stop.set()
    draft_s = out_d.get() if draft else None
    target.join()
    if draft:
        draft.join()
    return verify_s, draft_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--forks", type=int, default=64, help="forks per sequence of the draft's round")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0):
        sys.exit("needs CPUs 0 and 1")
    runs = []
    for beside in (False, True, False, True):
        verify_s, draft_s = measure(args.batch, args.forks, args.reps, beside)
        runs.append({"draft_beside": beside, "verify_s": round(verify_s, 4),
                     "draft_round_s": None if draft_s is None else round(draft_s, 4)})
        print(runs[-1], flush=True)
    alone = statistics.mean(r["verify_s"] for r in runs if not r["draft_beside"])
    busy = statistics.mean(r["verify_s"] for r in runs if r["draft_beside"])
    row = {"k": K, "forks_per_sequence": args.forks, "reps": args.reps, "runs": runs,
           "slowdown": round(busy / alone, 3), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
           "load_avg": os.getloadavg()[0]}
    print(f"batch {args.batch}: verify {alone:.4f} s alone, {busy:.4f} s beside the draft (x{busy / alone:.3f})")
    results = json.loads(args.out.read_text()) if args.out.is_file() else {}
    results[f"batch{args.batch}"] = row
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
