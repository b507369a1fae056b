"""Seed-parity benchmark: prefix caching's effect on TTFT, and target throughput at TP=1 and TP=2.

1. TTFT: 8 requests that share a 512-token system prompt, arriving one after another at the target
   (SmolLM2-135M, fp32); each prefill is timed alone, with prefix caching on and off. The first request
   computes the system prompt in both cases; with the cache the other 7 compute only their own tokens.
2. Target tokens/s: greedy AR decoding, batch 8, 64 new tokens, with the target at TP=1 (1 and 2 threads) and
   TP=2 over gloo (two processes, one thread each), the same 2 cores in all three.

    python bench/parity.py [--new-tokens 64] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from ssd.engine.ar import AREngine  # noqa: E402
from ssd.engine.target import TargetWorker  # noqa: E402
from ssd.models.loader import load_model  # noqa: E402
from ssd.models.parallel import TPGroup, free_port  # noqa: E402
from ssd.models.prepare import prepare_default_models  # noqa: E402
from ssd.paths import default_models_dir  # noqa: E402
from ssd.sampling import SamplingParams  # noqa: E402
from ssd.tokenizer import Tokenizer  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "parity.json"
SYSTEM_TOKENS = 512
QUESTIONS = ["What is the capital of France?", "Write a haiku about autumn.", "What is 17 times 23?",
             "Why do cats purr?", "Explain photosynthesis briefly.", "Give three tips for clean code.",
             "How do I make tea?", "Name the planets in order."]


def shared_prompt_requests(tok: Tokenizer) -> list[list[int]]:
    filler = ("You are a careful, friendly assistant for a software company. Answer precisely, cite the "
              "relevant policy section when asked, keep answers short, and never invent facts. ") * 40
    system = tok.encode(filler)[:SYSTEM_TOKENS]
    return [system + tok.encode(tok.apply_chat_template([{"role": "user", "content": q}])) for q in QUESTIONS]


def ttft(model, prompts, prefix_caching: bool) -> dict:
    worker = TargetWorker(model, len(prompts), 1024, prefix_caching=prefix_caching)
    times = []
    for i, p in enumerate(prompts):
        t0 = time.perf_counter()
        worker.prefill([(i, p, SamplingParams())])
        times.append(time.perf_counter() - t0)
    return {"ttft_s": times, "mean_ttft_s": sum(times) / len(times), "mean_ttft_after_first_s":
            sum(times[1:]) / (len(times) - 1), "prefill_tokens": worker.prefill_tokens,
            "prompt_tokens": sum(len(p) for p in prompts), "prefix_hit_rate": worker.prefix_stats.hit_rate}


def decode_rate(model, prompts, new_tokens) -> float:
    engine = AREngine(model, max_batch=len(prompts), max_len=1024)
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    seqs = engine.generate(prompts, params)
    return sum(len(s.output) for s in seqs) / (time.perf_counter() - t0), [s.output for s in seqs]


def tp_rank(rank, size, port, folder, prompts, new_tokens, out):
    torch.set_num_threads(1)
    tp = TPGroup.init(rank, size, f"tcp://127.0.0.1:{port}", backend="gloo")
    model = load_model(folder, tp=tp)
    decode_rate(model, prompts[:2], 4)  # warm-up
    rate, outputs = decode_rate(model, prompts, new_tokens)
    if rank == 0:
        Path(out).write_text(json.dumps({"rate": rate, "outputs": outputs}))
    torch.distributed.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    folder = prepare_default_models(default_models_dir(), log=print)["target"]
    tok = Tokenizer.from_folder(folder)
    model = load_model(folder)
    prompts = shared_prompt_requests(tok)
    torch.set_num_threads(args.threads)
    ttft(model, prompts[:2], False)  # warm-up
    results = {"model": folder.name, "threads": args.threads, "machine": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "system_prompt_tokens": SYSTEM_TOKENS,
               "ttft": {"prefix_cache_off": ttft(model, prompts, False), "prefix_cache_on": ttft(model, prompts, True)}}
    short = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}])) for q in QUESTIONS]
    rates = {}
    for threads in (1, args.threads):
        torch.set_num_threads(threads)
        decode_rate(model, short[:2], 4)
        rates[f"tp1_threads{threads}"], ref = decode_rate(model, short, args.new_tokens)
    out = RESULTS.parent / "parity_tp2.json"
    mp.spawn(tp_rank, args=(2, free_port(), str(folder), short, args.new_tokens, str(out)), nprocs=2, join=True)
    tp2 = json.loads(out.read_text())
    out.unlink()
    rates["tp2_threads1_each"] = tp2["rate"]
    results["target_tokens_per_s"] = {"batch": len(short), "new_tokens": args.new_tokens, **rates,
                                      "tp2_output_identical": tp2["outputs"] == ref}
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
