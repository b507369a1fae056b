"""`ssd bench serve`: a load benchmark for any OpenAI-compatible endpoint (TTFT, TPOT, ITL, E2E, goodput).

Contract:
- `add_parser(subparsers)` adds the `serve` sub-command; `run(args) -> int` runs it (0: every request succeeded,
  1: some failed, 2: nothing could be run). `python -m ssd.bench_serve ...` takes the same arguments.
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
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

BUILTIN = {
    "chat": [
        "What is a good way to start learning to play the guitar?",
        "Explain the difference between weather and climate to a ten-year-old.",
        "Write a short thank-you note to a neighbour who watered my plants.",
        "Give me three ideas for a rainy Sunday afternoon.",
        "Why do cats purr?",
        "Summarise the plot of Romeo and Juliet in four sentences.",
        "How can I improve my sleep without medication?",
        "Suggest a name for a small bakery that specialises in sourdough.",
        "What should I pack for a weekend hiking trip in the mountains?",
        "Describe the taste of a ripe mango to someone who has never had one.",
        "How do I politely decline a meeting invitation?",
        "Tell me a fun fact about octopuses.",
        "What are the pros and cons of working from home?",
        "Write a haiku about the first snow of winter.",
        "How do vaccines train the immune system?",
        "Recommend a routine for a beginner who wants to start running.",
        "What is the history of the bicycle in a few sentences?",
        "Explain why the sky is blue.",
        "Give me tips for keeping a houseplant alive.",
        "Draft a two-line bio for a freelance photographer.",
        "What makes a good cup of tea?",
        "How do I explain a gap in my CV at a job interview?",
    ],
    "code": [
        "Write a Python function that reverses a linked list.",
        "Explain what a closure is in JavaScript with an example.",
        "Write a SQL query that finds the second highest salary in a table `employees`.",
        "How do I read a CSV file with pandas and drop rows with missing values?",
        "Write a bash one-liner that counts the lines of all .py files in a folder.",
        "What is the difference between a process and a thread?",
        "Implement binary search in C.",
        "Write a Python generator that yields the Fibonacci numbers.",
        "Explain Big-O notation with the example of bubble sort.",
        "Write a Rust function that returns the largest element of a slice.",
        "How does garbage collection work in Java?",
        "Write a regular expression that matches an IPv4 address.",
        "Refactor this loop into a list comprehension: for x in xs: if x > 0: out.append(x * 2)",
        "What does `git rebase -i` do?",
        "Write a Go HTTP handler that returns JSON {\"ok\": true}.",
        "Explain the difference between `==` and `is` in Python.",
        "Write a function that checks whether a string is a palindrome, ignoring case.",
        "How do I make an asynchronous HTTP request in Python?",
        "Write a Dockerfile for a small Flask app.",
        "What is a race condition and how can a mutex prevent it?",
        "Write a TypeScript interface for a user with a name, an email and an optional age.",
    ],
    "math": [
        "What is 17 times 23? Show your working.",
        "Solve for x: 3x + 7 = 22.",
        "What is the derivative of x^3 - 4x + 1?",
        "A train travels 180 km in 2.5 hours. What is its average speed?",
        "Is 221 a prime number? Explain.",
        "What is the sum of the integers from 1 to 100?",
        "Convert 0.375 to a fraction in lowest terms.",
        "What is the area of a circle with radius 4 cm?",
        "Find the greatest common divisor of 84 and 126.",
        "If a shirt costs 40 euros after a 20% discount, what was the original price?",
        "What is the probability of rolling two sixes with two dice?",
        "Integrate 2x with respect to x.",
        "How many ways can 5 books be arranged on a shelf?",
        "What is the square root of 1764?",
        "Simplify (x^2 - 9) / (x - 3).",
        "A rectangle has a perimeter of 30 and a width of 5. What is its length?",
        "What is 15% of 360?",
        "Solve the system: x + y = 10, x - y = 4.",
        "What is log base 2 of 256?",
        "Explain why the angles of a triangle add up to 180 degrees.",
        "What is the next number in the sequence 2, 6, 12, 20, 30?",
    ],
}
GOODPUT_KEYS = ("ttft", "tpot", "e2e")
N_ERRORS_SHOWN = 3


# ---- inputs ---------------------------------------------------------------------------------------
def load_dataset(spec: str, num: int, seed: int) -> list[dict]:
    """`num` request items ({"prompt"} or {"messages"}, optional "max_tokens"), cycling through the set in a
    seeded shuffle. `spec`: "builtin:chat|code|math" or a JSONL file."""
    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        if name not in BUILTIN:
            raise ValueError(f"unknown built-in dataset {name!r}; choose from {', '.join(BUILTIN)}")
        items = [{"prompt": p} for p in BUILTIN[name]]
    else:
        items = []
        for n, line in enumerate(Path(spec).read_text().splitlines(), 1):
            if not line.strip():
                continue
            obj = json.loads(line)
            if not isinstance(obj, dict) or not ("prompt" in obj or "messages" in obj):
                raise ValueError(f"{spec}:{n}: each line must be an object with `prompt` or `messages`")
            items.append({k: obj[k] for k in ("prompt", "messages", "max_tokens") if k in obj})
        if not items:
            raise ValueError(f"{spec}: no prompts")
    order = items[:]
    random.Random(seed).shuffle(order)
    return [order[i % len(order)] for i in range(num)]


def schedule(n: int, rate: float, seed: int, fixed: bool = False) -> list[float]:
    """Send offsets (s from the start) of `n` requests: exponential gaps of mean 1/rate from a seeded RNG
    (Poisson arrivals), constant 1/rate gaps with `fixed`, all 0 for an infinite rate. The first is at 0."""
    if math.isinf(rate):
        return [0.0] * n
    if rate <= 0:
        raise ValueError("the request rate must be > 0 (or inf)")
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(n):
        out.append(t)
        t += 1.0 / rate if fixed else rng.expovariate(rate)
    return out


def parse_goodput(specs: list[str] | None) -> dict[str, float]:
    """["ttft:500", "tpot:50"] -> {"ttft": 500.0, "tpot": 50.0} (ms)."""
    out = {}
    for s in specs or []:
        key, _, value = s.partition(":")
        if key not in GOODPUT_KEYS or not value:
            raise ValueError(f"bad --goodput {s!r}: use KEY:MS with KEY one of {', '.join(GOODPUT_KEYS)}")
        out[key] = float(value)
    return out


# ---- one request ----------------------------------------------------------------------------------
@dataclass
class Outcome:
    ok: bool = False
    error: str = ""
    ttft: float = 0.0                 # s
    e2e: float = 0.0                  # s
    output_tokens: int = 0
    itl: list[float] = field(default_factory=list)
    ssd: dict | None = None           # the final chunk's `ssd` field, if any

    @property
    def tpot(self) -> float | None:
        return (self.e2e - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


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


def _content(obj: dict, chat: bool) -> tuple[str, int | None]:
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
                        text, n = _content(obj, chat)
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
    if not chunks:
        out.error = "the stream carried no content"
        return out
    counts = split_tokens(chunks, usage_tokens)
    out.output_tokens = usage_tokens if usage_tokens is not None else sum(counts)
    out.ttft, out.e2e, out.ok = chunks[0][0] - start, end - start, True
    for (prev, _, _), (t, _, _), k in zip(chunks, chunks[1:], counts[1:]):
        out.itl.extend([(t - prev) / k] * k)
    return out


# ---- /metrics -------------------------------------------------------------------------------------
_SAMPLE = re.compile(r'^(ssd_[a-zA-Z0-9_]+)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)')


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {"name{labels}": value} for ssd_* series only."""
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def _sum(metrics: dict[str, float], name: str, label: str | None = None) -> float:
    total = 0.0
    for key, v in metrics.items():
        base = key.split("{", 1)[0]
        if base == name and (label is None or label in key):
            total += v
    return total


