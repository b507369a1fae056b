"""The locust suite: sustained streaming load on a router over gRPC (the SDK) and on any OpenAI-compatible
server over HTTP (`/v1/chat/completions` with Server-Sent Events).

    ssd bench locust --headless -u 20 -r 5 -t 60s --only-summary --host http://127.0.0.1:8000 \\
        --grpc-address 127.0.0.1:50051 --max-tokens 32 --csv load/run [GrpcUser|OpenAIUser]

(`ssd bench locust ARGS` is `locust -f <this file> ARGS`.) Without a user class both kinds run, equally weighted;
`OpenAIUser` alone needs nothing of ssd from the server, so `--host` may be another engine's.

Each request is one whole stream, timed from just before it is sent to its last token (not to the response
headers), with the figures of `ssd bench serve` (`ssd.bench.serve.measured`): TTFT to the first token, E2E to
the end of the stream, TPOT = (E2E - TTFT) / (tokens - 1), and ITL per token: a piece carrying k tokens that
arrived g seconds after the previous one adds k gaps of g / k. Tokens are counted from the SDK's token ids, or
over HTTP from `usage.completion_tokens` (`stream_options.include_usage`; without it, one token per piece).
Tokens per round comes from the SDK's stats or the final chunk's `ssd` field, only where the server sends it.

Locust's own statistics get one request per stream (its response time the E2E, its failures the run's failures)
and, for successful streams, a "TTFT" and a "TPOT" entry. At the end a summary per API and metric (count, mean,
p50, p90, p99, max: ttft_ms, tpot_ms, itl_ms, e2e_ms, output_tokens, tokens_per_round) and the run's tokens/s
is printed and, with `--csv PREFIX`, written to `PREFIX_ssd.csv`; samples from workers reach the master.
"""
from grpc.experimental import gevent as grpc_gevent

grpc_gevent.init_gevent()   # before any grpc channel exists: gRPC's own threads must cooperate with gevent

import csv  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402

import numpy as np  # noqa: E402
import requests  # noqa: E402
from locust import User, between, events, task  # noqa: E402
from locust.event import EventHook  # noqa: E402
from locust.runners import WorkerRunner  # noqa: E402

from ssd.bench.report import Outcome  # noqa: E402
from ssd.bench.serve import content_of, measured  # noqa: E402
from ssd.bench.workload import load_dataset  # noqa: E402
from ssd.client import Client, Result, SSDError  # noqa: E402

events.ssd_sample = EventHook()   # fire(metric=..., value=..., api=...)
SAMPLES: dict[tuple[str, str], list[float]] = defaultdict(list)
RUN = {"start": None, "end": None}
N_PROMPTS = 512


@events.init_command_line_parser.add_listener
def _options(parser):
    parser.add_argument("--grpc-address", default="127.0.0.1:50051", help="the router's gRPC address")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per completion")
    parser.add_argument("--dataset", default="builtin:chat", help="FILE.jsonl or builtin:chat|code|math")
    parser.add_argument("--model", default="", help="the HTTP request's model (default: the first of /v1/models)")
    parser.add_argument("--api-key", default="", help="bearer key for both APIs (default: $SSD_API_KEY)")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="generate --max-tokens whatever the model says (HTTP: vLLM's `ignore_eos` field)")


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
    tokens = sum(sum(v) for (_, m), v in SAMPLES.items() if m == "output_tokens")
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
    print("\nssd summary (ms; tokens; tokens per round; tokens/s)", file=sys.stderr)
    for r in rows:
        print(f"  {r['api']:5} {r['metric']:17} n={r['count']:<7} mean={r['mean']:9.2f} p50={r['p50']:9.2f} "
              f"p99={r['p99']:9.2f} max={r['max']:9.2f}", file=sys.stderr)


def report(env, api: str, request_type: str, name: str, out: Outcome, tokens_per_round: float | None) -> None:
    """One finished stream into locust's statistics and the summary's samples."""
    env.events.request.fire(request_type=request_type, name=name, response_time=1000 * out.e2e,
                            response_length=out.output_tokens, context={},
                            exception=None if out.ok else RuntimeError(out.error))
    if not out.ok:
        return
    figures = {"ttft_ms": 1000 * out.ttft, "e2e_ms": 1000 * out.e2e, "output_tokens": out.output_tokens}
    if out.tpot is not None:
        figures["tpot_ms"] = 1000 * out.tpot
    if tokens_per_round:
        figures["tokens_per_round"] = tokens_per_round
    for metric, value in figures.items():
        env.events.ssd_sample.fire(metric=metric, value=value, api=api)
    for gap in out.itl:
        env.events.ssd_sample.fire(metric="itl_ms", value=1000 * gap, api=api)
    for kind in ("TTFT", "TPOT"):
        if f"{kind.lower()}_ms" in figures:
            env.events.request.fire(request_type=kind, name=api, response_time=figures[f"{kind.lower()}_ms"],
                                    response_length=0, exception=None, context={})


