"""Locust load suite for a running router: streaming gRPC (the SDK) and streaming OpenAI HTTP users.

Each user streams greedy chat completions of mixed prompts and records, per request, through the custom event
`ssd_sample` (metric, value, api):

  ttft_ms   time to the first streamed piece        itl_ms   gap between consecutive streamed pieces
  e2e_ms    time to the end of the stream            tokens_per_round   from the final response's stats
  tokens    completion tokens of the request

Time metrics also enter locust's own statistics (request types "TTFT", "ITL"; the stream itself is the request,
its response time the end-to-end latency, so its failures are the run's failures). At the end the summary
(count, mean, p50, p90, p99, max per API and metric, and the tokens/s of the run) is written to
`<--csv prefix>_ssd.csv` and printed.

Headless (router from `ssd up`: gRPC :50051, HTTP :8000):

    locust -f tests/load/locustfile.py --headless -u 20 -r 5 -t 60s --only-summary \\
        --host http://127.0.0.1:8000 --grpc-address 127.0.0.1:50051 --max-tokens 32 --csv load/run

Append `GrpcUser` or `OpenAIUser` to run one kind only (default: both, equally weighted).
"""
from grpc.experimental import gevent as grpc_gevent

grpc_gevent.init_gevent()   # before any grpc channel exists: gRPC's own threads must cooperate with gevent

import csv  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # the repository, when ssd is not installed

import numpy as np  # noqa: E402
from locust import HttpUser, User, between, events, task  # noqa: E402
from locust.event import EventHook  # noqa: E402
from locust.runners import WorkerRunner  # noqa: E402

from ssd.client import Client, Result, SSDError  # noqa: E402
from ssd.prompts import PROMPTS  # noqa: E402

events.ssd_sample = EventHook()   # fire(metric=..., value=..., api=...)
SAMPLES: dict[tuple[str, str], list[float]] = defaultdict(list)
RUN = {"start": None, "end": None}


@events.init_command_line_parser.add_listener
def _options(parser):
    parser.add_argument("--grpc-address", default="127.0.0.1:50051", help="the router's gRPC address")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per completion")


@events.ssd_sample.add_listener
def _collect(metric: str, value: float, api: str, **_):
    SAMPLES[(api, metric)].append(value)


@events.test_start.add_listener
def _start(environment, **_):
    RUN["start"] = time.monotonic()


@events.report_to_master.add_listener
def _to_master(client_id, data):
    data["ssd_samples"] = [[api, metric, values] for (api, metric), values in SAMPLES.items()]
    SAMPLES.clear()


@events.worker_report.add_listener
def _from_worker(client_id, data):
    for api, metric, values in data.get("ssd_samples", []):
        SAMPLES[(api, metric)].extend(values)


def summary() -> list[dict]:
    """One row per (api, metric), and one "all/tokens_per_s" row for the run."""
    rows = []
    for (api, metric), values in sorted(SAMPLES.items()):
        a = np.asarray(values, dtype=float)
        rows.append({"api": api, "metric": metric, "count": len(a), "mean": a.mean(),
                     "p50": np.percentile(a, 50), "p90": np.percentile(a, 90), "p99": np.percentile(a, 99),
                     "max": a.max()})
    elapsed = (RUN["end"] or time.monotonic()) - (RUN["start"] or time.monotonic())
    tokens = sum(sum(v) for (_, m), v in SAMPLES.items() if m == "tokens")
    rate = tokens / elapsed if elapsed > 0 else 0.0
    rows.append({"api": "all", "metric": "tokens_per_s", "count": int(tokens), "mean": rate, "p50": rate,
                 "p90": rate, "p99": rate, "max": rate})
    return rows


@events.test_stop.add_listener
def _stop(environment, **_):
    RUN["end"] = time.monotonic()
    if isinstance(environment.runner, WorkerRunner):
        return   # its samples went to the master
    rows = summary()
    prefix = environment.parsed_options.csv_prefix
    if prefix:
        with open(f"{prefix}_ssd.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows([{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
                              for r in rows])
    print("\nssd summary (ms; tokens_per_round; tokens/s)", file=sys.stderr)
    for r in rows:
        print(f"  {r['api']:5} {r['metric']:17} n={r['count']:<7} mean={r['mean']:9.2f} p50={r['p50']:9.2f} "
              f"p99={r['p99']:9.2f} max={r['max']:9.2f}", file=sys.stderr)


