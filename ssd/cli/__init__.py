"""The `ssd` command line (console script `ssd = ssd.cli:main`; `python -m ssd.cli ...` runs the same).

    ssd models prepare|download|distill   local model folders (`models.py`)
    ssd keys generate --out DIR           CURVE key pairs for the data plane (`keys.py`)
    ssd target|draft|router [flags]       one service, for containers and `ssd up` (`roles.py`)
    ssd up [--demo PROMPT]                router + target + draft(s) as supervised processes (`up.py`, over
                                          the process supervisor `launcher.py`)
    ssd bench [serve]                     benchmarks (`bench.py`, into the `ssd.bench` package)
    ssd generate PROMPT                   stream a completion from a router, or `--local` (`generate.py`)
    ssd --version                         the installed version

`app.py` assembles the parser from each module's `add_parser` and dispatches; `__main__.py` is what `python -m
ssd.cli <role>` (how the launcher and the deployments start every service) runs.
"""
from ssd.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
