"""`ssd bench serve`: a load benchmark for any OpenAI-compatible endpoint (TTFT, TPOT, ITL, E2E, goodput).

Contract:
- `add_parser(subparsers)` adds the `serve` sub-command; `run(args) -> int` runs it (0: every request succeeded,
  1: some failed, 2: nothing could be run). `python -m ssd.bench.serve ...` takes the same arguments.
- Requests go to `{base_url}/chat/completions` or `{base_url}/completions` with `stream: true` and
  `stream_options: {include_usage: true}`. Arrivals: `--request-rate R` requests/s with exponential gaps from
  `random.Random(seed)` (Poisson), or constant 1/R gaps with `--fixed-rate`; `inf` sends all at once;
  `--max-concurrency` caps requests in flight (a request waits for a slot after its arrival time).
- Per request: TTFT = time from sending to the first chunk with non-empty content (not to the headers);
  E2E = time to the end of the stream; TPOT = (E2E - TTFT) / (output tokens - 1).
  Token-count rule: the output token count is `usage.completion_tokens` when the server reports it, else the
  number of content chunks. Tokens per chunk: a chunk's `logprobs` content list length when present; otherwise
  the total is shared among the content chunks in proportion to their text length, each at least 1 (largest
  remainder), so a chunk with three tokens' worth of text counts 3. ITL: a chunk of k tokens arriving g seconds
  after the previous content chunk adds k values of g / k; the first chunk adds none (its first token is TTFT and any
  extra tokens in it have no measured gap).
- Goodput (`--goodput ttft:500 tpot:50 e2e:10000`, ms): successful requests meeting every given bound, divided
  by the benchmark's duration (first send to last finish), in requests/s.
- Speculation statistics (only when the server is ours: a chunk carries the `ssd` field or GET /metrics, at
  the base URL's host root, has `ssd_` series): tokens per round, per-token acceptance and cache hit rate, from
  before/after deltas of /metrics when present, else from the `ssd` fields of the final chunks.
- The result is printed as a table and written as JSON (`--out`, default bench/results/serve/<timestamp>.json).

This module sends and measures (the streamed requests, the run, the command line); what is sent and when is
`ssd.bench.workload`, what the figures are is `ssd.bench.report`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from ssd.bench.report import (Outcome, parse_metrics, speculation_from_fields, speculation_from_metrics, summarize,
                              table)
from ssd.bench.workload import load_dataset, parse_goodput, schedule


# ---- one request ----------------------------------------------------------------------------------
def split_tokens(chunks: list[tuple[float, str, int | None]], total: int | None) -> list[int]:
    """Tokens per content chunk ((time, text, logprob count or None)) under the module's rule."""
    if all(c[2] is not None for c in chunks):
        return [c[2] for c in chunks]
    if not total or total <= len(chunks):
        return [1] * len(chunks)
    lengths = [max(len(c[1]), 1) for c in chunks]
    shares = [total * n / sum(lengths) for n in lengths]
    counts = [max(1, int(s)) for s in shares]
    left = total - sum(counts)
    order = sorted(range(len(chunks)), key=lambda i: counts[i] - shares[i])
    for i in order[:max(left, 0)]:
        counts[i] += 1
    while left < 0:             # over the total (chunks raised to 1): take back from the most over-counted
        for i in reversed(order):
            if left < 0 and counts[i] > 1:
                counts[i] -= 1
                left += 1
    return counts


def content_of(obj: dict, chat: bool) -> tuple[str, int | None]:
    """A streamed chunk's text and, when it carries logprobs, its token count (else None)."""
    text, n = "", None
    for choice in obj.get("choices") or []:
        text += ((choice.get("delta") or {}).get("content") or "") if chat else (choice.get("text") or "")
        lp = choice.get("logprobs")
        if isinstance(lp, dict) and isinstance(lp.get("content"), list) and lp["content"]:
            n = (n or 0) + len(lp["content"])
        elif isinstance(lp, dict) and isinstance(lp.get("tokens"), list) and lp["tokens"]:
            n = (n or 0) + len(lp["tokens"])
    return text, n


