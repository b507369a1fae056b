"""Prometheus metrics for the router: hook methods the engine loop calls, `render()` for GET /metrics.

Contract:
- One `RouterMetrics` owns its own `CollectorRegistry` (never the process-global one), so any number can live
  in one process (tests) and `render()` shows exactly this router's series, all named `ssd_*`.
- The engine loop thread calls the hooks; HTTP threads call `render()`. prometheus_client metrics are
  thread-safe, so no lock is needed here.
- Label values come from fixed sets (modes, finish reasons, lookup results, backup kinds) and are checked: an
  unknown value raises `ValueError` instead of silently growing cardinality. Every combination is created at
  construction, so counters read 0 (not "absent") before the first event and `rate()` works from the start.
  Positions `1..K` are created the first time a round proposes that many tokens; K is bounded by the config.
- Base units: seconds for time, plain counts otherwise; counters end in `_total`.
- Request-level series carry `model_name` (the served model's name, fixed per router), as vLLM's do; the
  speculation and step series describe the router's workers and carry none.
- A request's time splits as vLLM's does (names ours): queue (arrival to admission), prefill (admission to its
  first token), decode (first token to the end); its prompt and generation lengths are histograms too.
- No torch, no model: importing this module pulls in only prometheus_client.

Inter-token latency: the router streams tokens in bursts (a round commits up to K+1 at once). A burst of `n`
tokens that arrives `interval_s` after the request's previous burst is recorded as `n` observations of
`interval_s / n`. The histogram's sum is then the true streaming time and its count the true token count, so
`rate(sum) / rate(count)` is the mean time per generated token - the number users compare across AR, SD and SSD.

Late speculation-cache entries (the draft finished the branch, but after the target's outcome was needed), as a
fraction of all lookups over 5 minutes (for dashboards and the HPA):

    sum(rate(ssd_cache_lookups_total{result="late"}[5m]))
      / clamp_min(sum(rate(ssd_cache_lookups_total[5m])), 1e-9)

Cache hit rate is the same expression with `result="hit"`. A late lookup waits for the draft's entries where its
backup would be a JIT (`ssd.round.core.RoundCore.next`); `ssd_cache_waits_total{result}` counts how those waits
ended (hit: the round ran from the cache after all), so the rounds run from the cache are
`result="hit"` lookups plus `result="hit"` waits; acceptance at position i is
`rate(ssd_spec_accepted_tokens_total{position="i"}[5m]) / rate(ssd_spec_draft_tokens_total{position="i"}[5m])`.
"""
from __future__ import annotations

from enum import Enum

from ssd.round.metrics import RoundMetrics
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

OUTCOMES = ("stop", "eos", "length", "stop_string", "abort", "time_limit", "error")
LOOKUP_RESULTS = ("hit", "no_entry", "late", "stale", "forced")
WAIT_RESULTS = ("hit", "no_entry", "failed")
BACKUP_KINDS = ("jit", "ngram", "none")

# Step latencies: sub-millisecond loopback hops up to a 30 s long-prompt prefill.
STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0)
ITL_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
PHASE_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
LENGTH_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
TOKENS_PER_ROUND_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 12, 16)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _label(value, allowed: tuple[str, ...], what: str) -> str:
    """A label value as a plain string (str-valued Enums such as FinishReason give their value), checked."""
    value = value.value if isinstance(value, Enum) else value
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; expected one of {allowed}")
    return value


def _non_negative(name: str, value: float) -> None:
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


