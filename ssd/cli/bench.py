"""`ssd bench` (AR, SD and SSD through real processes) and `ssd bench serve` (a load benchmark of any OpenAI
endpoint): their arguments, and dispatch into the benchmarks."""
from __future__ import annotations

from pathlib import Path


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="AR, SD and SSD through real processes; writes bench/results/ssd.json")
    b.add_argument("--new-tokens", type=int, default=256)
    b.add_argument("--prompts", type=int, default=16)
    b.add_argument("--batches", default="1,2,4,8")
    b.add_argument("--k", type=int, default=3)
    b.add_argument("--ks", default="", help="fixed K values for SD and SSD, e.g. 1,2,3 (default: --k)")
    b.add_argument("--models-dir", type=Path, default=None)
    b.add_argument("--draft", type=Path, default=None, help="draft model folder (default: the embedded draft)")
    b.add_argument("--out", type=Path, default=Path("bench/results/ssd.json"))
    from ssd.bench.serve import add_parser as add_serve_parser

    add_serve_parser(b.add_subparsers(dest="bench_command", required=False,
                                      description="`ssd bench serve`: load benchmark of any OpenAI endpoint"))


def run(args) -> int:
    if args.bench_command == "serve":
        from ssd.bench.serve import run as bench_serve

        return bench_serve(args)
    from ssd.bench.stack import bench, markdown

    result = bench(args.new_tokens, args.prompts, tuple(int(x) for x in args.batches.split(",")), args.k,
                   args.models_dir, args.draft, args.out,
                   ks=tuple(int(x) for x in args.ks.split(",")) if args.ks else None)
    print(markdown(result))
    return 0
