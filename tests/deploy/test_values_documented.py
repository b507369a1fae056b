"""values.yaml documents every key, values.schema.json types every key, and the component blocks are alike."""
from __future__ import annotations

import json
import re

import yaml

from tests.deploy.render import CHART, ROOT

KEY = re.compile(r"^(\s*)([A-Za-z][\w.-]*):")


def _comment_above(lines: list[str], i: int) -> str:
    return next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")


def test_every_key_in_values_yaml_has_a_comment():
    """A key has a comment above it, or sits inside a documented default value ("# --" above an ancestor)."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    ancestors: list[tuple[int, int]] = []  # (indent, line index) of the enclosing keys
    undocumented = []
    for i, line in enumerate(lines):
        match = KEY.match(line)
        if not match:
            continue
        indent = len(match.group(1))
        ancestors = [(n, j) for n, j in ancestors if n < indent]
        in_documented_value = any(_comment_above(lines, j).startswith("# --") for _, j in ancestors)
        if not (_comment_above(lines, i).startswith("#") or in_documented_value):
            undocumented.append(f"{i + 1}: {line.strip()}")
        ancestors.append((indent, i))
    assert not undocumented, "keys without a comment in values.yaml:\n" + "\n".join(undocumented)


def _schema_keys(schema: dict, defs: dict, prefix="") -> set[str]:
    if "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[1]]
    keys = set()
    for name, sub in schema.get("properties", {}).items():
        keys.add(prefix + name)
        keys |= _schema_keys(sub, defs, prefix + name + ".")
    return keys


def _value_keys(values: dict, schema: dict, defs: dict, prefix="") -> set[str]:
    if "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[1]]
    keys = set()
    for name, value in values.items():
        keys.add(prefix + name)
        sub = schema.get("properties", {}).get(name, {})
        if isinstance(value, dict) and ("properties" in sub or "$ref" in sub):
            keys |= _value_keys(value, sub, defs, prefix + name + ".")
    return keys


def test_schema_and_values_have_the_same_keys():
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    defs = schema["$defs"]
    in_schema = _schema_keys(schema, defs) - {"global"}
    in_values = _value_keys(values, schema, defs)
    optional_probe_fields = {k for k in in_schema if k.rsplit(".", 1)[-1] in ("successThreshold", "initialDelaySeconds")}
    assert in_values == in_schema - optional_probe_fields


def test_every_schema_property_is_described():
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(node, path):
        for name, sub in node.get("properties", {}).items():
            assert "description" in sub or "$ref" in sub, f"{path}{name} has no description"
            walk(sub, f"{path}{name}.")
    walk(schema, "")
    for name, sub in schema["$defs"].items():
        walk(sub, f"$defs.{name}.")


def test_component_blocks_are_shaped_alike():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    shared = {"replicaCount", "image", "extraArgs", "extraEnv", "resources", "ports", "terminationGracePeriodSeconds",
              "podAnnotations", "podLabels", "nodeSelector", "tolerations", "affinity", "topologySpreadConstraints",
              "podDisruptionBudget"}
    services = shared | {"probes", "preStopSleepSeconds", "logLevel"}
    for component in ("router", "target", "draft"):
        assert services <= set(values[component]), component
    assert shared <= set(values["redis"])
    assert set(values["target"]) - {"tensorParallelSize"} == set(values["draft"]) - {"enabled", "k", "budget", "autoscaling"}


def test_prometheus_adapter_rule_serves_the_hpa_metric():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    adapter = yaml.safe_load((ROOT / "deploy" / "k8s" / "prometheus-adapter-values.yaml").read_text())
    (rule,) = adapter["rules"]["external"]
    assert rule["name"]["as"] == values["draft"]["autoscaling"]["lateEntryRatio"]["metricName"]
    metrics = (ROOT / "services" / "router" / "metrics.py").read_text()
    assert '"ssd_cache_lookups_total"' in metrics and '"late"' in metrics
    assert 'ssd_cache_lookups_total{result="late"' in rule["metricsQuery"]
    assert "<<.LabelMatchers>>" in rule["metricsQuery"]
