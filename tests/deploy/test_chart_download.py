"""models.download: init containers that run `ssd models download` into the models volume before the services start,
online only there, with HF_TOKEN from a Secret (one you name, or one the chart makes from models.download.token)."""
from __future__ import annotations

import base64
import json

import helm_python as helm
import pytest
import yaml

from ssd.cli import build_parser
from tests.deploy.render import CASES, FULLNAME, find, pod_spec, render_docs

DOWNLOAD = CASES["models-download"]
TOKEN = DOWNLOAD["models"]["download"]["token"]
KINDS = {"router": "Deployment", "target": "StatefulSet", "draft": "Deployment"}


def spec_of(docs, component):
    return pod_spec(find(docs, KINDS[component], f"{FULLNAME}-{component}"))


def env_of(container) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


@pytest.fixture(scope="module")
def docs(chart):
    return render_docs(chart, DOWNLOAD)


def test_without_the_option_nothing_changes(chart):
    """Off (the default), repos and a token change no object: no init container, no Secret, no token."""
    plain = render_docs(chart, {})
    off = {"models": {"download": {"enabled": False, "token": TOKEN, "repos": DOWNLOAD["models"]["download"]["repos"]}}}
    assert render_docs(chart, off) == plain
    for component in KINDS:
        assert "initContainers" not in spec_of(plain, component)
    assert not any(d["kind"] == "Secret" for d in plain)
    assert "HF_TOKEN" not in json.dumps(plain) and "HF_HUB_OFFLINE" not in json.dumps(plain)


@pytest.mark.parametrize("component, expected", [
    ("target", [("download-models-0", "Qwen/Qwen3-32B", "qwen3-32b", None)]),
    ("router", [("download-models-0", "Qwen/Qwen3-32B", "qwen3-32b", None)]),  # the router reads the target's tokenizer
    ("draft", [("download-models-1", "Qwen/Qwen3-0.6B", "drafter", "0123456")]),
])
def test_each_pod_downloads_the_repos_of_its_role(docs, component, expected):
    spec = spec_of(docs, component)
    (main,) = spec["containers"]
    inits = spec["initContainers"]
    assert [c["name"] for c in inits] == [name for name, *_ in expected]
    for init, (_, repo, folder, revision) in zip(inits, expected):
        args = ["models", "download", repo, "--models-dir=/models", f"--name={folder}"]
        assert init["args"] == args + ([f"--revision={revision}"] if revision else [])
        assert "command" not in init and init["image"] == main["image"] == "ssd:0.1.0"  # the entrypoint is ssd
        ns = build_parser().parse_args(init["args"])
        assert (ns.repo, str(ns.models_dir), ns.name, ns.revision) == (repo, "/models", folder, revision)
        env = env_of(init)
        assert env["HF_HUB_OFFLINE"]["value"] == "0" and env["TRANSFORMERS_OFFLINE"]["value"] == "0"
        assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": f"{FULLNAME}-hf-token", "key": "HF_TOKEN"}}
        assert env["SSD_MODELS_DIR"]["value"] == "/models"
        assert init["volumeMounts"] == main["volumeMounts"]
        assert init["securityContext"]["readOnlyRootFilesystem"] is True
    # Only the init containers are online or see the token; the services stay offline (the image's default).
    assert not {"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN"} & set(env_of(main))
    # The folder it downloads is the one the service loads.
    model_arg = next(a for a in main["args"] if a.startswith("--model="))
    assert model_arg == f"--model=/models/{expected[0][2]}"


def test_the_claim_is_writable_while_downloading(docs):
    for component in KINDS:
        (volume,) = [v for v in spec_of(docs, component)["volumes"] if v["name"] == "models"]
        assert volume["persistentVolumeClaim"] == {"claimName": "ssd-models", "readOnly": False}


