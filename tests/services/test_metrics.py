"""RouterMetrics: what /metrics shows equals the workload fed to the hooks, per instance, without torch."""
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.router.metrics import RouterMetrics
from ssd.params import FinishReason
from ssd.spec.backup import BackupPolicy

REPO = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"   # the request-level series carry the served model's name


def samples(metrics: RouterMetrics) -> dict[tuple[str, tuple], float]:
    """Every sample of `render()`, keyed by (sample name, sorted label items)."""
    body, _ = metrics.render()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples}


def value(snap, name, **labels):
    return snap[(name, tuple(sorted(labels.items())))]


def run_workload(m: RouterMetrics) -> None:
    """3 requests, 8 streamed tokens, 5 rounds (K=4), 6 lookups, 3 backups. Times are exact binary fractions."""
    m.request_started("ssd")
    m.request_started("ssd")
    m.request_started("ar")
    m.request_finished("ssd", "length", prompt_tokens=10, completion_tokens=32, ttft_s=0.25, e2e_s=2.0, queue_s=0.125)
    m.request_finished("ssd", "length", prompt_tokens=6, completion_tokens=16, ttft_s=0.5, e2e_s=1.0, queue_s=0.0)
    m.request_finished("ar", "abort", prompt_tokens=4, completion_tokens=0, ttft_s=None, e2e_s=0.125)
    m.tokens_emitted(3, 0.75)   # 3 x 0.25
    m.tokens_emitted(1, 0.5)    # 1 x 0.5
    m.tokens_emitted(4, 0.5)    # 4 x 0.125
    for proposed, accepted, committed in [(4, 4, 5), (4, 2, 3), (4, 0, 1), (4, 1, 2)]:
        m.round_finished("ssd", proposed, accepted, committed)
    m.round_finished("sd", 4, 3, 4)
    for result in ["hit", "hit", "hit", "late", "forced", "forced"]:
        m.cache_lookup(result)
    m.cache_wait("hit", 0.0125)   # the late lookup waited 12.5 ms, and the draft's entries held its outcome
    for kind in ["jit", "jit", "ngram"]:
        m.backup_used(kind)
    m.set_queue_depth(2)
    m.set_active(3)
    m.set_drafts_alive(1)
    m.target_verify(0.25, 4)
    m.target_verify(0.5, 8)
    m.router_hop(0.0078125)
    m.draft_round(0.125)
    m.jit(0.0625)
    m.jit(0.0625)


