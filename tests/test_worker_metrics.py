"""A worker's prefix-cache and KV numbers: they move after two requests sharing a long prompt, in Describe's
WorkerInfo and on the Prometheus endpoint."""
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ssd.control import worker_info_pb
from ssd.engine.target import TargetWorker
from ssd.models.loader import load_model
from ssd.sampling import SamplingParams
from ssd.worker.metrics import kv_stats, serve_metrics
from ssd.worker.service import INFO_STATS

PROMPT = list(range(3, 43))   # 40 tokens: 10 full blocks of 4


@pytest.fixture
def worker(tiny_llama_dir):
    return TargetWorker(load_model(tiny_llama_dir), max_seqs=2, max_len=64, kv_tokens=128, block_size=4)


def scrape(port: int) -> dict:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, s.labels.get("role")): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_prefix_cache_counts_move_after_two_requests_sharing_a_prompt(worker):
    server = serve_metrics("127.0.0.1:0", "target", worker)
    try:
        before = scrape(server.server_port)
        assert before[("ssd_prefix_cache_queried_tokens_total", "target")] == 0
        assert before[("ssd_kv_capacity_tokens", "target")] == 128
        assert before[("ssd_kv_used_tokens", "target")] == 0
        worker.prefill([(1, PROMPT, SamplingParams())])
        worker.prefill([(2, PROMPT + [50, 51], SamplingParams())])
        after = scrape(server.server_port)
    finally:
        server.shutdown()
    assert after[("ssd_prefix_cache_queried_tokens_total", "target")] > 0
    assert after[("ssd_prefix_cache_hit_tokens_total", "target")] >= 36   # the second prompt's shared blocks
    assert after[("ssd_kv_preemptions_total", "target")] == 0
    assert after[("ssd_kv_used_tokens", "target")] > 0
    assert ("ssd_draft_confidence_stops_total", "target") not in after   # a draft's number


def test_describe_carries_the_prefix_cache_counts_and_preemptions(worker):
    worker.prefill([(1, PROMPT, SamplingParams())])
    worker.prefill([(2, PROMPT, SamplingParams())])
    stats = kv_stats(worker)
    msg = worker_info_pb({"role": "target", **{key: stats[key] for key in INFO_STATS}})
    assert msg.prefix_cache_hit_tokens == worker.prefix_stats.hit_tokens > 0
    assert msg.prefix_cache_queried_tokens == worker.prefix_stats.queried_tokens
    assert msg.preemptions == worker.preemptions == 0


def test_a_metrics_address_without_a_port_is_refused(worker):
    with pytest.raises(ValueError, match="host:port"):
        serve_metrics("localhost", "target", worker)


def test_a_draft_reports_its_evictions_as_preemptions(tiny_llama_dir):
    from ssd.engine.draft import DraftWorker

    draft = DraftWorker(load_model(tiny_llama_dir), max_seqs=2, max_len=64, k=2, fanout=[1, 1, 1], block_size=4)
    draft.evictions = 3
    stats = kv_stats(draft)
    assert stats["preemptions"] == 3
    assert stats["kv_capacity_tokens"] == draft.cache.capacity_tokens and stats["kv_used_tokens"] == 0


def test_a_draft_exports_its_confidence_stops(tiny_llama_dir):
    """`ssd_draft_confidence_stops_total` counts the chains `--min-confidence` stopped short (a target has none)."""
    from ssd.engine.draft import DraftParams, DraftWorker

    draft = DraftWorker(load_model(tiny_llama_dir), max_seqs=2, max_len=64, k=3, fanout=[1, 1, 1, 1], block_size=4,
                        min_confidence=0.999999)
    server = serve_metrics("127.0.0.1:0", "draft", draft)
    try:
        assert scrape(server.server_port)[("ssd_draft_confidence_stops_total", "draft")] == 0
        draft.add(0, PROMPT, DraftParams())
        assert len(draft.jit([0], 3)[0].tokens) == 1   # no second token of a tiny random model is that sure
        assert scrape(server.server_port)[("ssd_draft_confidence_stops_total", "draft")] == 1
    finally:
        server.shutdown()
