"""The slim client (clients/python: the `ssd-client` distribution): it packages the SDK's whole import closure and
nothing that reaches torch, transformers, kubernetes or redis (read from the import graph), declares the root
project's grpcio and protobuf ranges, and, built into a fresh virtual environment (no system site-packages),
imports and generates there from the real router while `import torch` fails."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ssd.cli.launcher import free_port
from ssd.client import Client
from tests.test_import_graph import PACKAGES, graph, imports_of, modules

ROOT = Path(__file__).resolve().parents[2]
CLIENT_DIR = ROOT / "clients" / "python"
BANNED = ("torch", "transformers", "kubernetes", "redis")
ALLOWED_THIRD_PARTY = {"grpc": "grpcio", "google": "protobuf"}   # import name -> the distribution providing it


def client_project() -> dict:
    return tomllib.loads((CLIENT_DIR / "pyproject.toml").read_text())


def packaged() -> set[str]:
    """Our modules the slim distribution installs: every module of each package it lists (not subpackages)."""
    pkgs = client_project()["tool"]["setuptools"]["packages"]
    return {m for m in modules() for p in pkgs if m == p or (m.startswith(p + ".") and m.rpartition(".")[0] == p)}


def sdk_closure() -> set[str]:
    """ssd.client's modules and every module of ours they import, transitively."""
    seen = {m for m in modules() if m == "ssd.client" or m.startswith("ssd.client.")}
    frontier = list(seen)
    while frontier:
        nxt = [w for v in frontier for w in graph()[v] if w not in seen]
        seen.update(nxt)
        frontier = nxt
    return seen


def test_the_distribution_holds_the_sdks_closure_and_nothing_else_of_ours():
    closure, shipped = sdk_closure(), packaged()
    assert "ssd.client.sync" in closure and "ssd.pb.generation_pb2" in closure
    missing = sorted(closure - shipped)
    assert not missing, f"the SDK imports modules clients/python/pyproject.toml does not package: {missing}"
    extra = sorted(m for m in shipped if not (m.startswith("ssd.client") or m.startswith("ssd.pb")))
    assert not extra, extra
    # `ssd` is a namespace package there (its __init__ is not shipped): nothing may import from it directly
    assert "ssd" not in closure


def test_the_distribution_imports_only_the_stdlib_grpc_and_protobuf():
    bad = []
    for name in sorted(packaged()):
        for imported in imports_of(name):
            top = imported.split(".")[0]
            if top in PACKAGES or top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY:
                continue
            bad.append(f"{name} imports {imported}")
    assert not bad, "the slim client may import only grpc and protobuf:\n" + "\n".join(bad)
    reached = {i.split(".")[0] for n in packaged() for i in imports_of(n)}
    assert not reached & set(BANNED), reached & set(BANNED)


def test_the_distribution_declares_the_root_projects_ranges():
    from packaging.requirements import Requirement

    root = {Requirement(s).name: Requirement(s) for s in
            tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    deps = [Requirement(s) for s in client_project()["project"]["dependencies"]]
    assert sorted(d.name for d in deps) == sorted(ALLOWED_THIRD_PARTY.values())
    for d in deps:
        assert d.specifier == root[d.name].specifier, f"{d.name}: {d.specifier} here, {root[d.name].specifier} in ssd"


VENV_SCRIPT = """
import asyncio, json, sys
args = json.loads(sys.argv[1])
out = {"prefix": sys.prefix}
for name in args["banned"]:
    try:
        __import__(name)
        out[name] = "importable"
    except ModuleNotFoundError:
        out[name] = "missing"
import ssd.client
from ssd.client import AsyncClient, Client, Result, UnavailableError
out["sdk_file"] = ssd.client.__file__
out["banned_loaded"] = sorted(m for m in sys.modules if m.split(".")[0] in args["banned"])
with Client(args["closed"], timeout=10, max_retries=0) as c:
    try:
        c.model_info()
        out["closed_port"] = "answered"
    except UnavailableError as e:
        out["closed_port"] = e.code
with Client(args["address"], timeout=120) as c:
    r = c.generate(args["prompt"], max_tokens=8, ignore_eos=True)
    out["sync_tokens"] = list(r.token_ids)
    out["streamed"] = [list(i.token_ids) for i in c.stream(args["prompt"], max_tokens=8, ignore_eos=True)
                       if not isinstance(i, Result)]

async def main():
    async with AsyncClient(args["address"], timeout=120) as c:
        return list((await c.generate(args["prompt"], max_tokens=8, ignore_eos=True)).token_ids)
out["async_tokens"] = asyncio.run(main())
print(json.dumps(out))
"""


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_built_into_a_fresh_venv_it_generates_without_torch(stack, tmp_path):
    # the wheel, built as `pip wheel ./clients/python` builds it, its build folders under tmp_path (not the checkout)
    cfg = tmp_path / "build.cfg"
    cfg.write_text(f"[build]\nbuild_base = {tmp_path / 'build'}\n[egg_info]\negg_base = {tmp_path}\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w",
          str(tmp_path / "dist"), str(CLIENT_DIR)], env={**env, "DIST_EXTRA_CONFIG": str(cfg)})
    wheel, = (tmp_path / "dist").glob("ssd_client-*.whl")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], env=env)
    py = venv / "bin" / "python"
    # its dependencies resolved from its own metadata, at the versions this environment runs
    pins = tmp_path / "pins.txt"
    pins.write_text("".join(f"{d}=={importlib.metadata.version(d)}\n" for d in ALLOWED_THIRD_PARTY.values()))
    _run([str(py), "-m", "pip", "install", "--quiet", str(wheel), "-c", str(pins)], env=env, cwd=tmp_path)

    prompt = "Name three colours of the rainbow."
    with Client(stack.grpc_address, timeout=120) as c:
        reference = list(c.generate(prompt, max_tokens=8, ignore_eos=True).token_ids)
    script = tmp_path / "use_sdk.py"
    script.write_text(VENV_SCRIPT)
    args = {"banned": BANNED, "closed": f"127.0.0.1:{free_port()}", "address": stack.grpc_address, "prompt": prompt}
    out = json.loads(_run([str(py), str(script), json.dumps(args)], env=env, cwd=tmp_path).stdout)

    assert Path(out["prefix"]) == venv
    assert Path(out["sdk_file"]).is_relative_to(venv), out["sdk_file"]   # the installed copy, not the checkout
    assert all(out[name] == "missing" for name in BANNED), out
    assert out["banned_loaded"] == []
    assert out["closed_port"] == "UNAVAILABLE"
    assert out["sync_tokens"] == reference and out["async_tokens"] == reference
    assert [t for piece in out["streamed"] for t in piece] == reference
    listed = {d.metadata["Name"] for d in importlib.metadata.distributions(path=[str(p) for p in
              (venv / "lib").glob("python*/site-packages")])}
    assert not listed & set(BANNED), listed


@pytest.mark.parametrize("name", BANNED)
def test_the_banned_names_are_real_distributions_here(name):
    """The fresh-venv check means something: each banned package is importable in the full environment."""
    assert importlib.util.find_spec(name) is not None