def test_render_matches_synthetic_workload_exactly():
    m = RouterMetrics(model_name=MODEL)
    run_workload(m)
    s = samples(m)

    assert value(s, "ssd_requests_started_total", model_name=MODEL, mode="ssd") == 2
    assert value(s, "ssd_requests_started_total", model_name=MODEL, mode="ar") == 1
    assert value(s, "ssd_requests_total", model_name=MODEL, mode="ssd", outcome="length") == 2
    assert value(s, "ssd_requests_total", model_name=MODEL, mode="ar", outcome="abort") == 1
    assert sum(v for (name, _), v in s.items() if name == "ssd_requests_total") == 3
    assert value(s, "ssd_prompt_tokens_total", model_name=MODEL) == 20
    assert value(s, "ssd_generation_tokens_total", model_name=MODEL) == 48
    assert value(s, "ssd_requests_queued") == 2
    assert value(s, "ssd_requests_running") == 3
    assert value(s, "ssd_drafts_alive") == 1

    # The aborted request had no first token: TTFT counts 2, e2e counts 3.
    assert value(s, "ssd_time_to_first_token_seconds_count", model_name=MODEL) == 2
    assert value(s, "ssd_time_to_first_token_seconds_sum", model_name=MODEL) == 0.75
    assert value(s, "ssd_e2e_request_latency_seconds_count", model_name=MODEL) == 3
    assert value(s, "ssd_e2e_request_latency_seconds_sum", model_name=MODEL) == 3.125

    # The split: queue (arrival to admission), prefill (admission to first token), decode (first token to end).
    assert value(s, "ssd_request_queue_time_seconds_count", model_name=MODEL) == 2
    assert value(s, "ssd_request_queue_time_seconds_sum", model_name=MODEL) == 0.125
    assert value(s, "ssd_request_prefill_time_seconds_sum", model_name=MODEL) == 0.125 + 0.5
    assert value(s, "ssd_request_decode_time_seconds_count", model_name=MODEL) == 2
    assert value(s, "ssd_request_decode_time_seconds_sum", model_name=MODEL) == 1.75 + 0.5
    assert value(s, "ssd_request_prompt_tokens_sum", model_name=MODEL) == 20
    assert value(s, "ssd_request_prompt_tokens_bucket", model_name=MODEL, le="8.0") == 2
    assert value(s, "ssd_request_generation_tokens_count", model_name=MODEL) == 3
    assert value(s, "ssd_request_generation_tokens_bucket", model_name=MODEL, le="16.0") == 2

    # Bursts are split evenly: 8 observations summing to the 1.75 s of streaming; the four 0.125 s fall <= 0.2.
    assert value(s, "ssd_inter_token_latency_seconds_count", model_name=MODEL) == 8
    assert value(s, "ssd_inter_token_latency_seconds_sum", model_name=MODEL) == 1.75
    assert value(s, "ssd_inter_token_latency_seconds_bucket", model_name=MODEL, le="0.2") == 4

    assert value(s, "ssd_spec_rounds_total", mode="ssd") == 4
    assert value(s, "ssd_spec_rounds_total", mode="sd") == 1
    assert value(s, "ssd_spec_rounds_total", mode="ar") == 0
    assert value(s, "ssd_tokens_per_round_count", mode="ssd") == 4
    assert value(s, "ssd_tokens_per_round_sum", mode="ssd") == 11
    assert value(s, "ssd_tokens_per_round_bucket", mode="ssd", le="3.0") == 3
    assert value(s, "ssd_tokens_per_round_count", mode="sd") == 1
    assert value(s, "ssd_tokens_per_round_sum", mode="sd") == 4

    # Accepted counts per position 1..4: rounds accepting 4, 2, 0, 1, 3 -> 4, 3, 2, 1 (of 5 offered each).
    for position, accepted in {"1": 4, "2": 3, "3": 2, "4": 1}.items():
        assert value(s, "ssd_spec_draft_tokens_total", position=position) == 5
        assert value(s, "ssd_spec_accepted_tokens_total", position=position) == accepted
    assert ("ssd_spec_draft_tokens_total", (("position", "5"),)) not in s

    assert {r: value(s, "ssd_cache_lookups_total", result=r)
            for r in ["hit", "no_entry", "late", "stale", "forced"]} == \
        {"hit": 3, "no_entry": 0, "late": 1, "stale": 0, "forced": 2}
    assert {r: value(s, "ssd_cache_waits_total", result=r) for r in ["hit", "no_entry", "failed"]} == \
        {"hit": 1, "no_entry": 0, "failed": 0}
    assert value(s, "ssd_cache_wait_seconds_count") == 1 and value(s, "ssd_cache_wait_seconds_sum") == 0.0125
    assert {k: value(s, "ssd_backups_total", kind=k) for k in ["jit", "ngram", "none"]} == \
        {"jit": 2, "ngram": 1, "none": 0}

    assert value(s, "ssd_target_verify_seconds_count") == 2
    assert value(s, "ssd_target_verify_seconds_sum") == 0.75
    assert value(s, "ssd_target_verify_batch_size_count") == 2
    assert value(s, "ssd_target_verify_batch_size_sum") == 12
    assert value(s, "ssd_router_hop_seconds_count") == 1
    assert value(s, "ssd_router_hop_seconds_sum") == 0.0078125
    assert value(s, "ssd_draft_round_seconds_count") == 1
    assert value(s, "ssd_draft_round_seconds_sum") == 0.125
    assert value(s, "ssd_jit_seconds_count") == 2
    assert value(s, "ssd_jit_seconds_sum") == 0.125


def test_two_instances_do_not_share_values():
    a, b = RouterMetrics(model_name=MODEL), RouterMetrics(model_name=MODEL)
    run_workload(a)
    b.cache_lookup("hit")
    sa, sb = samples(a), samples(b)
    assert value(sa, "ssd_cache_lookups_total", result="hit") == 3
    assert value(sb, "ssd_cache_lookups_total", result="hit") == 1
    assert value(sb, "ssd_requests_total", model_name=MODEL, mode="ssd", outcome="length") == 0
    assert value(sb, "ssd_inter_token_latency_seconds_count", model_name=MODEL) == 0