async def request_one(session: aiohttp.ClientSession, url: str, body: dict, headers: dict, chat: bool) -> Outcome:
    out = Outcome()
    chunks: list[tuple[float, str, int | None]] = []
    usage_tokens = None
    start = time.perf_counter()
    try:
        async with session.post(url, json=body, headers=headers) as resp:
            if resp.status != 200:
                out.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return out
            buf = b""
            done = False
            async for data in resp.content.iter_any():
                now = time.perf_counter()
                buf += data
                while b"\n\n" in buf and not done:
                    event, buf = buf.split(b"\n\n", 1)
                    for line in event.splitlines():
                        if not line.startswith(b"data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            done = True
                            break
                        obj = json.loads(payload)
                        if "error" in obj and not obj.get("choices"):
                            err = obj["error"]
                            out.error = str(err.get("message", err) if isinstance(err, dict) else err)
                            return out
                        text, n = content_of(obj, chat)
                        if text:
                            chunks.append((now, text, n))
                        if isinstance(obj.get("usage"), dict) and obj["usage"].get("completion_tokens") is not None:
                            usage_tokens = int(obj["usage"]["completion_tokens"])
                        if isinstance(obj.get("ssd"), dict):
                            out.ssd = obj["ssd"]
            end = time.perf_counter()
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        out.error = f"{type(e).__name__}: {e}"
        return out
    return measured(out, start, end, chunks, usage_tokens)


def measured(out: Outcome, start: float, end: float, chunks: list[tuple[float, str, int | None]],
             usage_tokens: int | None) -> Outcome:
    """`out` with the module's figures of one finished stream (sent at `start`, ended at `end`, its content chunks
    as (arrival time, text, token count or None)): TTFT, E2E, output tokens and per-token ITL; an error when no
    chunk carried content. The locust suite (ssd/bench/locustfile.py) measures its streams with it too."""
    if not chunks:
        out.error = "the stream carried no content"
        return out
    counts = split_tokens(chunks, usage_tokens)
    out.output_tokens = usage_tokens if usage_tokens is not None else sum(counts)
    out.ttft, out.e2e, out.ok = chunks[0][0] - start, end - start, True
    for (prev, _, _), (t, _, _), k in zip(chunks, chunks[1:], counts[1:]):
        out.itl.extend([(t - prev) / k] * k)
    return out


async def fetch_metrics(session: aiohttp.ClientSession, base_url: str, headers: dict) -> dict[str, float] | None:
    parts = urlsplit(base_url)
    try:
        async with session.get(f"{parts.scheme}://{parts.netloc}/metrics", headers=headers) as resp:
            if resp.status != 200:
                return None
            m = parse_metrics(await resp.text())
            return m or None
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None


# ---- the run --------------------------------------------------------------------------------------
async def resolve_model(session: aiohttp.ClientSession, base_url: str, headers: dict) -> str:
    async with session.get(f"{base_url}/models", headers=headers) as resp:
        resp.raise_for_status()
        data = (await resp.json()).get("data") or []
    if not data:
        raise ValueError(f"{base_url}/models lists no model; pass --model")
    return data[0]["id"]


def _body(item: dict, args, model: str, chat: bool) -> dict:
    body = {"model": model, "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": int(item.get("max_tokens", args.max_tokens)), "temperature": args.temperature}
    if args.seed is not None:
        body["seed"] = args.seed
    if args.ignore_eos:
        body["ignore_eos"] = True
    if chat:
        body["messages"] = item.get("messages") or [{"role": "user", "content": item["prompt"]}]
    else:
        body["prompt"] = item["prompt"] if "prompt" in item else \
            "\n".join(f"{m['role']}: {m['content']}" for m in item["messages"])
    return body


async def benchmark(args, progress: bool = True) -> dict:
    base_url = args.base_url.rstrip("/")
    chat = args.endpoint == "chat"
    key = args.api_key or os.environ.get("OPENAI_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    slo = parse_goodput(args.goodput)
    items = load_dataset(args.dataset, args.num_prompts, args.seed or 0)
    offsets = schedule(len(items), args.request_rate, args.seed or 0, args.fixed_rate)
    limit = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        model = args.model or await resolve_model(session, base_url, headers)
        url = f"{base_url}/{'chat/completions' if chat else 'completions'}"
        before = await fetch_metrics(session, base_url, headers)
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=len(items), file=sys.stderr, desc="requests", leave=False)
        t0 = time.perf_counter()

        async def one(offset: float, item: dict) -> Outcome:
            await asyncio.sleep(max(0.0, t0 + offset - time.perf_counter()))  # the arrival schedule, not a poll
            if limit is None:
                o = await request_one(session, url, _body(item, args, model, chat), headers, chat)
            else:
                async with limit:
                    o = await request_one(session, url, _body(item, args, model, chat), headers, chat)
            if bar is not None:
                bar.update(1)
            return o
        outcomes = await asyncio.gather(*(one(off, it) for off, it in zip(offsets, items)))
        duration = time.perf_counter() - t0
        if bar is not None:
            bar.close()
        after = await fetch_metrics(session, base_url, headers) if before is not None else None
    result = {"base_url": base_url, "model": model, "endpoint": args.endpoint, "dataset": args.dataset,
              "num_prompts": len(items), "request_rate": args.request_rate, "fixed_rate": args.fixed_rate,
              "max_concurrency": args.max_concurrency, "max_tokens": args.max_tokens,
              "temperature": args.temperature, "seed": args.seed, "ignore_eos": args.ignore_eos,
              "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **summarize(outcomes, duration, slo)}
    fields = [o.ssd for o in outcomes if o.ok and o.ssd]
    if before is not None and after is not None:
        result["speculation"] = speculation_from_metrics(before, after)
    elif fields:
        result["speculation"] = speculation_from_fields(fields)
    else:
        result["speculation"] = None
    result["requests"] = [{k: v for k, v in asdict(o).items() if k != "itl"} for o in outcomes]
    return result


# ---- command line ---------------------------------------------------------------------------------
def _rate(s: str) -> float:
    return float("inf") if s.lower() in ("inf", "infinity") else float(s)


def configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--model", default=None, help="default: the first of /v1/models")
    p.add_argument("--api-key", default=None, help="default: $OPENAI_API_KEY")
    p.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    p.add_argument("--dataset", default="builtin:chat", help="FILE.jsonl or builtin:chat|code|math")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--request-rate", type=_rate, default=float("inf"), help="requests/s (inf: all at once)")
    p.add_argument("--fixed-rate", action="store_true", help="constant gaps instead of Poisson arrivals")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--goodput", nargs="*", default=None, metavar="KEY:MS", help="SLO, e.g. ttft:500 tpot:50")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request limit, s")
    p.add_argument("--out", type=Path, default=None, help="default: bench/results/serve/<timestamp>.json")
    p.add_argument("--no-progress", action="store_true")
    return p


def add_parser(subparsers) -> argparse.ArgumentParser:
    return configure(subparsers.add_parser(
        "serve", help="load benchmark of an OpenAI-compatible endpoint (TTFT, TPOT, ITL, E2E, goodput)"))


def run(args) -> int:
    try:
        result = asyncio.run(benchmark(args, progress=not args.no_progress))
    except (ValueError, OSError, aiohttp.ClientError) as e:
        print(f"ssd bench serve: {e}", file=sys.stderr)
        return 2
    print(table(result))
    out = args.out or Path("bench/results/serve") / f"{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written {out}", file=sys.stderr)
    return 0 if result["failed"] == 0 else 1


def main(argv: list[str] | None = None) -> int:
    return run(configure(argparse.ArgumentParser(prog="ssd bench serve", description=__doc__.split("\n")[0]))
               .parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
