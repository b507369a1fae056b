"""What reproducible seeds cost: coupled (position-keyed Gumbel-max) draws against rejection sampling, on the
default pair (in-process engine).

A seeded sampled request by default draws each position's token from the seed and the position alone, and the
draft picks with the same noise (`SamplingParams.coupled`): its output is the same in every mode and at any K. A
drafted token is then accepted only when the draft's pick equals the target's, which happens less often than
rejection sampling accepts (probability min(1, p/q)). `seed_stream` keeps rejection sampling. For each temperature
and mode (sd and ssd at K=3), every prompt runs once per seed in both ways; per way: acceptance rate, tokens per
round, the SSD cache hit rate and the wall time, plus whether every coupled output equals the coupled AR output
(it must: the exactness claim, rechecked here on other prompts than the tests').

    python bench/seeds.py [--prompts 6] [--seeds 2] [--new-tokens 32] [--temperatures 0.7,1.0] [--k 3]
                          [--threads 1] [--out bench/results/seeds.json]

Acceptance and hit rates are counts (independent of the machine's load); wall times are ratios within one run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))


from ssd.engine.ar import AREngine  # noqa: E402
from pair import add_pair_args, load_pair, run_each as run  # noqa: E402
from ssd.engine.speculative import SpecConfig, SpeculativeEngine  # noqa: E402
from ssd.prompts import PROMPTS_BY_KIND  # noqa: E402
from ssd.sampling import SamplingParams  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "seeds.json"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_pair_args(ap, RESULTS)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--seeds", type=int, default=2, help="seeds per prompt")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--temperatures", default="0.7,1.0")
    args = ap.parse_args()
    target, draft, tok = load_pair(args)
    # the last prompts of ssd.prompts: not the ones the service tests take first
    chosen = PROMPTS_BY_KIND[-args.prompts:]
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for _, p in chosen]
    jobs = [(p, s) for p in prompts for s in range(args.seeds)]
    rows = []
    for temp in [float(t) for t in args.temperatures.split(",")]:
        def params_for(i, stream, temp=temp):
            return SamplingParams(temperature=temp, seed=1000 + i, seed_stream=stream, max_tokens=args.new_tokens,
                                  ignore_eos=True)
        ar = AREngine(target, max_batch=1)
        _, ar_out, ar_wall = run(ar, [p for p, _ in jobs], lambda i: params_for(i, False))
        for mode in ("sd", "ssd"):
            for way, stream in (("rejection sampling (seed_stream)", True), ("coupled (default)", False)):
                engine = SpeculativeEngine(target, draft, SpecConfig(mode=mode, k=args.k), max_batch=1)
                stats, out, wall = run(engine, [p for p, _ in jobs], lambda i: params_for(i, stream))
                row = {"temperature": temp, "mode": mode, "k": args.k, "draws": way,
                       "acceptance_rate": round(stats.acceptance_rate, 4),
                       "tokens_per_round": round(stats.tokens_per_round, 4),
                       "hit_rate": round(stats.hit_rate, 4) if mode == "ssd" else None,
                       "wall_s": round(wall, 2), "ar_wall_s": round(ar_wall, 2),
                       "speedup_vs_ar": round(ar_wall / wall, 3)}
                if not stream:
                    row["outputs_equal_coupled_ar"] = out == ar_out
                rows.append(row)
                print(json.dumps(row), flush=True)
    result = {"command": "python " + " ".join(sys.argv), "machine": platform.processor() or platform.machine(),
              "threads": args.threads, "prompts": len(prompts), "seeds_per_prompt": args.seeds,
              "new_tokens": args.new_tokens, "target": args.target.name, "draft": args.draft.name, "runs": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
