"""Tokens per round by the previous round's outcome: SSD's cache hits against SD's JIT rounds, in process.

A round's draft tokens come, in SD, from a JIT drafted after the previous round's outcome with the target's features
of every committed token; in SSD, on a hit, from the cache entry the draft speculated for that outcome while the
target verified, with its own estimates of the features of the tokens the outcome accepted. How much that costs
depends on the outcome: after j accepted tokens (j = K: all, plus the bonus token) the entry's chain starts j + 1
positions past the last exact feature. This runs the in-process engine (`ssd.engine.speculative`, the router's round
core with local workers) in both modes at batch 1, greedy, over the held-out prompts, and counts each round by its
source (cache, or the JIT of a miss; SD's are all JITs) and the previous round's accepted count j: rounds, the first
drafted token's acceptance, tokens per round.

    PYTHONPATH=. python bench/by_outcome.py [--prompts 20] [--new-tokens 160] [--budget 48]
                                            [--out bench/results/by_outcome.json]

One thread, the draft in bfloat16 as the draft service runs it. The in-process engine speculates before each
verify rather than beside it, so there is no timing here: acceptance only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from ssd.distill.data import chat_ids  # noqa: E402
from ssd.engine.speculative import SpecConfig, SpeculativeEngine  # noqa: E402
from ssd.models.loader import load_model  # noqa: E402
from ssd.models.prepare import prepare_default_models  # noqa: E402
from ssd.paths import default_models_dir  # noqa: E402
from ssd.prompts import PROMPTS_BY_KIND  # noqa: E402
from ssd.sampling import SamplingParams  # noqa: E402
from ssd.tokenizer import Tokenizer  # noqa: E402


def by_outcome(target, draft, prompts: list[list[int]], mode: str, k: int, new_tokens: int,
               budget: int | None) -> dict:
    """{source: {previous j: [rounds, rounds whose first drafted token was accepted, tokens committed]}}, j = -1 for
    a sequence's first round."""
    engine = SpeculativeEngine(target, draft, SpecConfig(mode=mode, k=k, budget=budget), max_batch=1)
    counts: dict = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))
    previous: dict[int, int] = {}
    apply = engine.core.replies._apply_outcome

    def counted(req, out, block, logprobs=None):
        rnd = req.round
        if rnd.tokens and rnd.source in ("cache", "jit"):
            c = counts[rnd.source][previous.get(req.seq, -1)]
            c[0], c[1], c[2] = c[0] + 1, c[1] + (out.accepted > 0), c[2] + out.accepted + 1
        previous[req.seq] = out.accepted
        return apply(req, out, block, logprobs)

    engine.core.replies._apply_outcome = counted
    for p in prompts:
        engine.generate([p], SamplingParams(max_tokens=new_tokens))
    return {src: {j: c for j, c in sorted(by_j.items())} for src, by_j in counts.items()}


def rows(mode: str, counts: dict) -> list[dict]:
    out = []
    for src, by_j in counts.items():
        total = [sum(c[i] for c in by_j.values()) for i in range(3)]
        for j, (n, first, tokens) in [*by_j.items(), ("all", total)]:
            out.append({"mode": mode, "source": src, "previous_accepted": j, "rounds": n,
                        "first_token_acceptance": round(first / n, 4), "tokens_per_round": round(tokens / n, 4)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--new-tokens", type=int, default=160)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--budget", type=int, default=48, help="SSD's forks per sequence and round")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "by_outcome.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    paths = prepare_default_models(default_models_dir())
    target, draft = load_model(paths["target"]), load_model(paths["draft"], dtype=torch.bfloat16)
    tok = Tokenizer.from_folder(paths["target"])
    prompts = [chat_ids(tok, text) for _, text in PROMPTS_BY_KIND][:args.prompts]
    table = []
    for mode in ("sd", "ssd"):
        table += rows(mode, by_outcome(target, draft, prompts, mode, args.k, args.new_tokens,
                                       args.budget if mode == "ssd" else None))
    result = {"date": time.strftime("%Y-%m-%d"), "prompts": len(prompts), "new_tokens": args.new_tokens,
              "k": args.k, "ssd_budget": args.budget, "torch": torch.__version__, "draft_dtype": "bfloat16",
              "rows": table}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("| mode | source | previous round accepted | rounds | first drafted token accepted | tokens/round |\n"
          "|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['mode']} | {r['source']} | {r['previous_accepted']} | {r['rounds']} | "
              f"{r['first_token_acceptance']:.3f} | {r['tokens_per_round']:.3f} |")


if __name__ == "__main__":
    main()
