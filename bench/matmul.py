"""The CPU matmul paths of `ssd/models/linear.py` against plain `F.linear`, on this CPU.

Four paths, interleaved call by call so machine noise hits them alike: `plain` (`F.linear`), `unpacked`
(`unpacked_linear`: the weight-major form for a few rows, else `F.linear`), `packed` (`linear` on weights
carrying the oneDNN-packed copy `pack` attaches at load time; float32 products of 1-3 rows padded to 4) and
`unpadded` (`unpadded_linear`: the packed copy at the rows given). Two parts, in one process:
- `matrices`: every weight matrix of SmolLM2-135M in float32 (30 layers of fused qkv, o, fused gate/up and down,
  plus the 49k-token output layer) and of the distilled draft in bfloat16 (fc, its layer, the 8k-token head; the
  dtype a draft loads on this CPU), random values, for 1..64 rows: milliseconds per pass over all of them.
- `model`: a forward + output layer of the real target at the shapes a round runs: batch 1 with 1..4 tokens per
  row (AR decode, verify of K = 1..3), batch 4, 8 and 16 with 1, 2 or 4, over a 64-token context.
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
from ssd.models.linear import linear, pack, unpacked_linear, unpadded_linear  # noqa: E402
from ssd.models.loader import load_model  # noqa: E402
from ssd.models.prepare import prepare_default_models  # noqa: E402

CLOCK = time.process_time
RESULTS = Path(__file__).resolve().parent / "results" / "matmul.json"
TARGET = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
DRAFT = [(576, 1152), (960, 576), (576, 576), (3072, 576), (576, 1536), (8192, 576)]
ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
STEPS = [(1, 1), (1, 2), (1, 3), (1, 4), (4, 1), (4, 2), (4, 4), (8, 1), (8, 2), (16, 1), (16, 2)]  # (batch, tokens)
PATHS = ("plain", "unpacked", "packed", "unpadded")


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


def _row(r: dict) -> dict:
    return r | {"packed/unpacked": round(r["packed"] / r["unpacked"], 3),
                "packed/plain": round(r["packed"] / r["plain"], 3),
                "packed/unpadded": round(r["packed"] / r["unpadded"], 3)}


def _show(label: str, r: dict) -> None:
    print(f"{label}: " + "  ".join(f"{k} {r[k]:7.2f} ms" for k in PATHS) +
          f"  packed/unpacked {r['packed/unpacked']:.2f}  packed/unpadded {r['packed/unpadded']:.2f}", flush=True)


def matrices(reps: int) -> dict:
    g = torch.Generator().manual_seed(0)
    out = {}
    for model, shapes, dtype in (("target", TARGET, torch.float32), ("draft", DRAFT, torch.bfloat16)):
        weights = [(torch.randn(*s, generator=g) * 0.02).to(dtype) for s in shapes]
        packed_weights = [w.clone() for w in weights]
        if not all(pack(w) for w in packed_weights):
            raise SystemExit("this torch cannot pack weights (no oneDNN packed inner product)")
        for rows in ROWS:
            xs = {i: torch.randn(rows, i, generator=g).to(dtype) for i in {s[1] for s in shapes}}

            def run(fn, ws):
                return lambda: [fn(xs[w.shape[1]], w) for w in ws]
            r = _row(interleaved({"plain": run(F.linear, weights), "unpacked": run(unpacked_linear, weights),
                                  "packed": run(linear, packed_weights),
                                  "unpadded": run(unpadded_linear, packed_weights)}, reps))
            out[f"{model}/{rows}"] = r
            _show(f"{model:6s} rows {rows:2d}", r)
    return out


@torch.inference_mode()
def model_steps(reps: int) -> dict:
    target = load_model(prepare_default_models()["target"])   # packed at load
    batch_max = max(b for b, _ in STEPS)
    cache = KVCache(target.cfg, batch_max, 128)
    ctx = 64
    prompt = ForwardBatch.ragged([[7] * ctx] * batch_max, [0] * batch_max, list(range(batch_max)))
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
        r = _row(interleaved({"plain": step(F.linear), "unpacked": step(unpacked_linear),
                              "packed": step(linear), "unpadded": step(unpadded_linear)}, reps))
        out[f"{batch}x{tokens}"] = r
        _show(f"target batch {batch:2d} x {tokens} tokens", r)
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
