"""The router's cost of keeping a sequence's features while its draft is sent nothing (K = 0 in sd and ssd): each
round's rows kept by the `FeatureLedger` (appended in place) against the same rows folded with `merge` as bytes (how
the ledger kept them before 2026-12-06), for 16 sequences over rounds of one row each, in one process:

    PYTHONPATH=. python bench/feature_ledger.py [--rounds 128,512,2048] [--out bench/results/feature_ledger.json]

Milliseconds per round (mean over the rounds), and what one `take` of every sequence's block costs at the end.
(`bench/results/feature_ledger_long_ab.jsonl`: the verify trace at batch 16 with 768 new tokens, ar, sd-auto,
ssd-auto and ar on one stack of c86ba94 (merged as bytes) and one of 8c8e468 (appended in place), 2026-12-06.)
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ssd.round.features import FeatureLedger, merge  # noqa: E402
from ssd.round.metrics import RoundMetrics  # noqa: E402

HIDDEN = 576   # the default target's hidden size: rows of 1152 bytes
SEQS = 16


class _Pool:
    hidden_size = HIDDEN

    def reads_features(self, draft) -> bool:
        return True


def ledger_ms(rounds: int) -> tuple[float, float]:
    """(ms per round keeping, ms for one take of every block) with the ledger."""
    ledger = FeatureLedger(_Pool(), RoundMetrics())
    reqs = [SimpleNamespace(seq=s, mode="sd", draft="d", target=None) for s in range(SEQS)]
    row = b"\0" * (2 * HIDDEN)
    t0 = time.perf_counter()
    for r in range(rounds):
        for req in reqs:
            ledger.keep(req, [100 + r, row])
    kept = time.perf_counter() - t0
    t0 = time.perf_counter()
    for req in reqs:
        ledger.take(req)
    return 1e3 * kept / rounds, 1e3 * (time.perf_counter() - t0)


def merged_ms(rounds: int) -> float:
    """ms per round folding the same rows with `merge` as bytes."""
    pending: dict = {s: None for s in range(SEQS)}
    row = b"\0" * (2 * HIDDEN)
    t0 = time.perf_counter()
    for r in range(rounds):
        for s in range(SEQS):
            pending[s] = merge(pending[s], 100 + r, row, 2 * HIDDEN)
    return 1e3 * (time.perf_counter() - t0) / rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", default="128,512,2048")
    ap.add_argument("--out", default="bench/results/feature_ledger.json")
    a = ap.parse_args()
    rows = []
    for rounds in (int(x) for x in a.rounds.split(",")):
        keep, take = ledger_ms(rounds)
        rows.append({"rounds": rounds, "ledger_ms_per_round": round(keep, 4), "take_all_ms": round(take, 2),
                     "merged_ms_per_round": round(merged_ms(rounds), 4)})
    Path(a.out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "sequences": SEQS,
                                       "machine": platform.processor() or platform.machine(), "rows": rows},
                                      indent=1) + "\n")
    print("| rounds | ledger ms a round | merged as bytes ms a round | merged / ledger | take of all 16 ms |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['rounds']} | {r['ledger_ms_per_round']:.3f} | {r['merged_ms_per_round']:.3f} | "
              f"{r['merged_ms_per_round'] / r['ledger_ms_per_round']:.1f} | {r['take_all_ms']:.1f} |")


if __name__ == "__main__":
    main()
