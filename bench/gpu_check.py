"""One GPU check of the CUDA path, sized for a single H200 in under 8 minutes, with no downloads.

1. correctness: random-initialised Qwen3 and Llama configs (a small one of each, and one of Qwen3-8B size)
   decode greedily on the CPU (fp32, the reference) and on CUDA (fp32 for the small ones; bf16 for all, eager
   and with the CUDA-graph decode step). fp32 CUDA must give the CPU's tokens; bf16 differences are reported.
2. bandwidth bound: device-to-device copy bandwidth, and the AR decode step of the Qwen3-8B-size model in bf16 at
   batch 1, 8 and 32 (eager and CUDA graph) against weight bytes / bandwidth.
3. speculation with every engine on its CUDA graphs (decode, verify and branch steps): the 8B-size target
   against a 2-layer draft (its own embedding, first two layers, norm and output layer), AR, SD (the draft in
   this process) and SSD (the draft in a second process sharing the GPU, ssd.wire messages over a pipe,
   speculating while the target verifies). The target's later layers are scaled by --deep-scales, which sets
   how often the draft agrees. fp32 first: SD and SSD must give AR's tokens on the device too; then bf16
   tokens/s at batch 1 for each scale and at batch 4 and 16 for the middle one.
Prints a short table last and writes gpu_check.json under $OUT (or --out). Exits 0 with a message when there
is no CUDA device. `--smoke` runs tiny configs (CPU allowed, no graphs) to check the script itself.
The parts live in bench/gpu/: models (configs, random weights), correctness (1), decode (2), spec and
two_process (3); this file holds the command line, the order of the parts and the table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.gpu.correctness import check_correctness  # noqa: E402
from bench.gpu.decode import copy_bandwidth, time_decode  # noqa: E402
from bench.gpu.models import CONFIGS, SMOKE, qwen3_8b, random_model  # noqa: E402
from bench.gpu.spec import round_parts, run_spec, sampling_check  # noqa: E402
from ssd.config import ModelConfig  # noqa: E402


def table(result: dict) -> str:
    lines = ["", "== gpu_check ==", f"device: {result['device']}   copy bandwidth: "
             f"{result.get('bandwidth_gb_s', '-')} GB/s   total {result.get('seconds', 0):.0f} s"]
    for r in result.get("correctness", []):
        lines.append(f"correct  {r['model']:<14} {r['variant']:<11} tokens {r['tokens_equal']}/{r['tokens']}  "
                     f"max|dlogit| {r['max_abs_logit_diff']:<9} ok={r['ok']}")
    for r in result.get("decode", []):
        lines.append(f"decode   B={r['batch']:<3} {r['mode']:<6} {r['step_ms']:>8.2f} ms  {r['tok_s']:>8.1f} tok/s  "
                     f"bound {r['bound_ms']:.2f} ms  ({100 * r['of_bound']:.0f}% of bound)")
    for r in result.get("spec", []):
        lines.append(f"spec     {r['dtype']:<8} scale {r['deep_scale']:<4} B={r['batch']:<3} K={r['k']}  tok/s AR "
                     f"{r['ar_tok_s']:>7}  SD {r['sd_tok_s']:>7}  SSD {r['ssd_tok_s']:>7}  accept SD "
                     f"{r['sd_acceptance']:.2f} SSD {r['ssd_acceptance']:.2f}  equal AR: SD {r['sd_equal_ar']} "
                     f"SSD {r['ssd_equal_ar']}/{r['tokens']}  ok={r['ok']}  SSD round ms (verify/wait/draft) "
                     f"{r['ssd_round_ms']['verify']}/{r['ssd_round_ms']['wait']}/{r['ssd_round_ms']['draft']}")
    for r in result.get("sampling", []):
        lines.append(f"sample   {r['mode']:<4} T=0.8 seeded, fp32: repeat equal {r['repeat_equal']}/{r['tokens']}, "
                     f"plain forward equal {r['plain_forward_equal']}/{r['tokens']}, accept {r['acceptance']:.2f}"
                     f"  ok={r['ok']}")
    for r in result.get("round_parts", []):
        lines.append(f"alone    B={r['batch']:<3} K={r['k']}  draft JIT step {r['jit_step_ms']} ms  draft speculate "
                     f"{r['speculate_ms']} ms  target verify {r['verify_ms']} ms")
    for e in result.get("errors", []):
        lines.append(f"ERROR    {e.splitlines()[-1]}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny configs, any device (checks the script itself)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench/results")))
    ap.add_argument("--layers", type=int, default=36, help="layers of the Qwen3-8B-size model")
    ap.add_argument("--steps", type=int, default=12, help="greedy decode steps per correctness check")
    ap.add_argument("--reps", type=int, default=20, help="timed decode steps per batch size")
    ap.add_argument("--deep-scales", default="0,0.03,0.06,0.12",
                    help="scales of the target's layers past the draft's two (the middle one for batch 4 and 16)")
    ap.add_argument("--ssd-tokens", type=int, default=48)
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device: nothing to check (exit 0)")
        return 0
    t_start = time.perf_counter()
    dev = args.device
    result: dict = {"device": torch.cuda.get_device_name() if dev == "cuda" else dev, "torch": torch.__version__,
                    "errors": []}
    try:
        import flash_attn  # noqa: F401
        result["flash_attn"] = True
    except ImportError:
        result["flash_attn"] = False
    big = qwen3_8b(2) if args.smoke else qwen3_8b(args.layers)
    if args.smoke:
        big = ModelConfig("qwen3", 512, 128, 256, 4, 4, 2, 32, max_position_embeddings=512, name="qwen3-8b-shape")
    configs = dict(SMOKE if args.smoke else CONFIGS)

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / ("gpu_check_smoke.json" if args.smoke else "gpu_check.json")

    def attempt(name, fn):
        try:
            result[name] = fn()
        except Exception:
            result["errors"].append(f"{name}: {traceback.format_exc()}")
            print(result["errors"][-1], flush=True)
        result["seconds"] = round(time.perf_counter() - t_start, 1)
        path.write_text(json.dumps(result, indent=1, default=str) + "\n")   # what is done survives a timeout

    attempt("correctness", lambda: check_correctness(configs, dev, args.steps, args.smoke))
    attempt("bandwidth_gb_s", lambda: round(copy_bandwidth(dev, (64 << 20) if args.smoke else (2 << 30)) / 1e9, 1))
    target = None
    try:
        target = random_model(big, dev, torch.bfloat16 if dev == "cuda" else torch.float32)
    except Exception:
        result["errors"].append(f"build: {traceback.format_exc()}")
    if target is not None and "bandwidth_gb_s" in result:
        bw = result["bandwidth_gb_s"] * 1e9
        attempt("decode", lambda t=target: time_decode(t, [1, 8, 32] if not args.smoke else [1, 4], bw,
                                                   128 if not args.smoke else 8,
                                                   args.reps if not args.smoke else 3, graphs=dev == "cuda"))
    del target
    if dev == "cuda":
        torch.cuda.empty_cache()
    tokens, plen = (args.ssd_tokens, 64) if not args.smoke else (8, 8)
    scales = [float(x) for x in args.deep_scales.split(",")]
    speed_runs = [(s, 1) for s in scales] + [(scales[len(scales) // 2], b) for b in (4, 16)]
    spec_rows: list = []
    result["spec"] = spec_rows
    # exactness on the device: fp32 SD and SSD against fp32 AR, graphs on; then bf16 speed
    graphs = "auto" if dev == "cuda" else "static"   # on the CPU (--smoke), the graphs' static steps run eagerly
    attempt("spec_fp32", lambda: spec_rows.extend(run_spec(big, dev, torch.float32, [(scales[len(scales) // 2], 4)],
                                                            tokens, 3, plen, graphs)))
    if dev == "cuda":
        attempt("spec_bf16", lambda: spec_rows.extend(run_spec(big, dev, torch.bfloat16, speed_runs, tokens, 3,
                                                                plen)))
    result.pop("spec_fp32", None), result.pop("spec_bf16", None)
    attempt("sampling", lambda: sampling_check(configs[next(iter(configs))], dev, graphs))
    attempt("round_parts", lambda: round_parts(big, dev, torch.bfloat16 if dev == "cuda" else torch.float32,
                                               [1, 4, 16] if not args.smoke else [1, 2], 3, plen,
                                               20 if not args.smoke else 3, graphs))
    # last: the 8B-size model against its CPU fp32 copy (the slowest part: a CPU forward over 8B weights)
    attempt("correctness_8b", lambda: check_correctness({big.name: big}, dev, min(args.steps, 6), args.smoke))
    result["correctness"] = result.get("correctness", []) + result.pop("correctness_8b", [])
    result["seconds"] = round(time.perf_counter() - t_start, 1)
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(table(result))
    print(f"wrote {path}")
    bad = [r for r in result.get("correctness", []) if r["ok"] is False]
    bad += [r for r in result.get("spec", []) + result.get("sampling", []) if r["ok"] is False]
    return 1 if result["errors"] or bad else 0


if __name__ == "__main__":
    sys.exit(main())
