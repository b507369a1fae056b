"""Workers' Prometheus endpoint in the chart: off by default; `ports.metrics` renders --metrics-address, a
container port and a NetworkPolicy rule for the scrapers, and the rendered command lines parse."""
from __future__ import annotations

from services.draft.service import DraftConfig
from services.target.service import TargetConfig
from ssd.service_config import load_config
from tests.deploy.render import FULLNAME, find, pod_spec, render_docs

CLIENTS = [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]


def worker(docs, role):
    return next(d for d in docs if d["metadata"]["name"] == f"{FULLNAME}-{role}" and d["kind"] in
                ("Deployment", "StatefulSet"))


def test_metrics_are_off_by_default(chart):
    docs = render_docs(chart)
    for role in ("target", "draft"):
        container = pod_spec(worker(docs, role))["containers"][0]
        assert not any(a.startswith("--metrics-address") for a in container["args"])
        assert "metrics" not in {p["name"] for p in container["ports"]}


def test_metrics_port_renders_the_flag_the_port_and_a_scrape_rule(chart):
    docs = render_docs(chart, {"target": {"ports": {"metrics": 9101}}, "draft": {"ports": {"metrics": 9102}},
                               "networkPolicy": {"clients": CLIENTS}})
    for role, port, cfg in (("target", 9101, TargetConfig), ("draft", 9102, DraftConfig)):
        container = pod_spec(worker(docs, role))["containers"][0]
        args = [a for a in container["args"][1:] if a.split("=")[0] in ("--metrics-address", "--max-seqs")]
        assert load_config(cfg, args, role, env={}).metrics_address == f"0.0.0.0:{port}"
        assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in container["ports"]
        router_rule, scrape_rule = find(docs, "NetworkPolicy", f"{FULLNAME}-{role}")["spec"]["ingress"]
        assert port not in {p["port"] for p in router_rule["ports"]}
        assert scrape_rule == {"ports": [{"port": port, "protocol": "TCP"}], "from": CLIENTS}
