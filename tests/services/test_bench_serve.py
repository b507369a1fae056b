"""`ssd bench serve` (ssd/bench/serve.py): measured latencies against a fake OpenAI server that streams known tokens
with known delays, failure counting, goodput, the Poisson schedule, and one run against the real stack."""
import asyncio
import json
import statistics
from pathlib import Path

from aiohttp import web

from ssd.bench import serve as bs
from ssd.bench.workload import BUILTIN
from tests.fake_openai import CHUNKS, FIRST_DELAY, N_TOKENS, fake_app


def args_for(base_url: str, dataset: str, n: int, **kw):
    argv = ["--base-url", base_url, "--dataset", dataset, "--num-prompts", str(n), "--no-progress"]
    for k, v in kw.items():
        vals = [] if v is True else [str(x) for x in v] if isinstance(v, list) else [str(v)]
        argv += [f"--{k.replace('_', '-')}", *vals]
    return bs.configure(__import__("argparse").ArgumentParser()).parse_args(argv)


def run_fake(tmp_path, prompts, with_ssd=False, **kw) -> dict:
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))

    async def main():
        runner = web.AppRunner(fake_app(with_ssd))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            return await bs.benchmark(args_for(f"http://127.0.0.1:{port}/v1", str(data), len(prompts), **kw),
                                      progress=False)
        finally:
            await runner.cleanup()
    return asyncio.run(main())


def test_latencies_against_known_delays(tmp_path):
    r = run_fake(tmp_path, ["a", "b", "c", "d"], goodput=["ttft:5000"])
    assert r["completed"] == 4 and r["failed"] == 0 and r["model"] == "fake-model"
    for req in r["requests"]:
        assert req["output_tokens"] == N_TOKENS
        # TTFT is to the first content chunk, not to the headers/role chunk (sent at once)
        assert FIRST_DELAY * 0.9 <= req["ttft"] <= FIRST_DELAY + 0.5
        assert 0.4 * 0.9 <= req["e2e"] - req["ttft"] <= 0.4 + 0.6
    assert r["output_tokens"] == 4 * N_TOKENS
    # TPOT = (E2E - TTFT) / (tokens - 1) = 0.4 / 5 = 80 ms
    assert 70 <= r["tpot_ms"]["median"] <= 200
    assert r["goodput"]["met"] == 4 and r["speculation"] is None


def test_multi_token_chunk_split_evenly(tmp_path):
    prompts = ["a"]
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "a"}) + "\n")
    # one request, so its ITLs can be read in order: 0.1, then the 0.2 s gap split over 3 tokens, then 0.1
    captured = {}
    orig = bs.request_one

    async def spy(*a, **k):
        o = await orig(*a, **k)
        captured["itl"] = o.itl
        return o
    bs.request_one = spy
    try:
        run_fake(tmp_path, prompts)
    finally:
        bs.request_one = orig
    itl = captured["itl"]
    assert len(itl) == N_TOKENS - 1
    assert itl[1] == itl[2] == itl[3]
    assert 0.2 / 3 * 0.8 <= itl[1] <= 0.2 / 3 + 0.2
    assert 0.09 <= itl[0] <= 0.4 and 0.09 <= itl[4] <= 0.4


def test_split_tokens_rule():
    chunks = [(0.0, "x", None), (1.0, "xxx", None), (2.0, "x", None)]
    assert bs.split_tokens(chunks, 5) == [1, 3, 1]
    assert bs.split_tokens(chunks, None) == [1, 1, 1]
    assert bs.split_tokens([(0.0, "ab", 2), (1.0, "c", 1)], 99) == [2, 1]


def test_failures_counted_with_text(tmp_path):
    r = run_fake(tmp_path, ["a", "fail", "midfail", "b"])
    assert r["completed"] == 2 and r["failed"] == 2
    assert any("HTTP 500" in e and "deliberate failure" in e for e in r["errors"])
    assert any("died mid-stream" in e for e in r["errors"])
    assert r["output_tokens"] == 2 * N_TOKENS


def test_goodput_as_defined():
    outs = [bs.Outcome(ok=True, ttft=0.1, e2e=1.0, output_tokens=11),    # tpot 90 ms
            bs.Outcome(ok=True, ttft=0.6, e2e=1.0, output_tokens=11),    # ttft too slow
            bs.Outcome(ok=True, ttft=0.1, e2e=0.5, output_tokens=11),    # tpot 40 ms
            bs.Outcome(ok=False, error="x")]
    s = bs.summarize(outs, 2.0, {"ttft": 500, "tpot": 100})
    assert s["goodput"]["met"] == 2 and s["goodput"]["requests_per_s"] == 1.0
    s = bs.summarize(outs, 2.0, {"ttft": 500, "tpot": 50})
    assert s["goodput"]["met"] == 1 and s["goodput"]["requests_per_s"] == 0.5
    assert bs.summarize(outs, 2.0, {})["goodput"] is None


def test_poisson_schedule():
    offsets = bs.schedule(2000, 4.0, seed=7)
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert len(offsets) == 2000 and offsets[0] == 0.0
    assert abs(statistics.mean(gaps) - 0.25) < 0.025
    assert statistics.stdev(gaps) > 0.15                      # exponential, not constant
    assert offsets == bs.schedule(2000, 4.0, seed=7)          # seeded
    assert offsets != bs.schedule(2000, 4.0, seed=8)
    fixed = bs.schedule(5, 4.0, seed=7, fixed=True)
    assert fixed == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert bs.schedule(3, float("inf"), seed=1) == [0.0, 0.0, 0.0]


def test_ssd_field_gives_speculation(tmp_path):
    r = run_fake(tmp_path, ["a", "b"], with_ssd=True)
    spec = r["speculation"]
    assert spec["source"] == "ssd field" and abs(spec["tokens_per_round"] - 5 / 3) < 1e-6
    assert abs(spec["cache_hit_rate"] - 2 / 3) < 1e-6
    assert "speculation" in bs.table(r)


def test_builtin_datasets():
    for name in ("chat", "code", "math"):
        assert len(set(BUILTIN[name])) >= 20
        assert len(bs.load_dataset(f"builtin:{name}", 50, seed=0)) == 50


def test_against_real_stack(stack, tmp_path):
    out = tmp_path / "r.json"
    args = args_for(f"http://{stack.http_address}/v1", "builtin:chat", 8, max_tokens=16, request_rate=4,
                    ignore_eos=True, out=out)
    assert bs.run(args) == 0
    r = json.loads(out.read_text())
    assert r["completed"] == 8 and r["failed"] == 0
    assert all(q["output_tokens"] == 16 for q in r["requests"])
    spec = r["speculation"]
    assert spec is not None and spec["source"] == "metrics"
    assert spec["tokens_per_round"] > 1
    assert r["ttft_ms"]["median"] > 0 and r["itl_ms"]["mean"] > 0
