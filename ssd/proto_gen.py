"""Generate the Python stubs of `proto/ssd/v1/*.proto` into the package `ssd.pb`.

    python -m ssd.proto_gen            # write ssd/pb/
    python -m ssd.proto_gen --check    # exit 1, listing what differs, if ssd/pb/ is stale or edited

The package folder is owned by this command: every file in it (apart from `__pycache__`) is generated, and
`--check` reports files that differ, are missing, or should not be there. protoc writes `ssd/v1/x_pb2.py`
importing `from ssd.v1 import y_pb2`; the stubs are moved into one flat package and those imports rewritten
to `from ssd.pb import y_pb2`. The output depends only on the .proto files and the pinned grpcio-tools.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from importlib.resources import files
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROTO_ROOT = REPO / "proto"
PROTO_PACKAGE = "ssd/v1"  # folder under PROTO_ROOT, so proto package ssd.v1
OUT_DIR = Path(__file__).resolve().parent / "pb"
PY_PACKAGE = "ssd.pb"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")

INIT = '''"""Generated gRPC stubs of proto/ssd/v1 (`python -m ssd.proto_gen`). Do not edit by hand."""
'''


def _rewrite(text: str) -> str:
    """Point the imports and module names protoc derives from the proto path at the flat package."""
    src = re.escape(PROTO_PACKAGE.replace("/", "."))
    text = re.sub(rf"^from {src} import ", f"from {PY_PACKAGE} import ", text, flags=re.M)
    text = re.sub(rf"^import {src}\.(\w+_pb2)\b", rf"from {PY_PACKAGE} import \1", text, flags=re.M)
    text = re.sub(rf"^import (\w+_pb2)\b", rf"from {PY_PACKAGE} import \1", text, flags=re.M)
    return re.sub(rf"'{src}\.(\w+_pb2)'", rf"'{PY_PACKAGE}.\1'", text)


def generate(proto_root: Path = PROTO_ROOT) -> dict[str, str]:
    """Run protoc on every proto of the package; return {file name in the package: content}."""
    protos = sorted((proto_root / PROTO_PACKAGE).glob("*.proto"))
    if not protos:
        raise FileNotFoundError(f"no .proto files under {proto_root / PROTO_PACKAGE}")
    from grpc_tools import protoc

    well_known = str(files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        args = ["grpc_tools.protoc", f"-I{proto_root}", f"-I{well_known}",
                f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}",
                *(p.relative_to(proto_root).as_posix() for p in protos)]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {[p.name for p in protos]}")
        generated = sorted((Path(tmp) / PROTO_PACKAGE).iterdir())
        out = {p.name: _rewrite(p.read_text()) for p in generated if p.name.endswith(SUFFIXES)}
    out["__init__.py"] = INIT
    return out


def _existing(out_dir: Path) -> dict[str, str]:
    if not out_dir.is_dir():
        return {}
    return {p.name: p.read_text() for p in sorted(out_dir.iterdir()) if p.is_file()}


def diff(out_dir: Path = OUT_DIR, proto_root: Path = PROTO_ROOT) -> list[str]:
    """Files of `out_dir` that regeneration would change, add or remove ("changed: x", "missing: x", ...)."""
    want, have = generate(proto_root), _existing(out_dir)
    problems = [f"missing: {n}" for n in want if n not in have]
    problems += [f"changed: {n}" for n in want if n in have and have[n] != want[n]]
    problems += [f"unexpected: {n}" for n in have if n not in want]
    return sorted(problems, key=lambda s: s.split(": ", 1)[1])


def write(out_dir: Path = OUT_DIR, proto_root: Path = PROTO_ROOT) -> list[str]:
    """Regenerate `out_dir`; return the names of the files written or removed."""
    want, have = generate(proto_root), _existing(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    touched = []
    for name, text in want.items():
        if have.get(name) != text:
            (out_dir / name).write_text(text)
            touched.append(name)
    for name in have:
        if name not in want:
            (out_dir / name).unlink()
            touched.append(name)
    return sorted(touched)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ssd.proto_gen", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="generate into a temporary folder and fail if the package differs")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help=f"package folder (default {OUT_DIR})")
    parser.add_argument("--proto-root", type=Path, default=PROTO_ROOT,
                        help=f"folder holding {PROTO_PACKAGE}/*.proto (default {PROTO_ROOT})")
    args = parser.parse_args(argv)
    if args.check:
        problems = diff(args.out, args.proto_root)
        for line in problems:
            print(f"{args.out}: {line}", file=sys.stderr)
        if problems:
            print("stubs are stale or edited by hand: run `python -m ssd.proto_gen`", file=sys.stderr)
        return 1 if problems else 0
    for name in write(args.out, args.proto_root):
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
