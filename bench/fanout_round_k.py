"""The router's online fan-out for rounds shorter than the draft's K: split over the outcomes such a round can have,
or over all K + 1 positions as it was (in-process SSD engine, default pair).

A round of k drafted tokens has k + 1 outcomes (the first rejection at 1..k, or all k accepted and the bonus
token). The draft reads a fan-out F_0..F_K for it as F_0..F_{k-1} and F_K (`ssd.engine.forks`). Shorter rounds
than the draft's K come from a pinned K, the adaptive K below the most, its explore rounds, and a request's last
rounds. For each pinned K below `--k`, the in-process SSD engine (greedy, float32, EOS ignored, one prompt at a
time) answers the chat-templated prompts of `ssd.prompts` twice, with the router's `FanoutPolicy` sizing every
round's fan-out as in the services:

- `round`: the split over the round's own outcomes (`FanoutPolicy.fanouts`, what the router sends);
- `pool`: the split over all K + 1 positions, whatever the round's length (the router before this change).

Reported per run: cache hit rate (hits over lookups; in process no entry is late), tokens per round, the forks a
round asked for and the ones the draft could use (F_0..F_{k-1} and F_K), and whether the outputs are the same as the
first run's (greedy: they must be). Hit rates are counts, but the budget follows the draft's and the target's
measured times, so they move a little with the machine's load.

    PYTHONPATH=. python bench/fanout_round_k.py [--ks 5,3] [--pins 1,2,3] [--prompts 8] [--new-tokens 64]
                                                [--out bench/results/fanout_by_round_k.json]

`--ks`: the draft's K, each in turn, with the two runs for every pinned K of `--pins` below it (the shared `--k` of
`bench/pair.py` is not read).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pair import MODELS, add_pair_args, load_pair, run_each  # noqa: E402
from ssd.engine.speculative import SpecConfig, SpeculativeEngine  # noqa: E402
from ssd.prompts import PROMPTS_BY_KIND  # noqa: E402
from ssd.sampling import SamplingParams  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "fanout_by_round_k.json"


def run(target, draft, prompts, k: int, pin: int, layout: str, new_tokens: int) -> tuple[dict, list]:
    """One engine of the draft's K = `k`, every request pinned at `pin`, the fan-out laid out by `layout`."""
    engine = SpeculativeEngine(target, draft, SpecConfig(mode="ssd", k=k, adaptive_fanout=True), max_batch=1)
    core, planner = engine.core, engine.core.planner
    submit, fanouts = core.submit, planner.round_fanouts
    asked, usable = [], []

    def pinned_submit(rid, prompt, params, mode="", k=0, *rest, **kwargs):
        return submit(rid, prompt, params, mode, pin, *rest, **kwargs)

    def laid_out(d, sequences=1, ks=None):
        ks = list(ks or [k])
        by_k = fanouts(d, sequences, ks) if layout == "round" else dict.fromkeys(ks, fanouts(d, sequences)[k])
        for kr, fan in by_k.items():
            asked.append(sum(fan))
            usable.append(sum(fan[:kr]) + fan[-1])
        return by_k

    core.submit, planner.round_fanouts = pinned_submit, laid_out
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    stats, outputs, wall = run_each(engine, prompts, lambda i: params)
    lookups = sum(n for reason, n in stats.cache.items() if reason != "forced")
    row = {"k": k, "pin": pin, "layout": layout, "rounds": stats.rounds, "tokens": stats.tokens,
           "tokens_per_round": round(stats.tokens / stats.rounds, 4) if stats.rounds else 0.0,
           "cache": dict(stats.cache), "hit_rate": round(stats.cache.get("hit", 0) / lookups, 4) if lookups else 0.0,
           "forks_asked": round(sum(asked) / len(asked), 2) if asked else 0.0,
           "forks_usable": round(sum(usable) / len(usable), 2) if usable else 0.0, "wall_s": round(wall, 1)}
    return row, outputs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_pair_args(ap, RESULTS)
    ap.add_argument("--ks", default="5,3", help="the draft's K (the pool's), each in turn")
    ap.add_argument("--pins", default="1,2,3", help="the K each request runs: those below the draft's")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args()
    plan = [(k, p) for k in map(int, args.ks.split(",")) for p in map(int, args.pins.split(",")) if 0 < p < k]
    if not plan:
        raise SystemExit(f"no pinned K of --pins {args.pins} is below a K of --ks {args.ks}")
    target, draft, tok = load_pair(args)
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]))
               for _, p in PROMPTS_BY_KIND[:args.prompts]]
    rows, reference = [], None
    for k, pin in plan:
        for layout in ("pool", "round"):
            row, outputs = run(target, draft, prompts, k, pin, layout, args.new_tokens)
            reference = reference or outputs
            row["outputs_identical"] = outputs == reference
            rows.append(row)
            print(f"K {k} pin {pin} {layout:5s}: hit {row['hit_rate']:.3f} tpr {row['tokens_per_round']:.3f} "
                  f"forks {row['forks_usable']}/{row['forks_asked']} {row['cache']} "
                  f"identical {row['outputs_identical']}", flush=True)
    result = {"date": time.strftime("%Y-%m-%d"), "machine": platform.machine(),
              "config": {"target": str(args.target).replace(str(MODELS), "$MODELS"),
                         "draft": str(args.draft).replace(str(MODELS), "$MODELS"), "plan": plan,
                         "prompts": args.prompts, "new_tokens": args.new_tokens, "threads": args.threads,
                         "command": " ".join(["python bench/fanout_round_k.py", *sys.argv[1:]])},
              "runs": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n| K | pinned K | fan-out over | hit | tokens/round | forks usable / asked | outputs identical |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        over = "all K + 1 positions" if r["layout"] == "pool" else "the round's outcomes"
        print(f"| {r['k']} | {r['pin']} | {over} | {r['hit_rate']:.3f} | {r['tokens_per_round']:.3f} | "
              f"{r['forks_usable']} / {r['forks_asked']} | {r['outputs_identical']} |")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