def speculation_from_metrics(before: dict[str, float], after: dict[str, float]) -> dict:
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    rounds = _sum(d, "ssd_tokens_per_round_count")
    drafts = _sum(d, "ssd_spec_draft_tokens_total")
    lookups = _sum(d, "ssd_cache_lookups_total") - _sum(d, "ssd_cache_lookups_total", 'result="forced"')
    hits = _sum(d, "ssd_cache_lookups_total", 'result="hit"')
    return {"source": "metrics", "rounds": int(rounds),
            "tokens_per_round": _sum(d, "ssd_tokens_per_round_sum") / rounds if rounds else None,
            "acceptance": _sum(d, "ssd_spec_accepted_tokens_total") / drafts if drafts else None,
            "cache_hit_rate": hits / lookups if lookups else None, "cache_lookups": int(lookups)}


def speculation_from_fields(fields: list[dict]) -> dict:
    rounds = sum(f.get("rounds", 0) for f in fields)
    committed = sum(f.get("rounds", 0) * f.get("tokens_per_round", 0.0) for f in fields)
    hits = sum(f.get("cache_hits", 0) for f in fields)
    lookups = hits + sum(f.get("cache_misses", 0) for f in fields)
    acc = [a for f in fields for a in f.get("acceptance_per_position") or []]
    return {"source": "ssd field", "rounds": rounds, "tokens_per_round": committed / rounds if rounds else None,
            "acceptance": sum(acc) / len(acc) if acc else None,
            "cache_hit_rate": hits / lookups if lookups else None, "cache_lookups": lookups}


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
def _stats(values: list[float], scale: float = 1000.0) -> dict:
    if not values:
        return {"mean": None, "median": None, "p90": None, "p99": None}
    v = sorted(values)

    def pct(p: float) -> float:
        i = (len(v) - 1) * p / 100
        lo, hi = math.floor(i), math.ceil(i)
        return (v[lo] + (v[hi] - v[lo]) * (i - lo)) * scale
    return {"mean": sum(v) / len(v) * scale, "median": pct(50), "p90": pct(90), "p99": pct(99)}


