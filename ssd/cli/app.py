"""The `ssd` command itself: `build_parser` (one sub-command group per module of ssd.cli, in help order) and
`main`, which runs the role commands straight from argv (their flags are the services' own) and dispatches
every other command to its module."""
from __future__ import annotations

import argparse
import os
import sys

from ssd.cli import bench, generate, keys, models, roles, up
from ssd.cli.parent import die_with_launcher


def version() -> str:
    """The installed distribution's version (ssd.__version__ when ssd runs from a tree that is not installed)."""
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return dist_version("ssd")
    except PackageNotFoundError:
        import ssd

        return ssd.__version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ssd", description="Speculative Speculative Decoding server and tools")
    parser.add_argument("--version", action="version", version=f"ssd {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    models.add_parser(sub)
    keys.add_parser(sub)
    roles.add_parsers(sub)
    up.add_parser(sub)
    bench.add_parser(sub)
    generate.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    die_with_launcher()   # first: a child of `ssd up` or a test's Stack ends with it
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in roles.ROLES:
        return roles.run(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "models":
        return models.run(args)
    if args.command == "keys":
        return keys.run(args)
    if args.command == "up":
        return up.run(args)
    if args.command == "bench":
        return bench.run(args)
    return generate.run(args)
