"""`ssd target|draft|router [flags]`: one service in this process, configured from its flags, `SSD_<ROLE>_*`
environment variables and `--config FILE` (ssd.service_config). The library's only way into services/: the
command imports the service it runs (tests/test_import_graph.py allows exactly these edges)."""
from __future__ import annotations

import sys

ROLES = ("target", "draft", "router")


def add_parsers(sub) -> None:
    """Placeholders for `ssd --help`: `main` hands a role's argv to the service's own parser."""
    for role in ROLES:
        sub.add_parser(role, help=f"run the {role} service (see `ssd {role} --help`)", add_help=False)


def run(role: str, argv: list[str]) -> int:
    from ssd.cpus import parse_cpus
    from ssd.service_config import load_config

    if role == "target":
        from services.target.service import TargetConfig as Config, run
    elif role == "draft":
        from services.draft.service import DraftConfig as Config, run
    else:
        from services.router.service import RouterConfig as Config, run
    try:
        cfg = load_config(Config, argv, role)
        if cfg.cpus:
            parse_cpus(cfg.cpus)   # a bad affinity is a flag error, before anything loads
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return run(cfg)