def meets(o: Outcome, slo: dict[str, float]) -> bool:
    if not o.ok:
        return False
    got = {"ttft": o.ttft * 1000, "e2e": o.e2e * 1000, "tpot": (o.tpot or 0.0) * 1000}
    return all(got[k] <= bound for k, bound in slo.items())


def summarize(outcomes: list[Outcome], duration: float, slo: dict[str, float]) -> dict:
    ok = [o for o in outcomes if o.ok]
    errors = [o.error for o in outcomes if not o.ok]
    out_tokens = sum(o.output_tokens for o in ok)
    return {
        "completed": len(ok), "failed": len(errors), "errors": errors[:N_ERRORS_SHOWN], "duration_s": duration,
        "output_tokens": out_tokens,
        "request_throughput": len(ok) / duration if duration > 0 else None,
        "output_throughput": out_tokens / duration if duration > 0 else None,
        "ttft_ms": _stats([o.ttft for o in ok]), "tpot_ms": _stats([o.tpot for o in ok if o.tpot is not None]),
        "itl_ms": _stats([g for o in ok for g in o.itl]), "e2e_ms": _stats([o.e2e for o in ok]),
        "goodput": {"slo_ms": slo, "met": sum(meets(o, slo) for o in ok),
                    "requests_per_s": sum(meets(o, slo) for o in ok) / duration if duration > 0 else None}
        if slo else None,
    }


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


def _fmt(v, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def table(r: dict) -> str:
    lines = [f"{'model':<28}{r['model']}", f"{'requests ok / failed':<28}{r['completed']} / {r['failed']}",
             f"{'duration (s)':<28}{_fmt(r['duration_s'])}",
             f"{'request throughput (req/s)':<28}{_fmt(r['request_throughput'])}",
             f"{'output throughput (tok/s)':<28}{_fmt(r['output_throughput'])}"]
    if r.get("goodput"):
        slo = " ".join(f"{k}<={v:g}ms" for k, v in r["goodput"]["slo_ms"].items())
        lines.append(f"{'goodput (req/s)':<28}{_fmt(r['goodput']['requests_per_s'])}  ({slo}, "
                     f"{r['goodput']['met']} met)")
    lines += ["", f"{'metric (ms)':<12}{'mean':>10}{'median':>10}{'p90':>10}{'p99':>10}"]
    for name in ("ttft", "tpot", "itl", "e2e"):
        s = r[f"{name}_ms"]
        lines.append(f"{name.upper():<12}" + "".join(f"{_fmt(s[k]):>10}" for k in ("mean", "median", "p90", "p99")))
    spec = r.get("speculation")
    if spec:
        lines += ["", f"speculation (from {spec['source']}): tokens/round {_fmt(spec['tokens_per_round'])}, "
                  f"acceptance {_fmt(spec['acceptance'], 3)}, cache hit rate {_fmt(spec['cache_hit_rate'], 3)} "
                  f"over {spec['cache_lookups']} lookups, {spec['rounds']} rounds"]
    for e in r["errors"]:
        lines.append(f"error: {e}")
    return "\n".join(lines)


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