class _Workload:
    """The prompts every user draws from in turn (the dataset, loaded once per process)."""
    items: list[dict] | None = None
    turn = itertools.count()

    @classmethod
    def next(cls, options) -> list[dict]:
        if cls.items is None:
            cls.items = load_dataset(options.dataset, N_PROMPTS, seed=0)
        item = cls.items[next(cls.turn) % len(cls.items)]
        return item.get("messages") or [{"role": "user", "content": item["prompt"]}]


def _api_key(options) -> str | None:
    return options.api_key or os.environ.get("SSD_API_KEY") or None


class GrpcUser(User):
    """Streams through the SDK (`ssd.client.Client.stream`) over gRPC."""
    wait_time = between(0.0, 0.2)

    def on_start(self):
        opts = self.environment.parsed_options
        self.client = Client(opts.grpc_address, timeout=600, max_retries=0, api_key=_api_key(opts))

    def on_stop(self):
        self.client.close()

    @task
    def stream(self):
        opts = self.environment.parsed_options
        out, chunks, result = Outcome(), [], None
        start = time.perf_counter()
        try:
            for item in self.client.stream(_Workload.next(opts), max_tokens=opts.max_tokens,
                                           ignore_eos=opts.ignore_eos):
                if isinstance(item, Result):
                    result = item
                elif item.token_ids:
                    chunks.append((time.perf_counter(), item.text, len(item.token_ids)))
            end = time.perf_counter()
            if result is None or result.finish_reason not in ("length", "eos", "stop", "stop_string"):
                out.error = f"the stream ended with {result.finish_reason if result else 'nothing'}"
            else:
                measured(out, start, end, chunks, result.completion_tokens)
        except SSDError as e:
            out.error = str(e)
        out.e2e = out.e2e or time.perf_counter() - start
        report(self.environment, "grpc", "gRPC", "Generate (stream)", out,
               result.stats.tokens_per_round if result and result.stats.rounds else None)


class OpenAIUser(User):
    """Streams `/v1/chat/completions` (Server-Sent Events) from `--host`, any OpenAI-compatible server: success is
    HTTP 200, content, and a chunk with a `finish_reason`; the `ssd` field is read only when it is there."""
    wait_time = between(0.0, 0.2)

    def on_start(self):
        opts = self.environment.parsed_options
        self.session = requests.Session()
        key = _api_key(opts)
        if key:
            self.session.headers["Authorization"] = f"Bearer {key}"
        self.base = self.host.rstrip("/")
        self.model = opts.model or self.session.get(f"{self.base}/v1/models", timeout=60).json()["data"][0]["id"]

    def on_stop(self):
        self.session.close()

    @task
    def chat(self):
        opts = self.environment.parsed_options
        body = {"model": self.model, "messages": _Workload.next(opts), "stream": True, "temperature": 0,
                "max_tokens": opts.max_tokens, "stream_options": {"include_usage": True}}
        if opts.ignore_eos:
            body["ignore_eos"] = True
        out, stats = Outcome(), None
        start = time.perf_counter()
        try:
            out, stats = self._stream(body, start)
        except (requests.RequestException, ValueError) as e:
            out.error = f"{type(e).__name__}: {e}"
        out.e2e = out.e2e or time.perf_counter() - start
        report(self.environment, "http", "POST", "/v1/chat/completions (stream)", out,
               stats.get("tokens_per_round") if stats else None)

    def _stream(self, body: dict, start: float) -> tuple[Outcome, dict | None]:
        out, chunks, usage_tokens, stats, finished = Outcome(), [], None, None, False
        with self.session.post(f"{self.base}/v1/chat/completions", json=body, stream=True, timeout=600) as resp:
            if resp.status_code != 200:
                out.error = f"HTTP {resp.status_code}: {resp.text[:200]}"
                return out, None
            buf = b""
            for data in resp.iter_content(chunk_size=None):   # as it arrives, not in fixed-size reads
                now = time.perf_counter()
                buf += data
                events_, _, buf = buf.rpartition(b"\n\n")
                for line in events_.splitlines():
                    if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                        continue
                    obj = json.loads(line[5:])
                    if "error" in obj and not obj.get("choices"):
                        err = obj["error"]
                        out.error = str(err.get("message", err) if isinstance(err, dict) else err)
                        return out, None
                    text, n = content_of(obj, chat=True)
                    if text:
                        chunks.append((now, text, n))
                    finished = finished or any(c.get("finish_reason") for c in obj.get("choices") or [])
                    if isinstance(obj.get("usage"), dict) and obj["usage"].get("completion_tokens") is not None:
                        usage_tokens = int(obj["usage"]["completion_tokens"])
                    if isinstance(obj.get("ssd"), dict):
                        stats = obj["ssd"]
            end = time.perf_counter()
        if not finished:
            out.error = "the stream ended without a finish_reason"
            return out, None
        return measured(out, start, end, chunks, usage_tokens), stats
