"""One dataclass per service, filled from flags, environment and an optional config file.

Precedence: command-line flag > environment variable `SSD_<SERVICE>_<FIELD>` > the file given by `--config`
(TOML or JSON, a flat table of the same field names) > the dataclass default. Each field becomes a flag
`--field-name`; its metadata "help" documents it. Unknown keys in the file are an error naming the key.

Every service also takes `--bound-file PATH` (env `SSD_<SERVICE>_BOUND_FILE`): once its sockets are bound it
writes the addresses it actually bound there (`write_bound_file`), so it can be started on port 0.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tomllib
import typing
from pathlib import Path


def _parse_bool(text: str) -> bool:
    low = str(text).strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _converter(tp):
    origin = typing.get_origin(tp)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)) and len(args) == 1:
        inner = _converter(args[0])
        return lambda v: None if v in (None, "", "none", "None") else inner(v)
    if tp is bool:
        return lambda v: v if isinstance(v, bool) else _parse_bool(v)
    if tp in (int, float, str):
        return lambda v: tp(v)
    if tp is Path:
        return lambda v: Path(v)
    if origin in (tuple, list):
        inner = _converter(args[0]) if args else str
        return lambda v: tuple(inner(x) for x in (v if isinstance(v, (list, tuple)) else str(v).split(",") if v else []))
    return lambda v: v


def _read_file(path: Path) -> dict:
    text = path.read_text()
    try:
        return tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot parse config file ({e})") from None


def load_config(cls, argv: list[str] | None, service: str, env: dict | None = None, prog: str | None = None):
    """Build `cls` (a dataclass) for `service` from argv, env and --config; raises SystemExit on bad flags."""
    env = os.environ if env is None else env
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    parser = argparse.ArgumentParser(prog=prog or f"ssd {service}", description=cls.__doc__)
    parser.add_argument("--config", type=Path, default=None, help="TOML or JSON file with these settings")
    for f in fields:
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None,
                            help=f.metadata.get("help", "") + f" (env SSD_{service.upper()}_{f.name.upper()})")
    ns = parser.parse_args(argv)
    values: dict = {}
    if ns.config is not None:
        data = _read_file(ns.config)
        known = {f.name for f in fields}
        for key in data:
            if key not in known:
                raise ValueError(f"{ns.config}: unknown setting {key!r} for {service} (known: {sorted(known)})")
        values.update(data)
    prefix = f"SSD_{service.upper()}_"
    for f in fields:
        if prefix + f.name.upper() in env:
            values[f.name] = env[prefix + f.name.upper()]
        if getattr(ns, f.name) is not None:
            values[f.name] = getattr(ns, f.name)
    kwargs = {}
    for name, raw in values.items():
        try:
            kwargs[name] = _converter(hints[name])(raw)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{service} setting {name}: {e}") from None
    return cls(**kwargs)


def write_bound_file(path: Path | None, addresses: dict) -> None:
    """Write what a service actually bound (`{"grpc_address": "127.0.0.1:40123", ...}`) to `path` as JSON, atomically
    (a temporary file in the same folder, then rename), so a reader sees the whole file or none; no-op for None.

    This is how a service started on port 0 reports its ports: the launcher (`ssd.cli.launcher.Stack`) waits for the
    file instead of picking ports itself, which another process could take between the pick and the bind."""
    if path is None:
        return
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**addresses, "pid": os.getpid()}))
    os.replace(tmp, path)


def read_bound_file(path: Path) -> dict | None:
    """The addresses a service reported with `write_bound_file`, or None while it has not written them yet."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None


def bound_host_port(address: str, port: int) -> str:
    """`address` ("host:port", the port possibly 0) with the port a server actually bound."""
    host, _, _ = address.rpartition(":")
    return f"{host}:{port}"
