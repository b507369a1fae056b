"""Rendering the Helm chart offline with helm-python-sdk (Helm's Go engine in a wheel; no helm binary, no cluster)."""
from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "k8s" / "ssd"
RELEASE, NAMESPACE = "demo", "serving"
FULLNAME = "demo-ssd"


def values_file(name: str) -> dict:
    return yaml.safe_load((CHART / name).read_text()) or {}


def render_docs(chart, values: dict | None = None, name: str = RELEASE) -> list[dict]:
    """Every Kubernetes object the chart renders (NOTES.txt and empty templates left out)."""
    files = chart.render(values or {}, name=name, namespace=NAMESPACE, is_install=True)
    docs = []
    for path, text in sorted(files.items()):
        if not path.endswith(".yaml"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc.setdefault("__template__", path)
                docs.append(doc)
    return docs


def strip(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k != "__template__"}


def find(docs: list[dict], kind: str, name: str) -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: found {len(found)} in {[(d['kind'], d['metadata']['name']) for d in docs]}"
    return found[0]


def kinds(docs: list[dict]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def pod_spec(doc: dict) -> dict:
    return doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]


# The example values files and the edge cases CI renders, validates and asserts on.
CASES = {
    "defaults": {},
    "cpu-local": values_file("values-cpu-local.yaml"),
    "gpu": values_file("values-gpu.yaml"),
    "drafts-disabled": {"draft": {"enabled": False}, "router": {"mode": "ar"}},
    "redis-external": {"redis": {"externalUrl": "redis://redis.shared.svc:6379/2"}},
    "autoscaling-off": {"draft": {"autoscaling": {"enabled": False}, "replicaCount": 3}},
    "router-replicas-3": {"router": {"replicaCount": 3}, "redis": {"enabled": True}},
    "everything-on": {
        "router": {"apiKeys": {"enabled": True, "keys": ["k1", "k2"]},
                   "ingress": {"enabled": True, "className": "nginx",
                               "hosts": [{"host": "ssd.example.com", "paths": [{"path": "/", "pathType": "Prefix"}]}],
                               "tls": [{"secretName": "ssd-tls", "hosts": ["ssd.example.com"]}]}},
        "metrics": {"serviceMonitor": {"enabled": True}},
        "networkPolicy": {"clients": [{"namespaceSelector": {"matchLabels": {"name": "ingress-nginx"}}}]},
        "models": {"volume": {"type": "hostPath", "hostPath": "/srv/models"}, "prepare": {"enabled": True}},
        "dataPlane": {"curve": {"enabled": True, "existingSecret": "ssd-curve"}},
        "redis": {"enabled": True, "persistence": {"existingClaim": "ssd-redis-data"}}},
    "redis-discovery": {"router": {"discovery": "redis"}, "redis": {"enabled": True}},
    "monitoring": {
        "target": {"ports": {"metrics": 9400}}, "draft": {"ports": {"metrics": 9401}},
        "metrics": {"serviceMonitor": {"enabled": True}},
        "monitoring": {"podMonitor": {"enabled": True, "interval": "30s", "labels": {"release": "kube-prometheus"}},
                       "dashboard": {"enabled": True, "labels": {"team": "ml"}, "annotations": {"grafana_folder": "ssd"}},
                       "rules": {"enabled": True, "labels": {"release": "kube-prometheus"},
                                 "alertLabels": {"team": "ml"}}}},
    "models-download": {
        "target": {"model": "qwen3-32b"}, "draft": {"model": "drafter"},
        "models": {"volume": {"type": "persistentVolumeClaim", "claimName": "ssd-models", "readOnly": True},
                   "download": {"enabled": True, "token": "hf_test_token_value",
                                "repos": [{"repo": "Qwen/Qwen3-32B", "role": "target"},
                                          {"repo": "Qwen/Qwen3-0.6B", "role": "draft", "name": "drafter",
                                           "revision": "0123456"}]}}},
}
