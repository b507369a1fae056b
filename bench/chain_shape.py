"""Which shape of speculation pays at batch 1 on this host: more verify rows (a longer chain, or a tree of several
candidates), or a chain the draft stops where its own confidence runs out (`--min-confidence`)?

Two measurements, in one process, one thread, the default pair:
- the target's verify of one sequence at 1..8 positions (`TargetWorker.verify`, features on, the service's call),
  interleaved, median wall ms, relative to one position (a decode step). A tree that adds a second candidate chain
  adds its rows: this is its price;
- along the target's greedy answers to the held-out prompts (teacher-forced: the draft reads the target's
  features, as after a full acceptance), the draft's chain of `--depth` tokens from every position, with the
  draft's probability of each of its tokens. Replayed offline: tokens a round (accepted + 1) and the verify cost
  of each policy (fixed K, and the confidence stop at several thresholds and depths), as tokens per second of
  verify time plus a fixed per-round overhead (`--overhead-ms`: the router hop and the JITs of misses, measured in
  `ssd bench` at about 3 ms). Only relative figures mean anything: the served acceptance is lower than the
  teacher-forced one (cache entries are drafted without the target's features). Also the draft's calibration:
  how often its first token was the target's, by the probability it gave that token.

    PYTHONPATH=. python bench/chain_shape.py [--depth 7] [--overhead-ms 3] [--out bench/results/chain_shape.json]
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
import torch.nn.functional as F  # noqa: E402

from ssd.distill.corpus import make_batch  # noqa: E402
from ssd.distill.evaluate import _head, held_out_sequences  # noqa: E402
from ssd.distill.unroll import unrolled_logits  # noqa: E402
from ssd.engine.target import TargetWorker  # noqa: E402
from ssd.models.loader import load_model  # noqa: E402
from ssd.models.prepare import prepare_default_models  # noqa: E402
from ssd.sampling import SamplingParams  # noqa: E402
from ssd.tokenizer import Tokenizer  # noqa: E402
from ssd.wire import VerifyItem  # noqa: E402
from ssd.worker.service import torch_dtype  # noqa: E402

MAX_ROWS = 8


def verify_cost(target, reps: int, prompt_len: int = 200) -> dict[int, float]:
    """Median ms of a one-sequence verify at 1..MAX_ROWS positions (K = rows - 1 drafted tokens)."""
    worker = TargetWorker(target, 1, prompt_len + reps * MAX_ROWS * (MAX_ROWS + 1) + 16)
    rng = random.Random(0)
    worker.prefill([(0, [rng.randrange(100, 20000) for _ in range(prompt_len)], SamplingParams())], features=True)
    times: dict[int, list[float]] = {n: [] for n in range(1, MAX_ROWS + 1)}
    for rep in range(reps + 3):
        for n in times:
            tokens = [rng.randrange(100, 20000) for _ in range(n - 1)]
            t0 = time.perf_counter()
            worker.verify([VerifyItem(0, tokens, None)], features=True)
            if rep >= 3:   # warm-up
                times[n].append(time.perf_counter() - t0)
    return {n: 1e3 * statistics.median(v) for n, v in times.items()}


def chains(target, draft, tok, depth: int, new_tokens: int) -> list[tuple[str, list[int], list[float]]]:
    """Per start position in the held-out answers: (kind, whether each drafted token is the target's, the draft's
    probability of each)."""
    seqs = held_out_sequences(target, tok, new_tokens)
    head, norm = _head(target), target.norm
    out = []
    with torch.inference_mode():
        for i in range(0, len(seqs), 8):
            chunk = seqs[i:i + 8]
            toks, feats, valid, _ = make_batch(chunk, 1024, draft.embed.device)
            logits = unrolled_logits(draft, toks, feats, depth)
            labels = F.linear(norm(feats), head).float().argmax(-1).tolist()
            preds = [draft.vocab_ids[lg.argmax(-1)].tolist() for lg in logits]
            confs = [torch.softmax(lg.float(), -1).amax(-1).tolist() for lg in logits]
            counts = valid.sum(-1).tolist()
            for b, (_, _, plen, kind) in enumerate(chunk):
                for s in range(max(0, plen - 1), counts[b] - depth + 1):
                    out.append((kind, [int(preds[d][b][s + d] == labels[b][s + d]) for d in range(depth)],
                                [confs[d][b][s + d] for d in range(depth)]))
    return out


def stop_length(conf: list[float], tau: float, k: int) -> int:
    """The draft's rule (`DraftWorker.min_confidence`): keep token d while d == 0 or the running product >= tau."""
    product = 1.0
    for d, c in enumerate(conf[:k]):
        product *= c
        if d > 0 and product < tau:
            return d
    return k


