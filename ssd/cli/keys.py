"""`ssd keys generate --out DIR`: ZeroMQ CURVE key pairs for the authenticated data plane (ssd.curve)."""
from __future__ import annotations

import sys
from pathlib import Path


def add_parser(sub) -> None:
    keys = sub.add_parser("keys", help="data-plane CURVE keys")
    ksub = keys.add_subparsers(dest="keys_command", required=True)
    kgen = ksub.add_parser("generate", help="write NAME.key (public) and NAME.key_secret for each name")
    kgen.add_argument("--out", type=Path, required=True, help="folder to write the key files into")
    kgen.add_argument("--names", default="router,worker",
                      help="comma-separated key pair names (default: router,worker)")


def run(args) -> int:
    from ssd.curve import generate

    try:
        paths = generate(args.out, [n.strip() for n in args.names.split(",") if n.strip()])
    except (FileExistsError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0
