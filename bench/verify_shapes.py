"""What a verify costs by its shape: the target's verify of `seqs` sequences of `rows` positions each (K + 1), timed
in one process on one thread at a context of `--context` tokens, the shapes interleaved (forward, then reversed on
every other pass) so that the host's drift falls on all alike. The adaptive policy reads an unmeasured shape off the
measured ones (`ssd.spec.adaptive.CostTable`); this says how far a guess from another shape can be off.

    PYTHONPATH=. python bench/verify_shapes.py [--shapes 16x1,16x2,16x3,16x4,8x2,8x4,4x4,4x1] [--reps 12]
        [--dtype float32] [--out bench/results/verify_shapes.json]

`--features both` times every shape with the draft's features asked for (as sd and ssd ask at every K, 0
included) and without (as ar asks), interleaved the same way, with each feature block converted to its wire
bytes as the target's handler does: what features cost a verify.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from ssd.engine.features import to_wire  # noqa: E402
from ssd.engine.target import TargetWorker  # noqa: E402
from ssd.models.loader import load_model  # noqa: E402
from ssd.models.prepare import prepare_default_models  # noqa: E402
from ssd.sampling import SamplingParams  # noqa: E402
from ssd.wire import VerifyItem  # noqa: E402


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """"16x1,8x4" -> [(16, 1), (8, 4)] (sequences x positions each)."""
    shapes = []
    for part in text.split(","):
        seqs, _, rows = part.strip().partition("x")
        if not (seqs.isdigit() and rows.isdigit()) or int(seqs) < 1 or int(rows) < 1:
            raise SystemExit(f"--shapes: {part!r} is not SEQSxROWS with both >= 1")
        shapes.append((int(seqs), int(rows)))
    return shapes


def variants(shapes: list[tuple[int, int]], features: str) -> list[tuple[int, int, bool]]:
    """What one pass times, in order: each shape with features (`on`), or with and then without (`both`)."""
    if features not in ("on", "both"):
        raise SystemExit(f"--features: {features!r} is not on or both")
    return [(seqs, rows, f) for seqs, rows in shapes for f in ((True, False) if features == "both" else (True,))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="16x1,16x2,16x3,16x4,8x2,8x4,4x4,4x1")
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--features", default="on", help="on: every verify asks for features; both: with and without")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="the target's weights and KV")
    ap.add_argument("--out", default="bench/results/verify_shapes.json")
    a = ap.parse_args()
    shapes = parse_shapes(a.shapes)
    order = variants(shapes, a.features)
    torch.set_num_threads(1)
    seqs_max = max(s for s, _ in shapes)
    worker = TargetWorker(load_model(prepare_default_models()["target"], dtype=getattr(torch, a.dtype)), seqs_max,
                          a.context + sum(r for _, r, _ in order) * (a.reps + 1) + 64)
    rng = random.Random(0)
    worker.prefill([(s, [rng.randrange(100, 20000) for _ in range(a.context)], SamplingParams())
                    for s in range(seqs_max)], features=True)
    times: dict = {v: [] for v in order}
    for rep in range(a.reps + 1):   # the first pass warms each shape up and is not kept
        for seqs, rows, features in (order if rep % 2 == 0 else order[::-1]):
            items = [VerifyItem(s, [rng.randrange(100, 20000) for _ in range(rows - 1)], None) for s in range(seqs)]
            t0 = time.perf_counter()
            outcomes = worker.verify(items, features=features)
            for o in outcomes if features else ():   # to the wire, as the target's handler sends them
                to_wire(worker.last_features[o.seq])
            if rep:
                times[(seqs, rows, features)].append(time.perf_counter() - t0)
    median = {(s, r): statistics.median(times[(s, r, True)]) for s, r in shapes}
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.processor() or platform.machine(),
              "torch": torch.__version__, "threads": 1, "reps": a.reps, "context": a.context, "dtype": a.dtype,
              "median_ms": {f"{s}x{r}": round(1e3 * m, 1) for (s, r), m in median.items()}}
    if a.features == "both":
        result["median_ms_without_features"] = {f"{s}x{r}": round(1e3 * statistics.median(times[(s, r, False)]), 1)
                                                for s, r in shapes}
        result["with_over_without"] = {f"{s}x{r}": round(median[(s, r)] / statistics.median(times[(s, r, False)]), 3)
                                       for s, r in shapes}
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    if a.features == "both":
        print("| sequences x positions | median ms with features | without | with / without |")
        print("|---|---|---|---|")
        for s, r in shapes:
            print(f"| {s} x {r} | {result['median_ms'][f'{s}x{r}']} | "
                  f"{result['median_ms_without_features'][f'{s}x{r}']} | {result['with_over_without'][f'{s}x{r}']} |")
        return
    print("| sequences x positions | positions | median ms | / the same sequences at 1 position |")
    print("|---|---|---|---|")
    for (s, r), m in median.items():
        one = median.get((s, 1))
        print(f"| {s} x {r} | {s * r} | {1e3 * m:.1f} | {m / one:.2f} |" if one else
              f"| {s} x {r} | {s * r} | {1e3 * m:.1f} | |")


if __name__ == "__main__":
    main()
