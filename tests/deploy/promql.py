"""The metric names PromQL in the chart may use, read as text from the modules that define them, and the metric
names a PromQL expression uses (a small lexer: enough for the chart's dashboard and alert expressions)."""
from __future__ import annotations

import re

from tests.deploy.render import ROOT

METRIC_MODULES = (ROOT / "services" / "router" / "metrics.py", ROOT / "ssd" / "worker" / "metrics.py")

# The series prometheus_client exposes for a metric of each kind (counters drop then re-add `_total`).
_SERIES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count", "_created"),
           "summary": ("", "_sum", "_count", "_created")}
_CONSTRUCTOR = re.compile(r"\b(Counter|Gauge|Histogram|Summary)\(\s*$")
_FAMILY = re.compile(r"\b(Counter|Gauge|Histogram|Summary)MetricFamily\(")


def defined_metrics() -> dict[str, str]:
    """{exposed series name: kind} of every `ssd_*` metric the router and the workers define: a quoted name right
    after a `Counter(`/`Gauge(`/`Histogram(` call, or a quoted name whose values a following `...MetricFamily(`
    yields (the worker's collector)."""
    out: dict[str, str] = {}
    for path in METRIC_MODULES:
        text = path.read_text()
        for m in re.finditer(r'"(ssd_[a-z0-9_]+)"', text):
            ctor = _CONSTRUCTOR.search(text[:m.start()])
            family = None if ctor else _FAMILY.search(text, m.end())
            if not (ctor or family):
                continue
            kind = (ctor or family).group(1).lower()
            base = m.group(1).removesuffix("_total") if kind == "counter" else m.group(1)
            for suffix in _SERIES[kind]:
                out[base + suffix] = kind
    return out


_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or", "unless",
             "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, aggregations, keywords, label
    names (in `{...}`, `by (...)` and the like), strings, durations or numbers."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    e = re.sub(r"\{[^{}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", e)
    names = set()
    for m in re.finditer(r"(?<![\w.:$])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?", e):
        if m.group(2) or m.group(1).lower() in _KEYWORDS:
            continue
        names.add(m.group(1))
    return names
