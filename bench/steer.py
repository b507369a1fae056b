"""What steering the draft by a request's grammar buys: constrained greedy SD and SSD with the draft steered
(`ssd.engine.draft_grammar`, the default) and unsteered (its grammar tokenizer removed; the target still masks),
on the default pair (in-process engine).

Each case is a chat prompt with a constraint (JSON schemas, json_object, regexes, a choice) that none of the
tests use. Per mode and way: the acceptance rate, tokens per round, SSD's cache hit rate, the wall time, and
whether every output equals constrained AR (it must: steering only changes what is proposed).

    python bench/steer.py [--new-tokens 48] [--k 3] [--threads 1] [--out bench/results/steer.json]

Acceptance, tokens per round and hit rates are counts (independent of the machine's load); wall times are
ratios within one run.
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

from pair import add_pair_args, load_pair, run_each  # noqa: E402
from ssd.constraints import Constraint, grammar_for  # noqa: E402
from ssd.engine.ar import AREngine  # noqa: E402
from ssd.engine.speculative import SpecConfig, SpeculativeEngine  # noqa: E402
from ssd.sampling import SamplingParams  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "steer.json"
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "email": {"type": "string", "maxLength": 30}},
          "required": ["name", "age", "email"], "additionalProperties": False}
BOOK = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 30},
                                         "author": {"type": "string", "maxLength": 20},
                                         "year": {"type": "integer"}, "genres": {"type": "array", "maxItems": 3,
                                                                                  "items": {"type": "string"}}},
        "required": ["title", "author", "year", "genres"], "additionalProperties": False}
CASES = [
    ("Invent a customer record with a name, an age and an email address.", Constraint("json_schema", json.dumps(PERSON))),
    ("Recommend a classic novel, with its author, year and genres.", Constraint("json_schema", json.dumps(BOOK))),
    ("List three facts about the Moon as a JSON object.", Constraint("json_object")),
    ("When did the first person walk on the Moon? Give the date.", Constraint("regex", "[0-9]{4}-[0-9]{2}-[0-9]{2}")),
    ("Write a US phone number for a pizza shop.", Constraint("regex", r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}")),
    ("Which is larger, an elephant or a mouse?", Constraint("lark", 'start: "an elephant" | "a mouse"')),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_pair_args(ap, RESULTS)
    ap.add_argument("--new-tokens", type=int, default=48)
    args = ap.parse_args()
    target, draft, tok = load_pair(args)
    grammar = grammar_for(args.target, target.cfg.vocab_size)()
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p, _ in CASES]
    params = [SamplingParams(max_tokens=args.new_tokens, constraint=c) for _, c in CASES]
    ar = AREngine(target, max_batch=1, grammar_tokenizer=grammar)
    _, ar_out, ar_wall = run_each(ar, prompts, lambda i: [params[i]])
    rows = []
    for mode in ("sd", "ssd"):
        for way in ("unsteered", "steered (default)"):
            engine = SpeculativeEngine(target, draft, SpecConfig(mode=mode, k=args.k), max_batch=1,
                                       grammar_tokenizer=grammar)
            if way == "unsteered":
                engine.draft._grammar = None
            stats, out, wall = run_each(engine, prompts, lambda i: [params[i]])
            row = {"mode": mode, "k": args.k, "draft": way,
                   "acceptance_rate": round(stats.acceptance_rate, 4),
                   "tokens_per_round": round(stats.tokens_per_round, 4),
                   "hit_rate": round(stats.hit_rate, 4) if mode == "ssd" else None,
                   "rounds": stats.rounds, "wall_s": round(wall, 2), "ar_wall_s": round(ar_wall, 2),
                   "speedup_vs_ar": round(ar_wall / wall, 3), "outputs_equal_ar": out == ar_out}
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {"command": "python " + " ".join(sys.argv), "machine": platform.processor() or platform.machine(),
              "threads": args.threads, "cases": [{"prompt": p, "kind": c.kind} for p, c in CASES],
              "new_tokens": args.new_tokens, "target": args.target.name, "draft": args.draft.name,
              "outputs": [tok.decode(o) for o in ar_out], "runs": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