def replay(recs, cost: dict[int, float], overhead: float, k: int, tau: float = 0.0) -> dict:
    tokens = seconds = rows = 0.0
    for _, match, conf in recs:
        n = stop_length(conf, tau, k) if tau else k
        accepted = 0
        while accepted < n and match[accepted]:
            accepted += 1
        tokens += 1 + accepted
        rows += n + 1
        seconds += cost[n + 1] + overhead
    return {"k": k, "min_confidence": tau, "tokens_per_round": round(tokens / len(recs), 3),
            "rows_per_round": round(rows / len(recs), 2), "tok_per_s": round(1e3 * tokens / seconds, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--depth", type=int, default=7)
    ap.add_argument("--new-tokens", type=int, default=160)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--overhead-ms", type=float, default=3.0)
    ap.add_argument("--out", default="bench/results/chain_shape.json")
    a = ap.parse_args()
    if not 2 <= a.depth < MAX_ROWS:
        ap.error(f"--depth must be in 2..{MAX_ROWS - 1}")
    torch.set_num_threads(1)
    paths = prepare_default_models()
    target = load_model(paths["target"])
    draft = load_model(paths["draft"], dtype=torch_dtype("auto", "cpu", "draft"))
    cost = verify_cost(target, a.reps)
    recs = chains(target, draft, Tokenizer.from_folder(paths["target"]), a.depth, a.new_tokens)
    fixed = [replay(recs, cost, a.overhead_ms, k) for k in range(1, a.depth + 1)]
    stops = [replay(recs, cost, a.overhead_ms, k, tau) for tau in (0.05, 0.1, 0.2, 0.3)
             for k in range(3, a.depth + 1)]
    base = next(r for r in fixed if r["k"] == 3)["tok_per_s"]
    for r in fixed + stops:
        r["vs_fixed_k3"] = round(r["tok_per_s"] / base, 3)
    calibration = {}   # the draft's probability for its first token, in tenths: how often the target agreed
    for _, match, conf in recs:
        bucket = calibration.setdefault(f"{min(9, int(conf[0] * 10)) / 10:.1f}", [0, 0])
        bucket[0] += match[0]
        bucket[1] += 1
    result = {"date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or platform.machine(),
              "torch": torch.__version__, "threads": 1, "depth": a.depth, "positions": len(recs),
              "overhead_ms": a.overhead_ms,
              "verify_ms_by_rows": {n: round(ms, 2) for n, ms in cost.items()},
              "verify_relative_to_one_row": {n: round(ms / cost[1], 3) for n, ms in cost.items()},
              "fixed": fixed, "confidence_stop": stops,
              "calibration": {b: {"accepted": round(a / n, 3), "positions": n}
                              for b, (a, n) in sorted(calibration.items())}}
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print("| rows | " + " | ".join(str(n) for n in cost) + " |")
    print("|---|" + "---|" * len(cost))
    print("| verify / 1 row | " + " | ".join(f"{ms / cost[1]:.3f}" for ms in cost.values()) + " |")
    print()
    print("| policy | tokens a round | rows a round | vs fixed K = 3 |")
    print("|---|---|---|---|")
    for r in fixed + stops:
        name = f"K = {r['k']}" + (f", stop below {r['min_confidence']}" if r["min_confidence"] else "")
        print(f"| {name} | {r['tokens_per_round']} | {r['rows_per_round']} | {r['vs_fixed_k3']} |")


if __name__ == "__main__":
    main()
