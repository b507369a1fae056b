"""Where a round's CPU time goes, component by component, in one process on the default pair.

Components (batch 1 and 8, greedy, fp32, `torch.set_num_threads(1)`):
- target verify (K=3): `TargetWorker.verify` against the model time inside it (forward + output layer), and a
  bare forward + output layer of the same shape on a prepared batch;
- draft round: `DraftWorker.speculate` (glue forward, forks, K branch steps) against the model time inside it;
- AR decode step: `AREngine.step` against the model time inside it;
- wire: encode + decode of a Verify batch (greedy, and with top-32 proposals) and of the CacheEntries of one
  sequence (2(K+1) entries, greedy and with proposals).
Overhead = component time - model time: the Python and tensor glue that a faster model would not remove.
Each figure is the median of `--reps` calls, in CPU time of the process (one thread: time other processes
take from the shared cores is not counted). Writes bench/results/profile.json (`--label` keys the run, so a
before and an after run can live in one file).

    PYTHONPATH=. python bench/profile_round.py [--label after] [--reps 20] [--batches 1 8]
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

from ssd import wire  # noqa: E402
from ssd.engine.ar import AREngine  # noqa: E402
from ssd.engine.draft import DraftParams, DraftWorker  # noqa: E402
from ssd.engine.target import TargetWorker  # noqa: E402
from ssd.models.decoder import ForwardBatch  # noqa: E402
from ssd.models.loader import load_model  # noqa: E402
from ssd.models.prepare import prepare_default_models  # noqa: E402
from ssd.sampling import SamplingParams  # noqa: E402

K, PROMPT_LEN, TOP_K = 3, 64, 32
# CPU time of this process, not wall time: with one thread it leaves out the time other processes hold the core
CLOCK = time.process_time
RESULTS = Path(__file__).resolve().parent / "results" / "profile.json"


class ModelTimer:
    """Wraps a model's forward and logits and sums the seconds spent inside them."""

    def __init__(self, model):
        self.model, self.seconds = model, 0.0
        self._forward, self._logits = model.forward, model.logits

        def timed(fn):
            def run(*a, **kw):
                t0 = CLOCK()
                out = fn(*a, **kw)
                self.seconds += CLOCK() - t0
                return out
            return run
        model.forward, model.logits = timed(self._forward), timed(self._logits)

    def __call__(self, *a, **kw):
        return self.model(*a, **kw)


def median_ms(fn, reps: int, timer: ModelTimer | None = None) -> dict:
    fn()  # warm-up
    total, inside = [], []
    for _ in range(reps):
        if timer is not None:
            timer.seconds = 0.0
        t0 = CLOCK()
        fn()
        total.append(CLOCK() - t0)
        inside.append(timer.seconds if timer is not None else 0.0)
    out = {"ms": round(1e3 * statistics.median(total), 3)}
    if timer is not None:
        model = statistics.median(inside)
        out |= {"model_ms": round(1e3 * model, 3),
                "overhead_ms": round(1e3 * statistics.median(t - i for t, i in zip(total, inside)), 3)}
    return out


def prompts(batch: int, vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(vocab) for _ in range(PROMPT_LEN)] for _ in range(batch)]


def profile_target(target, batch: int, reps: int) -> dict:
    worker = TargetWorker(target, batch, PROMPT_LEN + (reps + 2) * (K + 1) + 8)
    worker.prefill([(i, p, SamplingParams()) for i, p in enumerate(prompts(batch, target.cfg.vocab_size))])
    rng = random.Random(1)

    def verify():
        worker.verify([wire.VerifyItem(i, [rng.randrange(100, 1000) for _ in range(K)], None) for i in range(batch)])

    timer = ModelTimer(target)
    try:
        step = median_ms(verify, reps, timer)
    finally:
        target.forward, target.logits = timer._forward, timer._logits
    start = min(len(s.tokens) for s in worker.seqs.values()) - 1
    fb = ForwardBatch.ragged([[5] * (K + 1)] * batch, [start] * batch, [s.slot for s in worker.seqs.values()])

    @torch.inference_mode()
    def bare():
        target.logits(target(fb, worker.cache))

    return {"verify": step, "bare_forward": median_ms(bare, reps)}