def test_every_metric_is_named_ssd_and_counters_end_in_total():
    m = RouterMetrics(model_name=MODEL)
    run_workload(m)
    body, content_type = m.render()
    assert content_type.startswith("text/plain")
    families = list(text_string_to_metric_families(body.decode()))
    assert {f.name for f in families} >= {
        "ssd_requests", "ssd_requests_running", "ssd_requests_queued", "ssd_prompt_tokens",
        "ssd_generation_tokens", "ssd_time_to_first_token_seconds", "ssd_inter_token_latency_seconds",
        "ssd_e2e_request_latency_seconds", "ssd_tokens_per_round", "ssd_spec_draft_tokens",
        "ssd_spec_accepted_tokens", "ssd_spec_rounds", "ssd_cache_lookups", "ssd_cache_waits", "ssd_backups",
        "ssd_drafts_alive",
        "ssd_target_verify_seconds", "ssd_router_hop_seconds", "ssd_draft_round_seconds", "ssd_jit_seconds",
        "ssd_cache_wait_seconds",
        "ssd_target_verify_batch_size"}
    for family in families:
        assert family.name.startswith("ssd_")
        for sample in family.samples:
            assert sample.name.startswith("ssd_")
            if family.type == "counter":
                assert sample.name.endswith(("_total", "_created"))


def test_labelled_series_read_zero_before_any_event():
    s = samples(RouterMetrics(mode_labels=("ssd",), model_name=MODEL))
    assert value(s, "ssd_requests_total", model_name=MODEL, mode="ssd", outcome="time_limit") == 0
    assert value(s, "ssd_cache_lookups_total", result="stale") == 0
    assert value(s, "ssd_backups_total", kind="none") == 0
    assert not any(dict(labels).get("mode") == "ar" for _, labels in s)


def test_unknown_label_values_are_rejected():
    m = RouterMetrics(mode_labels=("ssd",), model_name=MODEL)
    with pytest.raises(ValueError, match="mode"):
        m.request_started("ar")
    with pytest.raises(ValueError, match="outcome"):
        m.request_finished("ssd", "finished", 1, 1, 0.1, 0.2)
    with pytest.raises(ValueError, match="cache lookup result"):
        m.cache_lookup("miss")
    with pytest.raises(ValueError, match="cache wait result"):
        m.cache_wait("late", 0.01)
    with pytest.raises(ValueError, match="backup kind"):
        m.backup_used("auto")
    with pytest.raises(ValueError, match="accepted"):
        m.round_finished("ssd", proposed=2, accepted=3, committed=4)
    assert value(samples(m), "ssd_spec_rounds_total", mode="ssd") == 0


def test_str_enums_from_the_engine_are_accepted_as_their_values():
    m = RouterMetrics(model_name=MODEL)
    m.request_finished("sd", FinishReason.STOP_STRING, 3, 2, 0.1, 0.2)
    m.backup_used(BackupPolicy.NGRAM)
    s = samples(m)
    assert value(s, "ssd_requests_total", model_name=MODEL, mode="sd", outcome="stop_string") == 1
    assert value(s, "ssd_backups_total", kind="ngram") == 1


def test_hooks_on_one_thread_and_render_on_others_lose_no_counts():
    m = RouterMetrics(model_name=MODEL)
    stop = threading.Event()

    def scrape():
        while not stop.is_set():
            m.render()

    scrapers = [threading.Thread(target=scrape) for _ in range(2)]
    for t in scrapers:
        t.start()
    for _ in range(2000):
        m.round_finished("ssd", 3, 1, 2)
    stop.set()
    for t in scrapers:
        t.join()
    s = samples(m)
    assert value(s, "ssd_spec_rounds_total", mode="ssd") == 2000
    assert value(s, "ssd_spec_accepted_tokens_total", position="1") == 2000
    assert value(s, "ssd_spec_accepted_tokens_total", position="2") == 0


def test_importing_metrics_does_not_import_torch():
    code = "import sys, services.router.metrics; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
