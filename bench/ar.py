"""AR baseline benchmark: our engine against transformers' `generate` on SmolLM2-135M, in one run.

Batch 1 and 8, 128 new tokens per sequence (EOS ignored), greedy, fp32, the same prompts and thread count for
both. Tokens/s counts generated tokens over wall time including prefill. Writes bench/results/ar.json.

    python bench/ar.py [--threads N] [--new-tokens 128] [--repeats 2]
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
from transformers import LlamaForCausalLM  # noqa: E402

from ssd.engine.ar import AREngine  # noqa: E402
from ssd.models.loader import load_model  # noqa: E402
from ssd.models.prepare import prepare_default_models  # noqa: E402
from ssd.paths import default_models_dir  # noqa: E402
from ssd.sampling import SamplingParams  # noqa: E402
from ssd.tokenizer import Tokenizer  # noqa: E402

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "What is the capital of France, and what is it famous for?",
    "Explain in simple terms why the sky is blue.",
    "Solve: a train travels 120 km in 1.5 hours. What is its average speed?",
    "Give three tips for writing clean code.",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "Write a haiku about autumn leaves.",
    "List the planets of the solar system in order from the sun.",
]
RESULTS = Path(__file__).parent / "results" / "ar.json"


def ours(model, prompts, new_tokens):
    engine = AREngine(model, max_batch=len(prompts))
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    seqs = engine.generate(prompts, params)
    dt = time.perf_counter() - t0
    return sum(len(s.output) for s in seqs) / dt, [s.output for s in seqs]


def transformers_generate(model, prompts, new_tokens, pad_id):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=pad_id)
    dt = time.perf_counter() - t0
    gen = out[:, width:]
    return gen.numel() / dt, gen.tolist()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2, help="best of N per engine and batch size")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    folder = prepare_default_models(default_models_dir(), log=lambda *a: None)["target"]
    tok = Tokenizer.from_folder(folder)
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p in PROMPTS]
    mine = load_model(folder)
    ref = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ref.generation_config.eos_token_id = None  # like ignore_eos: never stop early, never suppress EOS
    ours(mine, prompts[:1], 8)  # warm-up both
    transformers_generate(ref, prompts[:1], 8, 2)
    rows = {}
    for bs in (1, 8):
        batch = prompts[:bs]
        best_ours = best_hf = 0.0
        for _ in range(args.repeats):  # interleaved, so machine noise hits both alike
            rate, out_ours = ours(mine, batch, args.new_tokens)
            best_ours = max(best_ours, rate)
            rate, out_hf = transformers_generate(ref, batch, args.new_tokens, 2)
            best_hf = max(best_hf, rate)
        same = sum(a == b for a, b in zip(out_ours, out_hf))
        rows[str(bs)] = {"ours_tok_s": round(best_ours, 2), "transformers_tok_s": round(best_hf, 2),
                         "ratio": round(best_ours / best_hf, 3), "identical_outputs": f"{same}/{bs}"}
        print(f"batch {bs}: ours {best_ours:.1f} tok/s, transformers {best_hf:.1f} tok/s, "
              f"ratio {best_ours / best_hf:.2f}, identical outputs {same}/{bs}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "model": "SmolLM2-135M-Instruct (fp32)", "new_tokens": args.new_tokens, "threads": args.threads,
        "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
        "date": time.strftime("%Y-%m-%d"), "batch": rows}, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