def profile_draft(draft, batch: int, reps: int) -> dict:
    fanout = [2] * (K + 1)
    worker = DraftWorker(draft, batch, PROMPT_LEN + 4 * K, K, fanout)
    for i, p in enumerate(prompts(batch, draft.cfg.vocab_size)):
        worker.add(i, p, DraftParams())
    worker.speculate([(i, [7] * K) for i in range(batch)])  # computes the prompts' KV
    items = [(i, [11, 12, 13]) for i in range(batch)]
    timer = ModelTimer(draft)
    try:
        return {"speculate": median_ms(lambda: worker.speculate(items), reps, timer)}
    finally:
        draft.forward, draft.logits = timer._forward, timer._logits


def profile_ar(target, batch: int, reps: int) -> dict:
    engine = AREngine(target, max_batch=batch, max_len=PROMPT_LEN + reps + 8)
    for p in prompts(batch, target.cfg.vocab_size):
        engine.add_request(p, SamplingParams(max_tokens=reps + 4))
    engine.step()  # prefill
    timer = ModelTimer(target)
    try:
        return {"decode_step": median_ms(engine.step, reps, timer)}
    finally:
        target.forward, target.logits = timer._forward, timer._logits


def proposal_rows(n: int, rng: random.Random) -> list[tuple[list[int], list[float]]]:
    return [(rng.sample(range(49152), TOP_K), [1.0 / TOP_K] * TOP_K) for _ in range(n)]


def profile_wire(batch: int, reps: int) -> dict:
    rng = random.Random(2)
    greedy = wire.Verify(1, [wire.VerifyItem(i, [rng.randrange(49152) for _ in range(K)], None)
                             for i in range(batch)])
    sampled = wire.Verify(1, [wire.VerifyItem(i, [rng.randrange(49152) for _ in range(K)], proposal_rows(K, rng))
                              for i in range(batch)])
    n = 2 * (K + 1)
    entries = wire.CacheEntries(0, 3, [wire.CacheEntry(j % (K + 1), j, [rng.randrange(49152) for _ in range(K)],
                                                       None) for j in range(n)], 0.01)
    entries_q = wire.CacheEntries(0, 3, [wire.CacheEntry(j % (K + 1), j, [rng.randrange(49152) for _ in range(K)],
                                                         proposal_rows(K, rng)) for j in range(n)], 0.01)

    def roundtrip(msg):
        return lambda: wire.decode(wire.encode(msg))

    out = {}
    for name, msg in [("verify_greedy", greedy), ("verify_top32", sampled),
                      ("cache_entries_greedy", entries), ("cache_entries_top32", entries_q)]:
        r = median_ms(roundtrip(msg), reps * 10)
        out[name] = {"us": round(1e3 * r["ms"], 1), "bytes": len(wire.encode(msg)[1])}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", default="current")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    paths = prepare_default_models()
    target, draft = load_model(paths["target"]), load_model(paths["draft"])
    run = {"config": {"k": K, "prompt_len": PROMPT_LEN, "reps": args.reps, "threads": args.threads,
                      "torch": torch.__version__, "clock": "process_time", "machine": platform.machine(),
                      "load_avg": os.getloadavg()[0], "time": time.strftime("%Y-%m-%d %H:%M:%S")}}
    for b in args.batches:
        row = profile_target(target, b, args.reps) | profile_draft(draft, b, args.reps) | \
            profile_ar(target, b, args.reps)
        row["wire"] = profile_wire(b, args.reps)
        run[f"batch{b}"] = row
        print(f"batch {b}: {json.dumps(row)}", flush=True)
    results = json.loads(args.out.read_text()) if args.out.is_file() else {}
    results[args.label] = run
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out} [{args.label}]")


if __name__ == "__main__":
    main()
