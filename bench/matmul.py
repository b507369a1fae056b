"""The small-row matmul formulation (`ssd/models/linear.py`) against plain `F.linear`, on this CPU.

Two parts, both in one process, the two formulations interleaved call by call so machine noise hits both alike:
- `matrices`: every weight matrix of SmolLM2-135M (30 layers of fused qkv, o, fused gate/up and down, plus the
  49k-token output layer) and of the distilled draft (fc, its layer, the 8k-token head), random fp32 values,
  for 1..16 rows: milliseconds per pass over all of them.
- `model`: a forward + output layer of the real target at the shapes a round runs: batch 1 with 1..4 tokens per
  row (AR decode, verify of K = 1..3) and batch 4 with 1..2 tokens, over a 64-token context.
Times are medians of `--reps` in process CPU time, one thread unless `--threads`. Writes bench/results/matmul.json.

    PYTHONPATH=. python bench/matmul.py [--reps 9] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ssd.models.decoder as decoder  # noqa: E402
from ssd.models.decoder import ForwardBatch  # noqa: E402
from ssd.models.kv_cache import KVCache  # noqa: E402
from ssd.models.linear import linear  # noqa: E402
from ssd.models.loader import load_model  # noqa: E402
from ssd.models.prepare import prepare_default_models  # noqa: E402

CLOCK = time.process_time
RESULTS = Path(__file__).resolve().parent / "results" / "matmul.json"
TARGET = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
DRAFT = [(576, 1152), (960, 576), (576, 576), (3072, 576), (576, 1536), (8192, 576)]
ROWS = (1, 2, 3, 4, 6, 8, 12, 16)
STEPS = [(1, 1), (1, 2), (1, 3), (1, 4), (4, 1), (4, 2)]  # (batch, tokens per row)


def interleaved(fns: dict, reps: int) -> dict:
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = CLOCK()
            fn()
            times[name].append(CLOCK() - t0)
    return {name: round(1e3 * statistics.median(ts), 2) for name, ts in times.items()}


def matrices(reps: int) -> dict:
    g = torch.Generator().manual_seed(0)
    out = {}
    for model, shapes in (("target", TARGET), ("draft", DRAFT)):
        weights = [torch.randn(*s, generator=g) * 0.02 for s in shapes]
        for rows in ROWS:
            xs = {i: torch.randn(rows, i, generator=g) for i in {s[1] for s in shapes}}

            def run(fn):
                return lambda: [fn(xs[w.shape[1]], w) for w in weights]
            r = interleaved({"plain": run(F.linear), "ssd": run(linear)}, reps)
            out[f"{model}/{rows}"] = r | {"ratio": round(r["ssd"] / r["plain"], 3)}
            print(f"{model:6s} rows {rows:2d}: F.linear {r['plain']:7.2f} ms  linear {r['ssd']:7.2f} ms  "
                  f"ratio {r['ssd'] / r['plain']:.2f}", flush=True)
    return out


@torch.inference_mode()
def model_steps(reps: int) -> dict:
    target = load_model(prepare_default_models()["target"])
    cache = KVCache(target.cfg, 4, 128)
    ctx = 64
    prompt = ForwardBatch.ragged([[7] * ctx] * 4, [0] * 4, [0, 1, 2, 3])
    target(prompt, cache)
    out = {}
    for batch, tokens in STEPS:
        fb = ForwardBatch.ragged([[5] * tokens] * batch, [ctx] * batch, list(range(batch)))

        def step(fn):
            def run():
                decoder.linear = fn
                try:
                    target.logits(target(fb, cache))
                finally:
                    decoder.linear = linear
            return run
        r = interleaved({"plain": step(F.linear), "ssd": step(linear)}, reps)
        out[f"{batch}x{tokens}"] = r | {"ratio": round(r["ssd"] / r["plain"], 3)}
        print(f"target batch {batch} x {tokens} tokens: F.linear {r['plain']:6.1f} ms  linear {r['ssd']:6.1f} ms  "
              f"ratio {r['ssd'] / r['plain']:.2f}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    result = {"date": time.strftime("%Y-%m-%d"), "machine": platform.machine(), "threads": args.threads,
              "torch": torch.__version__, "reps": args.reps, "clock": "process CPU time, median",
              "matrices_ms": matrices(args.reps), "model_ms": model_steps(args.reps)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
