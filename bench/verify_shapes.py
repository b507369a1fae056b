"""What a verify costs by its shape: the target's verify of `seqs` sequences of `rows` positions each (K + 1), timed
in one process on one thread at a context of `--context` tokens, the shapes interleaved (forward, then reversed on
every other pass) so that the host's drift falls on all alike. The adaptive policy reads an unmeasured shape off the
measured ones (`ssd.spec.adaptive.CostTable`); this says how far a guess from another shape can be off.

    PYTHONPATH=. python bench/verify_shapes.py [--shapes 16x1,16x2,16x3,16x4,8x2,8x4,4x4,4x1] [--reps 12]
        [--out bench/results/verify_shapes.json]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="16x1,16x2,16x3,16x4,8x2,8x4,4x4,4x1")
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--out", default="bench/results/verify_shapes.json")
    a = ap.parse_args()
    shapes = parse_shapes(a.shapes)
    torch.set_num_threads(1)
    seqs_max = max(s for s, _ in shapes)
    worker = TargetWorker(load_model(prepare_default_models()["target"]), seqs_max,
                          a.context + sum(r for _, r in shapes) * (a.reps + 1) + 64)
    rng = random.Random(0)
    worker.prefill([(s, [rng.randrange(100, 20000) for _ in range(a.context)], SamplingParams())
                    for s in range(seqs_max)], features=True)
    times: dict = {shape: [] for shape in shapes}
    for rep in range(a.reps + 1):   # the first pass warms each shape up and is not kept
        for seqs, rows in (shapes if rep % 2 == 0 else shapes[::-1]):
            items = [VerifyItem(s, [rng.randrange(100, 20000) for _ in range(rows - 1)], None) for s in range(seqs)]
            t0 = time.perf_counter()
            worker.verify(items, features=True)
            if rep:
                times[(seqs, rows)].append(time.perf_counter() - t0)
    median = {shape: statistics.median(ts) for shape, ts in times.items()}
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.processor() or platform.machine(),
              "torch": torch.__version__, "threads": 1, "reps": a.reps, "context": a.context,
              "median_ms": {f"{s}x{r}": round(1e3 * m, 1) for (s, r), m in median.items()}}
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print("| sequences x positions | positions | median ms | / the same sequences at 1 position |")
    print("|---|---|---|---|")
    for (s, r), m in median.items():
        one = median.get((s, 1))
        print(f"| {s} x {r} | {s * r} | {1e3 * m:.1f} | {m / one:.2f} |" if one else
              f"| {s} x {r} | {s * r} | {1e3 * m:.1f} | |")


if __name__ == "__main__":
    main()
