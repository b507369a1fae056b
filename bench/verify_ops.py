"""Where a verify's extra rows go at batch 1: the target's verify of one sequence at 1 and 4 positions (K = 0 and
K = 3), by operator (torch.profiler, self CPU time per verify), and attention alone at 1, 4 and 8 query rows in the
forms that compute the same thing (SDPA with the batch's mask, as `ssd.models.attention` calls it; SDPA's math
backend; the product written out with the query heads grouped onto their key-value head; SDPA on those grouped
rows). One process, one thread, the default pair, context 200 tokens.

    PYTHONPATH=. python bench/verify_ops.py [--reps 20] [--out bench/results/verify_ops.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from ssd.engine.target import TargetWorker  # noqa: E402
from ssd.models.loader import load_model  # noqa: E402
from ssd.models.prepare import prepare_default_models  # noqa: E402
from ssd.sampling import SamplingParams  # noqa: E402
from ssd.wire import VerifyItem  # noqa: E402

GROUPS = {"linear": ("mkldnn::_linear_pointwise", "aten::linear", "aten::addmm", "aten::mm"),
          "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu",),
          "kv gather": ("aten::index_select",)}


def by_operator(worker, rows: int, reps: int, rng: random.Random) -> dict[str, float]:
    """Self CPU ms per verify of `rows` positions, grouped (the rest summed as "other")."""
    def one():
        worker.verify([VerifyItem(0, [rng.randrange(100, 20000) for _ in range(rows - 1)], None)], features=True)
    for _ in range(5):
        one()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            one()
    out = {name: 0.0 for name in (*GROUPS, "other")}
    for ev in prof.key_averages():
        group = next((g for g, names in GROUPS.items() if ev.key in names), "other")
        out[group] += ev.self_cpu_time_total / 1e3 / reps
    out["total"] = sum(out.values())
    return {k: round(v, 3) for k, v in out.items()}


def attention_forms(heads: int, kv_heads: int, head_dim: int, context: int, reps: int) -> dict:
    def sdpa(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    def math(q, k, v, mask):
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    def grouped(q, k, v, mask):   # the query heads of one key-value head as rows of one product
        b, h, t, d = q.shape
        r = h // k.shape[1]
        scores = torch.matmul(q.reshape(b, k.shape[1], r * t, d), k.transpose(-1, -2)) * d ** -0.5
        scores = scores.view(b, k.shape[1], r, t, -1).masked_fill(~mask[:, :, None], float("-inf"))
        return torch.matmul(torch.softmax(scores, -1).view(b, k.shape[1], r * t, -1), v).view(b, h, t, d)

    def grouped_sdpa(q, k, v, mask):
        b, h, t, d = q.shape
        r = h // k.shape[1]
        rows_mask = mask.expand(b, 1, t, mask.shape[-1]).repeat(1, 1, r, 1)
        return F.scaled_dot_product_attention(q.reshape(b, k.shape[1], r * t, d), k, v,
                                              attn_mask=rows_mask).view(b, h, t, d)

    out = {}
    for t in (1, 4, 8):
        q = torch.randn(1, heads, t, head_dim)
        k, v = torch.randn(1, kv_heads, context, head_dim), torch.randn(1, kv_heads, context, head_dim)
        pos = torch.arange(context - t, context)
        mask = (torch.arange(context)[None, :] <= pos[:, None])[None, None]
        ref = sdpa(q, k, v, mask)
        row = {}
        for name, fn in (("sdpa", sdpa), ("math", math), ("grouped", grouped), ("grouped_sdpa", grouped_sdpa)):
            diff = (fn(q, k, v, mask) - ref).abs().max().item()
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn(q, k, v, mask)
                times.append(time.perf_counter() - t0)
            row[name] = {"us": round(1e6 * statistics.median(times), 1), "max_abs_diff": diff}
        out[t] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="bench/results/verify_ops.json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    paths = prepare_default_models()
    target = load_model(paths["target"])
    cfg = target.cfg
    worker = TargetWorker(target, 1, 200 + 40 * a.reps * 8 + 64)
    rng = random.Random(0)
    worker.prefill([(0, [rng.randrange(100, 20000) for _ in range(200)], SamplingParams())], features=True)
    ops = {}
    for rows in (1, 4, 1, 4):   # twice each, interleaved; the second pass is kept
        ops[rows] = by_operator(worker, rows, a.reps, rng)
    attn = attention_forms(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 260, 300)
    result = {"date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or platform.machine(),
              "torch": torch.__version__, "threads": 1, "reps": a.reps,
              "verify_self_cpu_ms_by_rows": ops,
              "extra_rows_ms": {g: round(ops[4][g] - ops[1][g], 3) for g in ops[1]},
              "attention_us_by_query_rows": attn}
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print("| per verify (ms) | " + " | ".join(ops[1]) + " |")
    print("|---|" + "---|" * len(ops[1]))
    for rows in (1, 4):
        print(f"| {rows} row{'s' if rows > 1 else ''} | " + " | ".join(f"{v:.2f}" for v in ops[rows].values()) + " |")
    print()
    print("| query rows | " + " | ".join(attn[1]) + " |")
    print("|---|" + "---|" * len(attn[1]))
    for t, row in attn.items():
        print(f"| {t} | " + " | ".join(f"{r['us']} us" for r in row.values()) + " |")


if __name__ == "__main__":
    main()
