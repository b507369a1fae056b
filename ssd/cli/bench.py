"""`ssd bench` (AR, SD and SSD through real processes), `ssd bench serve` (a load benchmark of any OpenAI
endpoint) and `ssd bench locust` (the locust suite, ssd/bench/locustfile.py): their arguments, and dispatch into
the benchmarks."""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

import ssd.bench

LOCUSTFILE = Path(ssd.bench.__file__).with_name("locustfile.py")


def _int_at_least(low: int):
    """An argparse type: an integer >= `low` (argparse reports anything else as the argument's error)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    return parse


def _ints_at_least(low: int, empty_ok: bool = False):
    """An argparse type: a comma-separated list of integers >= `low` (as a tuple; `empty_ok`: "" gives ())."""
    one = _int_at_least(low)

    def parse(text: str) -> tuple[int, ...]:
        if not text.strip() and empty_ok:
            return ()
        return tuple(one(part.strip()) for part in text.split(","))
    return parse


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="AR, SD and SSD through real processes; writes bench/results/ssd.json")
    b.add_argument("--new-tokens", type=_int_at_least(1), default=256)
    b.add_argument("--prompts", type=_int_at_least(1), default=16)
    b.add_argument("--batches", type=_ints_at_least(1), default=(1, 2, 4, 8), help="batch sizes, e.g. 1,2,4,8")
    b.add_argument("--k", type=_int_at_least(1), default=3)
    b.add_argument("--ks", type=_ints_at_least(1, empty_ok=True), default=(),
                   help="fixed K values for SD and SSD, e.g. 1,2,3 (default: --k)")
    b.add_argument("--passes", type=_int_at_least(0), default=0,
                   help="passes per batch size, the prompts split among them and the modes' order changed between "
                        "them, so a drift of the machine falls on all modes alike: a Latin square where the number is "
                        "a multiple of the modes', reversed on every other pass otherwise (default 0: the square where "
                        "it costs at most a quarter more prompts, two reversed passes elsewhere)")
    b.add_argument("--models-dir", type=Path, default=None)
    b.add_argument("--draft", type=Path, default=None, help="draft model folder (default: the embedded draft)")
    b.add_argument("--out", type=Path, default=Path("bench/results/ssd.json"))
    from ssd.bench.serve import add_parser as add_serve_parser

    benches = b.add_subparsers(dest="bench_command", required=False,
                               description="`ssd bench serve`: load benchmark of any OpenAI endpoint; "
                                           "`ssd bench locust`: sustained load with locust")
    add_serve_parser(benches)
    # every argument is locust's (`--help` too): '+' as the prefix, so argparse takes none of them as its own
    loc = benches.add_parser("locust", prefix_chars="+", add_help=False,
                             help="the locust load suite (ssd/bench/locustfile.py); every argument is locust's, e.g. "
                                  "--headless -u 20 -t 60s --host http://127.0.0.1:8000 --grpc-address 127.0.0.1:50051")
    loc.add_argument("locust_args", nargs=argparse.REMAINDER)


def run_locust(locust_args: list[str]) -> int:
    """Replaces this process with locust on the packaged locustfile (so its signals and exit status are locust's)."""
    if importlib.util.find_spec("locust") is None:
        print("error: `ssd bench locust` needs locust, which is not installed: pip install 'ssd[load]' "
              f"(then it runs `locust -f {LOCUSTFILE} ...`)", file=sys.stderr)
        return 2
    os.execv(sys.executable, [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), *locust_args])
    return 1   # not reached


def run(args) -> int:
    if args.bench_command == "locust":
        return run_locust(args.locust_args)
    if args.bench_command == "serve":
        from ssd.bench.serve import run as bench_serve

        return bench_serve(args)
    from ssd.bench.stack import bench, markdown

    result = bench(args.new_tokens, args.prompts, args.batches, args.k, args.models_dir, args.draft, args.out,
                   ks=args.ks or None, passes=args.passes)
    print(markdown(result))
    return 0
