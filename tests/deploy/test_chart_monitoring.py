"""Monitoring objects of the chart (prometheus-operator CRs and the Grafana dashboard), all off by default.

kubernetes-validate has no schemas for CRDs, so their shape is checked here: apiVersion and kind, selectors that
match the pods (or Service) they scrape, port names those pods really have, and PromQL that names only metrics the
router (services/router/metrics.py) and the workers (ssd/worker/metrics.py) define.
"""
from __future__ import annotations

import json
import re

import helm_python as helm
import pytest

from tests.deploy.promql import defined_metrics, metric_names
from tests.deploy.render import CASES, CHART, FULLNAME, NAMESPACE, find, pod_spec, render_docs

MONITORING = CASES["monitoring"]
CR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
BUILTIN_SERIES = {"up"}  # added by Prometheus to every scrape target
METRICS_FILES = "services/router/metrics.py or ssd/worker/metrics.py"
WORKLOADS = {"router": "Deployment", "target": "StatefulSet", "draft": "Deployment"}


@pytest.fixture(scope="module")
def docs(chart):
    return render_docs(chart, MONITORING)


@pytest.fixture(scope="module")
def known():
    return set(defined_metrics())


def workload(docs, component):
    return find(docs, WORKLOADS[component], f"{FULLNAME}-{component}")