class RouterMetrics(RoundMetrics):
    """The router's metric set in its own registry. See the module docstring for the contract."""

    def __init__(self, mode_labels: tuple[str, ...] = ("ar", "sd", "ssd"), model_name: str = ""):
        self.modes = tuple(mode_labels)
        self.model = model_name
        self.registry = r = CollectorRegistry()
        m = ["model_name"]

        # Requests.
        self.requests_started = Counter(
            "ssd_requests_started_total", "Requests admitted by the router, by decoding mode.",
            m + ["mode"], registry=r)
        self.requests = Counter(
            "ssd_requests_total", "Requests finished, by decoding mode and finish reason (outcome).",
            m + ["mode", "outcome"], registry=r)
        self.running = Gauge(
            "ssd_requests_running", "Requests currently decoding (admitted and not finished).", registry=r)
        self.queued = Gauge(
            "ssd_requests_queued", "Requests waiting for admission.", registry=r)
        self.prompt_tokens = Counter(
            "ssd_prompt_tokens_total", "Prompt tokens of finished requests.", m, registry=r)
        self.generation_tokens = Counter(
            "ssd_generation_tokens_total", "Generated (completion) tokens of finished requests.", m, registry=r)
        self.ttft = Histogram(
            "ssd_time_to_first_token_seconds", "Time from arrival to the first generated token.",
            m, registry=r, buckets=TTFT_BUCKETS)
        self.itl = Histogram(
            "ssd_inter_token_latency_seconds",
            "Time per generated token after the first; a burst of n tokens counts n times interval/n.",
            m, registry=r, buckets=ITL_BUCKETS)
        self.e2e = Histogram(
            "ssd_e2e_request_latency_seconds", "Time from arrival to the end of the request.",
            m, registry=r, buckets=E2E_BUCKETS)
        self.queue_time = Histogram(
            "ssd_request_queue_time_seconds", "Time a request waited for admission (arrival to prefill sent).",
            m, registry=r, buckets=PHASE_BUCKETS)
        self.prefill_time = Histogram(
            "ssd_request_prefill_time_seconds", "Time from admission to the request's first token.",
            m, registry=r, buckets=PHASE_BUCKETS)
        self.decode_time = Histogram(
            "ssd_request_decode_time_seconds", "Time from the request's first token to its end.",
            m, registry=r, buckets=PHASE_BUCKETS)
        self.prompt_length = Histogram(
            "ssd_request_prompt_tokens", "Prompt length of finished requests, in tokens.",
            m, registry=r, buckets=LENGTH_BUCKETS)
        self.generation_length = Histogram(
            "ssd_request_generation_tokens", "Generated length of finished requests, in tokens.",
            m, registry=r, buckets=LENGTH_BUCKETS)

        # Speculation.
        self.tokens_per_round = Histogram(
            "ssd_tokens_per_round", "Tokens committed per verification round (accepted drafts + 1), by mode.",
            ["mode"], registry=r, buckets=TOKENS_PER_ROUND_BUCKETS)
        self.draft_tokens = Counter(
            "ssd_spec_draft_tokens_total", "Draft tokens offered to the target at each position 1..K.",
            ["position"], registry=r)
        self.accepted_tokens = Counter(
            "ssd_spec_accepted_tokens_total", "Draft tokens accepted by the target at each position 1..K.",
            ["position"], registry=r)
        self.rounds = Counter(
            "ssd_spec_rounds_total", "Verification rounds finished, by mode.", ["mode"], registry=r)
        self.cache_lookups = Counter(
            "ssd_cache_lookups_total",
            "Speculation cache lookups after a round, by result (hit, no_entry, late, stale, forced).",
            ["result"], registry=r)
        self.cache_waits = Counter(
            "ssd_cache_waits_total",
            "Late speculation cache lookups that waited for the draft's entries, by how the wait ended (hit, "
            "no_entry, failed).", ["result"], registry=r)
        self.backups = Counter(
            "ssd_backups_total", "Backup speculations used on a cache miss, by kind (jit, ngram, none).",
            ["kind"], registry=r)
        self.drafts_alive = Gauge(
            "ssd_drafts_alive", "Draft services currently connected and answering.", registry=r)
        self.speculation_k = Gauge(
            "ssd_speculation_k", "Draft tokens per round the adaptive policy currently runs (0 = speculation off), "
            "by mode.", ["mode"], registry=r)
        self.feature_rows_sent = Counter(
            "ssd_feature_rows_total", "Target feature rows (one per position) sent on to feature-reading drafts.",
            registry=r)

        # Step timings.
        self.verify_time = Histogram(
            "ssd_target_verify_seconds", "Target verify step, request sent to outcomes received.",
            registry=r, buckets=STEP_BUCKETS)
        self.verify_batch = Histogram(
            "ssd_target_verify_batch_size", "Sequences per target verify step.",
            registry=r, buckets=BATCH_BUCKETS)
        self.hop_time = Histogram(
            "ssd_router_hop_seconds", "Router time between receiving outcomes and sending the next step.",
            registry=r, buckets=STEP_BUCKETS)
        self.draft_round_time = Histogram(
            "ssd_draft_round_seconds", "Draft speculation round (glue, forks, K steps) as seen by the router.",
            registry=r, buckets=STEP_BUCKETS)
        self.wait_time = Histogram(
            "ssd_cache_wait_seconds", "A late speculation cache lookup's wait for the draft's entries.",
            registry=r, buckets=STEP_BUCKETS)
        self.jit_time = Histogram(
            "ssd_jit_seconds", "Just-in-time draft speculation after a cache miss, as seen by the router.",
            registry=r, buckets=STEP_BUCKETS)

        for h in (self.prompt_tokens, self.generation_tokens, self.ttft, self.itl, self.e2e, self.queue_time,
                  self.prefill_time, self.decode_time, self.prompt_length, self.generation_length):
            h.labels(self.model)
        for mode in self.modes:
            self.requests_started.labels(self.model, mode)
            self.rounds.labels(mode)
            self.tokens_per_round.labels(mode)
            for outcome in OUTCOMES:
                self.requests.labels(self.model, mode, outcome)
        for result in LOOKUP_RESULTS:
            self.cache_lookups.labels(result)
        for result in WAIT_RESULTS:
            self.cache_waits.labels(result)
        for kind in BACKUP_KINDS:
            self.backups.labels(kind)
        self._positions = 0  # positions 1.._positions have their series created

    # Requests ------------------------------------------------------------------------------------------

    def request_started(self, mode: str) -> None:
        self.requests_started.labels(self.model, _label(mode, self.modes, "mode")).inc()

    def request_finished(self, mode: str, outcome: str, prompt_tokens: int, completion_tokens: int,
                         ttft_s: float | None, e2e_s: float, queue_s: float | None = None) -> None:
        """One request ended. `ttft_s` is None when it ended before its first token, `queue_s` when it ended
        before admission (neither is observed then); prefill and decode time follow from them."""
        labels = _label(mode, self.modes, "mode"), _label(outcome, OUTCOMES, "outcome")
        _non_negative("prompt_tokens", prompt_tokens)
        _non_negative("completion_tokens", completion_tokens)
        model = self.model
        self.requests.labels(model, *labels).inc()
        self.prompt_tokens.labels(model).inc(prompt_tokens)
        self.generation_tokens.labels(model).inc(completion_tokens)
        self.prompt_length.labels(model).observe(prompt_tokens)
        self.generation_length.labels(model).observe(completion_tokens)
        if queue_s is not None:
            self.queue_time.labels(model).observe(queue_s)
        if ttft_s is not None:
            self.ttft.labels(model).observe(ttft_s)
            self.decode_time.labels(model).observe(max(0.0, e2e_s - ttft_s))
            if queue_s is not None:
                self.prefill_time.labels(model).observe(max(0.0, ttft_s - queue_s))
        self.e2e.labels(model).observe(e2e_s)

    def tokens_emitted(self, n: int, interval_s: float) -> None:
        """`n` tokens of one request arrived together, `interval_s` after its previous emission."""
        _non_negative("n", n)
        if n == 0:
            return
        per_token, itl = interval_s / n, self.itl.labels(self.model)
        for _ in range(n):
            itl.observe(per_token)

    # Speculation ---------------------------------------------------------------------------------------

    def round_finished(self, mode: str, proposed: int, accepted: int, committed: int) -> None:
        """One sequence's round: `proposed` draft tokens offered, the first `accepted` of them kept,
        `committed` tokens added to the output (accepted + the target's token, fewer at a length limit)."""
        mode = _label(mode, self.modes, "mode")
        if not 0 <= accepted <= proposed:
            raise ValueError(f"need 0 <= accepted <= proposed, got accepted={accepted} proposed={proposed}")
        _non_negative("committed", committed)
        self._ensure_positions(proposed)
        self.rounds.labels(mode).inc()
        self.tokens_per_round.labels(mode).observe(committed)
        for i in range(proposed):
            position = str(i + 1)
            self.draft_tokens.labels(position).inc()
            if i < accepted:
                self.accepted_tokens.labels(position).inc()

    def _ensure_positions(self, k: int) -> None:
        # Offered and accepted series appear together, so a per-position ratio never divides by "absent".
        while self._positions < k:
            self._positions += 1
            self.draft_tokens.labels(str(self._positions))
            self.accepted_tokens.labels(str(self._positions))

    def cache_lookup(self, result: str) -> None:
        self.cache_lookups.labels(_label(result, LOOKUP_RESULTS, "cache lookup result")).inc()

    def cache_wait(self, result: str, seconds: float) -> None:
        _non_negative("seconds", seconds)
        self.cache_waits.labels(_label(result, WAIT_RESULTS, "cache wait result")).inc()
        self.wait_time.observe(seconds)

    def backup_used(self, kind: str) -> None:
        self.backups.labels(_label(kind, BACKUP_KINDS, "backup kind")).inc()

    def feature_rows(self, n: int) -> None:
        _non_negative("n", n)
        self.feature_rows_sent.inc(n)

    # Gauges --------------------------------------------------------------------------------------------

    def set_queue_depth(self, n: int) -> None:
        self.queued.set(n)

    def set_active(self, n: int) -> None:
        self.running.set(n)

    def set_drafts_alive(self, n: int) -> None:
        self.drafts_alive.set(n)

    def set_speculation_k(self, mode: str, k: int) -> None:
        self.speculation_k.labels(mode).set(k)

    # Step timings --------------------------------------------------------------------------------------

    def target_verify(self, seconds: float, batch_size: int) -> None:
        self.verify_time.observe(seconds)
        self.verify_batch.observe(batch_size)

    def router_hop(self, seconds: float) -> None:
        self.hop_time.observe(seconds)

    def draft_round(self, seconds: float) -> None:
        self.draft_round_time.observe(seconds)

    def jit(self, seconds: float) -> None:
        self.jit_time.observe(seconds)

    # Exposition ----------------------------------------------------------------------------------------

    def render(self) -> tuple[bytes, str]:
        """(body, content type) for GET /metrics, in the Prometheus text format."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