class _Timer:
    """The timing of one stream: TTFT, ITL between pieces, end to end."""

    def __init__(self, api: str, environment):
        self.api, self.env = api, environment
        self.start = time.perf_counter()
        self.last = None

    def piece(self) -> None:
        now = time.perf_counter()
        if self.last is None:
            self._sample("ttft_ms", "TTFT", 1000 * (now - self.start))
        else:
            self._sample("itl_ms", "ITL", 1000 * (now - self.last))
        self.last = now

    def end(self, tokens: int, tokens_per_round: float) -> float:
        e2e = 1000 * (time.perf_counter() - self.start)
        self.env.events.ssd_sample.fire(metric="e2e_ms", value=e2e, api=self.api)
        self.env.events.ssd_sample.fire(metric="tokens", value=tokens, api=self.api)
        if tokens_per_round > 0:
            self.env.events.ssd_sample.fire(metric="tokens_per_round", value=tokens_per_round, api=self.api)
        return e2e

    def _sample(self, metric: str, kind: str, ms: float) -> None:
        self.env.events.ssd_sample.fire(metric=metric, value=ms, api=self.api)
        self.env.events.request.fire(request_type=kind, name=self.api, response_time=ms, response_length=0,
                                     exception=None, context={})


def _messages() -> list[dict]:
    return [{"role": "user", "content": random.choice(PROMPTS)}]


class GrpcUser(User):
    """Streams through the SDK (`ssd.client.Client.stream`) over gRPC."""
    wait_time = between(0.0, 0.2)

    def on_start(self):
        self.client = Client(self.environment.parsed_options.grpc_address, timeout=600, max_retries=0)

    def on_stop(self):
        self.client.close()

    @task
    def stream(self):
        timer, result, error = _Timer("grpc", self.environment), None, None
        try:
            for item in self.client.stream(_messages(), max_tokens=self.environment.parsed_options.max_tokens,
                                           ignore_eos=True):
                if isinstance(item, Result):
                    result = item
                else:
                    timer.piece()
            if result is None or result.finish_reason not in ("length", "eos", "stop"):
                error = RuntimeError(f"stream ended with {result.finish_reason if result else 'nothing'}")
        except SSDError as e:
            error = e
        tokens = result.completion_tokens if result else 0
        e2e = timer.end(tokens, result.stats.tokens_per_round if result else 0.0)
        self.environment.events.request.fire(request_type="gRPC", name="Generate (stream)", response_time=e2e,
                                             response_length=tokens, exception=error, context={})


class OpenAIUser(HttpUser):
    """Streams `/v1/chat/completions` (Server-Sent Events) over the OpenAI-compatible HTTP API."""
    wait_time = between(0.0, 0.2)

    def on_start(self):
        self.model = self.client.get("/v1/models", name="/v1/models").json()["data"][0]["id"]

    @task
    def chat(self):
        body = {"model": self.model, "messages": _messages(), "stream": True, "temperature": 0,
                "max_tokens": self.environment.parsed_options.max_tokens, "ignore_eos": True,
                "stream_options": {"include_usage": True}}
        timer, final, usage, done = _Timer("http", self.environment), None, None, False
        with self.client.post("/v1/chat/completions", json=body, stream=True, catch_response=True,
                              name="/v1/chat/completions (stream)") as resp:
            try:
                if resp.status_code != 200:
                    raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
                for line in resp.iter_lines():
                    if not line.startswith(b"data: "):
                        continue
                    if line == b"data: [DONE]":
                        done = True
                        break
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        raise RuntimeError(chunk["error"]["message"])
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    if chunk.get("ssd"):
                        final = chunk["ssd"]
                    if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                        timer.piece()
                if not done or final is None:
                    raise RuntimeError("the stream ended without its final chunk and [DONE]")
                resp.success()
            except Exception as e:  # noqa: BLE001 - any failure of the stream is this request's failure
                resp.failure(e)
        timer.end(usage["completion_tokens"] if usage else 0, final["tokens_per_round"] if final else 0.0)