def test_the_token_is_only_in_the_charts_secret(docs):
    secret = find(docs, "Secret", f"{FULLNAME}-hf-token")
    assert secret["type"] == "Opaque" and "stringData" not in secret
    assert base64.b64decode(secret["data"]["HF_TOKEN"]).decode() == TOKEN
    others = [d for d in docs if d is not secret]
    rendered = yaml.safe_dump_all(others)
    assert TOKEN not in rendered and secret["data"]["HF_TOKEN"] not in rendered


def test_an_existing_secret_is_used_and_none_created(chart):
    values = {"target": {"model": "qwen3-32b"},
              "models": {"download": {"enabled": True, "tokenSecret": {"name": "hub", "key": "token"},
                                      "repos": [{"repo": "Qwen/Qwen3-32B", "role": "target"}]}}}
    docs = render_docs(chart, values)
    assert not any(d["kind"] == "Secret" for d in docs)
    (init,) = spec_of(docs, "target")["initContainers"]
    assert env_of(init)["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hub", "key": "token"}}
    assert "initContainers" not in spec_of(docs, "draft")


def test_public_repos_need_no_token_and_the_image_and_env_can_be_set(chart):
    values = {"draft": {"model": "qwen3-0.6b"}, "models": {"prepare": {"enabled": True}, "download": {
        "enabled": True, "repos": [{"repo": "Qwen/Qwen3-0.6B", "role": "draft"}],
        "image": {"repository": "registry.example.com/ssd", "tag": "0.1.0-cuda", "pullPolicy": "Always"},
        "extraEnv": [{"name": "HF_ENDPOINT", "value": "http://hub-mirror.internal"}],
        "resources": {"limits": {"memory": "1Gi"}}}}}
    docs = render_docs(chart, values)
    assert not any(d["kind"] == "Secret" for d in docs)
    prepare, download = spec_of(docs, "draft")["initContainers"]
    assert prepare["name"] == "prepare-models" and prepare["image"] == "ssd:0.1.0"  # prepare first, as before
    assert download["image"] == "registry.example.com/ssd:0.1.0-cuda" and download["imagePullPolicy"] == "Always"
    env = env_of(download)
    assert "HF_TOKEN" not in env and env["HF_ENDPOINT"]["value"] == "http://hub-mirror.internal"
    assert download["resources"] == {"limits": {"memory": "1Gi"}}
    assert download["args"][-1] == "--name=qwen3-0.6b"  # the repo's last part, lowercased
    assert [c["name"] for c in spec_of(docs, "target")["initContainers"]] == ["prepare-models"]


@pytest.mark.parametrize("download, message", [
    ({"enabled": True}, "models.download.enabled needs models.download.repos"),
    ({"enabled": True, "token": "t", "tokenSecret": {"name": "hub"},
      "repos": [{"repo": "Qwen/Qwen3-32B", "role": "target"}]},
     "set models.download.tokenSecret.name (a Secret you manage) or models.download.token"),
    ({"enabled": True, "repos": [{"repo": "Qwen/Qwen3-0.6B", "role": "draft"}]},
     "models.download.repos fetches Qwen/Qwen3-0.6B into /models/qwen3-0.6b for the draft, but draft.model is empty"),
])
def test_download_settings_that_cannot_work_fail_clearly(chart, download, message):
    values = {"target": {"model": "qwen3-32b"}, "models": {"download": download}}
    with pytest.raises(helm.HelmRenderError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        render_docs(chart, values)


@pytest.mark.parametrize("repo, where", [
    ({"repo": "Qwen/Qwen3-0.6B", "role": "router"}, "/models/download/repos/0/role"),
    ({"repo": "Qwen/Qwen3-0.6B"}, "role"),
    ({"repo": "Qwen/Qwen3-0.6B", "role": "draft", "name": "../etc"}, "/models/download/repos/0/name"),
    ({"repo": "a/b/c", "role": "draft"}, "/models/download/repos/0/repo"),
])
def test_schema_rejects_wrong_repos(chart, repo, where):
    with pytest.raises(helm.HelmValuesError, match=where):
        chart.validate_schema({"models": {"download": {"enabled": True, "repos": [repo]}}})
