"""A worker's KV cache in numbers: for Describe and for its Prometheus endpoint (`--metrics-address`).

Read when asked (a scrape or a Describe), never pushed: the compute loop only bumps its own counters.
"""
from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger(__name__)


def kv_stats(worker) -> dict:
    """Prefix-cache lookups and hits (prompt tokens), preemptions, KV capacity and use (tokens) of a target or
    draft worker. A draft's preemptions are its evictions: committed KV dropped to make room."""
    stats, cache = worker.prefix_stats, worker.cache
    return {"prefix_cache_queried_tokens": stats.queried_tokens, "prefix_cache_hit_tokens": stats.hit_tokens,
            "preemptions": getattr(worker, "preemptions", getattr(worker, "evictions", 0)),
            "kv_capacity_tokens": cache.capacity_tokens,
            "kv_used_tokens": cache.capacity_tokens - cache.free_tokens}


class WorkerCollector:
    def __init__(self, role: str, worker):
        self.role, self.worker = role, worker

    def collect(self):
        s = kv_stats(self.worker)
        for name, key, doc in (
                ("ssd_prefix_cache_queried_tokens", "prefix_cache_queried_tokens",
                 "Prompt tokens looked up in the prefix cache."),
                ("ssd_prefix_cache_hit_tokens", "prefix_cache_hit_tokens",
                 "Prompt tokens whose KV came from the prefix cache."),
                ("ssd_kv_preemptions", "preemptions", "Sequences whose KV was dropped to make room.")):
            c = CounterMetricFamily(name, doc, labels=["role"])
            c.add_metric([self.role], s[key])
            yield c
        stops = getattr(self.worker, "confidence_stops", None)   # a draft's
        if stops is not None:
            c = CounterMetricFamily("ssd_draft_confidence_stops",
                                    "Draft chains stopped short of their depth by --min-confidence.", labels=["role"])
            c.add_metric([self.role], stops)
            yield c
        for name, key, doc in (("ssd_kv_capacity_tokens", "kv_capacity_tokens", "Tokens the KV cache holds."),
                               ("ssd_kv_used_tokens", "kv_used_tokens", "Tokens of KV cache in use.")):
            g = GaugeMetricFamily(name, doc, labels=["role"])
            g.add_metric([self.role], s[key])
            yield g


def serve_metrics(address: str, role: str, worker):
    """Serve /metrics on `address` ("host:port", port 0 picks one) from a thread; returns the HTTP server."""
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"--metrics-address must be host:port, got {address!r}")
    registry = CollectorRegistry()
    registry.register(WorkerCollector(role, worker))
    server, _ = start_http_server(int(port), addr=host or "0.0.0.0", registry=registry)
    log.info("metrics on http://%s:%d/metrics", host or "0.0.0.0", server.server_port)
    return server