def selected_pods(docs, selector: dict) -> list[str]:
    """The workloads whose pod template labels the selector's matchLabels select."""
    return [d["metadata"]["name"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")
            and selector["matchLabels"].items() <= d["spec"]["template"]["metadata"]["labels"].items()]


def sanitized(label: str) -> str:
    """The Prometheus label prometheus-operator makes of a Kubernetes label (podTargetLabels)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", label)


def test_defined_metrics_are_read_with_their_kinds(known):
    series = defined_metrics()
    assert series["ssd_requests_total"] == "counter" and series["ssd_kv_used_tokens"] == "gauge"
    assert series["ssd_time_to_first_token_seconds_bucket"] == "histogram"
    assert "ssd_prefix_cache_hit_tokens_total" in known  # a worker collector's counter, exposed with _total
    assert "ssd_kv_used_tokens_total" not in known and "ssd_time_to_first_token_seconds" not in known


def test_metric_names_finds_metrics_and_skips_the_rest():
    expr = ('histogram_quantile(0.95, sum by (le) (rate(ssd_made_up_bucket{job="x",le!="1"}[$__rate_interval])))'
            ' / clamp_min(sum(rate(other_total[5m] offset 1h)) by (pod), 1e-9) > 0.5 or absent(up{a=~"$b"})')
    assert metric_names(expr) == {"ssd_made_up_bucket", "other_total", "up"}


def test_monitoring_is_off_by_default(chart):
    docs = render_docs(chart, {})
    assert not [d for d in docs if d["kind"] in CR_KINDS or d["apiVersion"].startswith("monitoring.coreos.com/")]
    assert not [d for d in docs if "grafana_dashboard" in d["metadata"]["labels"]]


@pytest.mark.parametrize("component", ["target", "draft"])
def test_pod_monitor_scrapes_the_workers_metrics_port(docs, component):
    monitor = find(docs, "PodMonitor", f"{FULLNAME}-{component}")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    spec = monitor["spec"]
    assert selected_pods(docs, spec["selector"]) == [f"{FULLNAME}-{component}"]
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (container,) = pod_spec(workload(docs, component))["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for endpoint in spec["podMetricsEndpoints"]:
        assert endpoint["port"] in ports
        assert f"--metrics-address=0.0.0.0:{ports[endpoint['port']]}" in container["args"]
        assert endpoint["path"] == "/metrics" and endpoint["interval"] == "30s"
    pod_labels = workload(docs, component)["spec"]["template"]["metadata"]["labels"]
    assert set(spec["podTargetLabels"]) <= set(pod_labels)


def test_router_service_monitor_scrapes_the_http_port(docs):
    monitor = find(docs, "ServiceMonitor", f"{FULLNAME}-router")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    spec = monitor["spec"]
    service = find(docs, "Service", f"{FULLNAME}-router")
    assert spec["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = spec["endpoints"]
    service_port = next(p for p in service["spec"]["ports"] if p["name"] == endpoint["port"])
    (container,) = pod_spec(workload(docs, "router"))["containers"]
    assert service_port["targetPort"] in {p["name"] for p in container["ports"]}
    assert endpoint["path"] == "/metrics"  # the router's HTTP port serves GET /metrics
    pod_labels = workload(docs, "router")["spec"]["template"]["metadata"]["labels"]
    assert set(spec["podTargetLabels"]) <= set(pod_labels)


def test_pod_monitors_need_the_workers_metrics_ports(chart):
    with pytest.raises(helm.HelmRenderError, match=r"monitoring\.podMonitor\.enabled .* set target\.ports\.metrics"):
        render_docs(chart, {"monitoring": {"podMonitor": {"enabled": True}}})
    with pytest.raises(helm.HelmRenderError, match=r"set draft\.ports\.metrics"):
        render_docs(chart, {"monitoring": {"podMonitor": {"enabled": True}}, "target": {"ports": {"metrics": 9400}}})
    docs = render_docs(chart, {"monitoring": {"podMonitor": {"enabled": True}}, "target": {"ports": {"metrics": 9400}},
                               "draft": {"enabled": False}, "router": {"mode": "ar"}})
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "PodMonitor"] == [f"{FULLNAME}-target"]


# The dashboard ---------------------------------------------------------------------------------------------------

def dashboard_targets(dashboard: dict) -> list[tuple[str, str]]:
    out = []
    for panel in dashboard["panels"]:
        out += [(panel["title"], t["expr"]) for t in panel.get("targets", [])]
        for inner in panel.get("panels", []):
            out += [(inner["title"], t["expr"]) for t in inner.get("targets", [])]
    return out


def test_dashboard_configmap_ships_the_json_file(docs):
    configmap = find(docs, "ConfigMap", f"{FULLNAME}-dashboard")
    labels = configmap["metadata"]["labels"]
    assert labels["grafana_dashboard"] == "1" and labels["team"] == "ml"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "ssd"}
    (key,) = configmap["data"]
    assert key.endswith(".json")
    assert json.loads(configmap["data"][key]) == json.loads((CHART / "dashboards" / "ssd.json").read_text())


def test_dashboard_uses_only_defined_metrics(known):
    dashboard = json.loads((CHART / "dashboards" / "ssd.json").read_text())
    targets = dashboard_targets(dashboard)
    assert len(targets) >= 12
    for title, expr in targets:
        names = metric_names(expr)
        assert names, f"{title}: no metric in {expr}"
        assert names <= known, f"{title}: {sorted(names - known)} are not defined in {METRICS_FILES}"


# What each panel the dashboard promises must chart (a metric its expressions use).
PANELS = {
    "request rate by outcome": "ssd_requests_total",
    "TTFT percentiles": "ssd_time_to_first_token_seconds_bucket",
    "end-to-end latency percentiles": "ssd_e2e_request_latency_seconds_bucket",
    "tokens/s": "ssd_generation_tokens_total",
    "acceptance per position": "ssd_spec_accepted_tokens_total",
    "speculation cache hit/late ratio": "ssd_cache_lookups_total",
    "rounds run from the cache after a wait": "ssd_cache_waits_total",
    "active requests": "ssd_requests_running",
    "queued requests": "ssd_requests_queued",
    "drafts alive": "ssd_drafts_alive",
    "KV used": "ssd_kv_used_tokens",
    "KV capacity": "ssd_kv_capacity_tokens",
    "prefix-cache hit rate": "ssd_prefix_cache_hit_tokens_total",
}


def test_dashboard_has_the_panels_it_promises():
    dashboard = json.loads((CHART / "dashboards" / "ssd.json").read_text())
    exprs = [e for _, e in dashboard_targets(dashboard)]
    used = set().union(*(metric_names(e) for e in exprs))
    missing = {what: name for what, name in PANELS.items() if name not in used}
    assert not missing
    assert any("histogram_quantile" in e and "ssd_time_to_first_token_seconds_bucket" in e for e in exprs)
    assert any('result="late"' in e for e in exprs) and any('result="hit"' in e for e in exprs)
    assert any("by (outcome)" in e for e in exprs) and any("by (position)" in e for e in exprs)
    assert sum("by (role)" in e for e in exprs) >= 2


def test_dashboard_variables_are_defined_and_match_the_scraped_labels(docs):
    dashboard = json.loads((CHART / "dashboards" / "ssd.json").read_text())
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    text = json.dumps(dashboard["panels"])
    used = set(re.findall(r"\$\{?([A-Za-z_]\w*)", text)) - {"__rate_interval", "__interval"}
    assert used <= defined, used - defined
    # The release selector is a label the monitors put on every series (podTargetLabels).
    for kind, name in (("ServiceMonitor", "router"), ("PodMonitor", "target"), ("PodMonitor", "draft")):
        labels = {sanitized(label) for label in find(docs, kind, f"{FULLNAME}-{name}")["spec"]["podTargetLabels"]}
        assert "app_kubernetes_io_instance" in labels
    assert all('app_kubernetes_io_instance=~"$release"' in e for _, e in dashboard_targets(dashboard))


# The alerts ------------------------------------------------------------------------------------------------------

def alert_rules(docs) -> dict[str, dict]:
    rule = find(docs, "PrometheusRule", f"{FULLNAME}-rules")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


ALERTS = {"SSDRouterDown", "SSDNoDraftAlive", "SSDLateCacheLookupsHigh", "SSDTimeToFirstTokenHigh",
          "SSDErrorRatioHigh"}


def test_alerts_name_only_defined_metrics_and_say_what_they_are(docs, known):
    rules = alert_rules(docs)
    assert set(rules) == ALERTS
    assert find(docs, "PrometheusRule", f"{FULLNAME}-rules")["metadata"]["labels"]["release"] == "kube-prometheus"
    for name, rule in rules.items():
        names = metric_names(rule["expr"])
        assert names and names <= known | BUILTIN_SERIES, f"{name}: {sorted(names - known - BUILTIN_SERIES)}"
        assert re.fullmatch(r"[0-9]+[smh]", rule["for"]), name
        assert rule["labels"]["severity"] in ("warning", "critical") and rule["labels"]["team"] == "ml", name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
    assert rules["SSDLateCacheLookupsHigh"]["for"] == "10m"
    assert "absent(up{" in rules["SSDRouterDown"]["expr"] and "== 0" in rules["SSDRouterDown"]["expr"]
    assert "histogram_quantile(0.95" in rules["SSDTimeToFirstTokenHigh"]["expr"]
    assert 'outcome="error"' in rules["SSDErrorRatioHigh"]["expr"]


def test_alerts_select_the_router_the_service_monitor_scrapes(docs):
    """The default selector is the job label the router ServiceMonitor's scrape gives (the Service's name)."""
    service = find(docs, "ServiceMonitor", f"{FULLNAME}-router")["spec"]["selector"]["matchLabels"]
    assert find(docs, "Service", f"{FULLNAME}-router")["metadata"]["labels"].items() >= service.items()
    selector = f'job="{FULLNAME}-router",namespace="{NAMESPACE}"'
    for name, rule in alert_rules(docs).items():
        assert selector in rule["expr"], name


def test_alert_thresholds_come_from_values(chart):
    values = {"monitoring": {"rules": {"enabled": True, "lateEntryRatio": 0.4, "ttftP95Seconds": 2.5,
                                       "errorRatio": 0.01, "routerSelector": 'service="llm"'}}}
    rules = alert_rules(render_docs(chart, values))
    assert rules["SSDLateCacheLookupsHigh"]["expr"].rstrip().endswith("> 0.4")
    assert rules["SSDTimeToFirstTokenHigh"]["expr"].rstrip().endswith("> 2.5")
    assert rules["SSDErrorRatioHigh"]["expr"].rstrip().endswith("> 0.01")
    assert all('{service="llm"}' in r["expr"] or 'service="llm"}' in r["expr"] for r in rules.values())
    assert all("job=" not in r["expr"] for r in rules.values())


def test_no_draft_alert_only_when_the_router_speculates(chart):
    for mode in ("sd", "ssd"):
        assert "SSDNoDraftAlive" in alert_rules(render_docs(chart, {"router": {"mode": mode},
                                                                     "monitoring": {"rules": {"enabled": True}}}))
    rules = alert_rules(render_docs(chart, {"router": {"mode": "ar"}, "draft": {"enabled": False},
                                            "monitoring": {"rules": {"enabled": True}}}))
    assert set(rules) == ALERTS - {"SSDNoDraftAlive"}


@pytest.mark.parametrize("values, where", [
    ({"monitoring": {"rules": {"errorRatio": "high"}}}, "/monitoring/rules/errorRatio"),
    ({"monitoring": {"rules": {"lateEntryRatio": 2}}}, "/monitoring/rules/lateEntryRatio"),
    ({"monitoring": {"podMonitor": {"interval": "often"}}}, "/monitoring/podMonitor/interval"),
    ({"monitoring": {"dashboard": {"enable": True}}}, "enable"),
])
def test_schema_rejects_wrong_monitoring_values(chart, values, where):
    with pytest.raises(helm.HelmValuesError, match=where):
        chart.validate_schema(values)
