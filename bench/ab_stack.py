"""Modes on a fresh stack of the code in the current folder, one JSON line per run: by default SSD against SD at
K = 3 at batches 8 and 16 (ssd, sd, ssd at each: the first SSD run lets the fan-out policy settle at that batch).
Alternating stacks of two commits (or of two settings: `--draft-dtype`) gives an A/B in which the machine's drift
hits both alike:

    git worktree add /tmp/before <commit>
    for v in after before before after; do (cd $([ $v = after ] && echo . || echo /tmp/before) &&
        PYTHONPATH=$PWD python /path/to/bench/ab_stack.py $v); done > ab.jsonl
    for d in bfloat16 float32 bfloat16; do python bench/ab_stack.py $d --batches 1 --modes ssd,sd,ar,ssd-auto,sd-auto \
        --draft-dtype $d; done > ab.jsonl

Modes are `run_mode`'s (ar, sd and ssd at K = 3, sd-auto and ssd-auto at the router's K); sd and ssd take another
pinned K as a suffix (ssd1: K = 1). Each line: tok/s, and the router's totals over the run (rounds, verify batches
`vb`, drafted positions `offered`, the target's verify seconds and their round trips, JIT batches and seconds, cache
lookups by outcome, tokens per round), with the verify and the draft round per batch, the hit rate, and the CPU
seconds each service's process spent during the run (`cpu`, from /proc).
(`bench/results/round_cap_ab.jsonl`: the fan-out round cap, 8d63c2e against 52559b8, 2026-12-04;
`bench/results/draft_dtype_ab.jsonl`: the draft in bfloat16 against float32, 2026-12-04;
`bench/results/adaptive_margin_ab.jsonl`: the adaptive K's speculation margin, 018e455 against 130b8f2, all of
`ssd bench`'s modes at batches 1-16, 2026-12-05;
`bench/results/packed_weights_ab.jsonl`: packed weights off and on in one checkout, `SSD_PACKED_WEIGHTS=0` against
unset, the same modes and batches, 2026-12-05;
`bench/results/io_wake_ab.jsonl`: replies sent as soon as queued, 984d906 against 36b9826, batches 1 and 8,
2026-12-05, on the new host;
`bench/results/probe_ab.jsonl`: one-sequence probes, ragged verifies carried flat and the adaptive policy's JIT-only
class, 713f28a against 5c2dfb5, ar, sd-auto and ssd-auto at batches 4, 8 and 16, 2026-12-05;
`bench/results/probe_ab_b12.jsonl`: the same with the per-batch-size hit rate too, 713f28a against 6a85dd4, batches 1
and 2;
`bench/results/plain_source_ab.jsonl`: the policy's plain-round acceptance, eab8f8d's code against ffcda83, ar,
sd-auto and ssd-auto at batches 1-16, 2026-12-05;
`bench/results/draft_depth_ab.jsonl`: chains as deep as the next round's K, cf5c0e6 against 6f98b19, ar, ssd-auto,
sd-auto and ssd1 at batches 4, 8 and 16, 2026-12-05; `bench/results/draft_depth_ab_b24.jsonl`: the same codes, ar and
ssd-auto twice each at batches 2 and 4; `bench/results/batch16_plain_aa.jsonl`: ar, sd-auto and ssd-auto in turn at
batch 16, one stack, after one sd3 run; `bench/results/batch16_four_per_client.jsonl`: ar, sd1, sd-auto, ssd-auto,
sd1, ar at batch 16 with `--per-client 4`. The last two came from a scratch copy of this loop with the client's
threads pinned to CPU 1, before these options were here; their lines carry a `t0` and no `label`.
`bench/results/confidence_stop_b1_k5.jsonl`: `--k 5 --draft-flag=--min-confidence --draft-flag=0.1` (k5c) against
K = 3 without it (k3), ar, ssd-auto and sd-auto at batch 1, 2026-12-05; `confidence_stop_b1_k3.jsonl`: the threshold
at K = 3 (k3c) against none, batch 1; `confidence_stop_b48_k3.jsonl`: the same at batches 4 and 8;
`confidence_stop_b1_pinned.jsonl`: one stack at K = 5 with the threshold, ar, sd5, sd-auto, sd3, ssd5, ssd-auto, ssd3;
`batch8_plain_aa.jsonl`: ar against sd-auto four times and against ssd-auto twice at batch 8, one stack;
`default_path_ab.jsonl`: f7bd0c9 against 52d5dfe with the default settings, ar, ssd-auto, sd-auto, ssd at batch 1;
`adaptive_median_margin_ab.jsonl` (17517fb: the verify table's median and no margin between two K > 0, not kept),
`adaptive_median_ab.jsonl` (5c3e647: the median alone, not kept) and `adaptive_drift_ab.jsonl` (2aef96f: the median
and the drift), each against 1f787bb at batches 1, 4 and 8 or 16; `adaptive_hold_ab.jsonl`: f41ac74 (an unmeasured
size does not displace the K in use) against 1f787bb at batch 1 with sd3 and ssd3 beside;
`cost_between_ab.jsonl`: b48d9dd (an unmeasured verify size read off the measured ones, not the line) against 4e4612d,
ar, ssd-auto, sd-auto, ar, ssd-auto, sd-auto at batches 4, 8 and 16, 2026-12-05.)

`--k` sets the stack's K (the router's most and the draft's own); `--draft-flag` passes one more flag to the draft
service (repeat it for a flag's value); `--router-debug` runs the router at DEBUG and adds each run's adaptive K changes
for its mode (`switches`, counted in the router's log). `bench/results/realized_per_round_ab.jsonl`: 8873f02 (the
realized-time correction per verify batch, reverted in f6e2d76) against 1825585 at batch 16 and 8 with
`--router-debug`, 2026-12-06, from a scratch copy of this loop before the option was here;
`bench/results/realized_weighted_mean_ab.jsonl`: the same correction as a weighted mean with a prior of four rounds
(not committed) against b9f82f7, `ssd bench`'s modes at batches 8 and 16 with `--router-debug`, 2026-12-06.
`bench/results/entry_backoff_ab.jsonl`: 3abfa24 (a short stint of speculation raises the margin to turn it on again)
against 793c3a6, `ssd bench`'s modes at batches 4, 8 and 16 with `--router-debug`, 2026-12-06;
`bench/results/realized_median_ab.jsonl`: the realized-time correction as the median of the last 64 ratios against
3abfa24, ar, ssd-auto, sd-auto, ssd3, ssd-auto, sd-auto, ar at batches 4, 8 and 16, 2026-12-06;
`bench/results/late_wait_ab.jsonl`: 4c85248 (an outcome that finds the draft late waits for its entries) against
f87ada1, ssd3, ssd-auto and sd3 at batches 1 and 2, 2026-12-07 (run before the lines carried `waits`; at batch 1, where
a JIT batch is one sequence's, an `after` line's waits that ended in a JIT are its JIT batches less its `no_entry` and
`forced` lookups);
`bench/results/drift_window_ab_b1.jsonl`: ff98998 (the verify cost table's drift over its last 5 measurements, shape
medians over 17) against 45f51b7, ssd-auto and ssd3 at batch 1 with `--router-debug`, after, before, before, after,
after, before, 2026-12-07; `bench/results/drift_window_ab_b4_b16.jsonl`: the same commits, ar, ssd-auto and sd-auto at
batches 4 and 16, after, before, before, after;
`bench/results/ssd_auto_order_b16.jsonl`: two stacks of b6b8275 at batch 16 alone, ssd-auto before and after a pinned
ssd3 (then sd3) run, 2026-12-06.
`bench/results/ssd_auto_k0_alternated_b16.jsonl`: one stack of 7141474, ar and ssd-auto in turn four times at batch 16
with `--router-debug`; `bench/results/measure_first_ab.jsonl`: f38613e (speculation measured before it turns on at an
unmeasured verify shape) against 7141474, and `bench/results/adaptive_three_ab.jsonl`: b2562e9 (that, with a
speculating class's correction no less than plain decoding's and the choice per size bucket) against 7141474, both
ar, sd3, ssd3, sd-auto, ssd-auto, ssd-auto, sd-auto, ssd3, sd3, ar at batches 4, 8 and 16 with `--router-debug`,
2026-12-06 (`bench/results/adaptive_b16_switches_trace.log`: the router lines behind those changes).
`bench/results/after_pinned_aa_b16.jsonl`: two stacks of fe4c661, ar, sd3, sd-auto, ar, sd-auto, ar, sd3, ar, sd-auto
at batch 16 with `--router-debug`; `bench/results/probe_per_bucket_ab.jsonl`: a probe interval per batch-size bucket
(not committed) against c86ba94, ar, sd-auto, ssd-auto, ssd-auto, sd-auto, ar at batches 2, 8 and 16, 2026-12-06.
Under a steady load (`--per-client 3 --new-tokens 128 --router-debug`: each client runs three requests back to back,
so a finished request's slot takes the next one), 2026-12-06: `bench/results/steady_state_b48.jsonl`, one stack of
f65f53f, ar, sd1, sd-auto, ssd1, ar, sd1, sd-auto, ssd-auto, ar at batch 8 (label pc3), then another, ar, sd-auto,
ssd-auto, ar, ssd-auto, sd-auto, ar at batches 8 and 4 (steady); `bench/results/verify_beside_draft_ab.jsonl`:
40c6f4e (verifies beside the draft's speculation costed apart, reverted in db4b751) against f65f53f, ar, ssd-auto,
sd-auto, ssd-auto, ar at batches 8 and 4, eight alternated stacks; `bench/results/batch_hold_1round_ab.jsonl`: a4155dc
(the choice's batch size held for one round trip) against f65f53f, the same; `bench/results/batch_hold_ab.jsonl`:
f4b20b5 (held for four) against f65f53f, the same.
`--max-batch` sizes the stack for a larger batch than it runs (`ssd bench` sizes it for its largest batch, 16 in
the runs of docs/benchmarks.md).
`bench/results/max_batch_b1_aa.jsonl`: four stacks of 8098424's code at batch 1, sized for 16 and for 1 (labels mb16,
mb1), each running ssd3, ssd-auto, sd3, sd-auto, ssd-auto, ssd3 with `--router-debug`;
`bench/results/ssd3_repeat_b1.jsonl`: two stacks running ssd3 ten times in turn at batch 1 (`--per-client 4`), the
shape of this machine's drift over a batch size's runs; both 2026-12-07.
On the Intel Xeon host with AMX, 2026-12-07: `bench/results/draft_budget_ab_spr.jsonl`, the draft at
`--draft-flag=--budget --draft-flag=128` (label b128) against its default 64 forks a round (b64), ssd3, sd3 and
ssd-auto at batches 1 and 4;
`bench/results/acceptance_per_batch_ab.jsonl`: 837c491 (the policy's acceptance decayed per verify batch) against
7ba8707, ar, sd-auto, ssd-auto, ar at batches 8 and 16; `bench/results/acceptance_per_batch_ab_b24.jsonl`: the same
commits, sd3, ssd3, sd-auto, ssd-auto at batches 2 and 4.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, ".")   # the checkout being measured, not this file's
from ssd.bench.stack import _diff, _totals, run_mode  # noqa: E402
from ssd.cli.launcher import Stack, StackConfig  # noqa: E402
from ssd.client.sync import Client  # noqa: E402
from ssd.prompts import PROMPTS_BY_KIND  # noqa: E402


def main(label: str, batches=(8, 16), modes=("ssd", "sd", "ssd"), new_tokens: int = 96,
         draft_dtype: str = "", per_client: int = 0, k: int = 3, draft_flags: tuple[str, ...] = (),
         router_debug: bool = False, max_batch: int = 0) -> None:
    prompts_all = [p for _, p in PROMPTS_BY_KIND]
    # `ssd bench`'s pinning, spelled out here: the older checkout of an A/B has no shared helper to call
    flags = [*(["--dtype", draft_dtype] if draft_dtype else []), *draft_flags]
    extra = {"draft": flags} if flags else {}
    if router_debug:
        extra["router"] = ["--log-level", "DEBUG"]
    log_dir = Path("bench/results/logs")
    cfg = StackConfig(mode="ssd", drafts=1, k=k, max_batch=max(max_batch, *batches), target_cpus="0", draft_cpus="1",
                      router_cpus="1", threads=1, log_dir=log_dir, extra=extra)
    with Stack(cfg) as stack, Client(stack.grpc_address, timeout=3600) as client:
        client.generate(prompts_all[0], chat=True, max_tokens=4, mode="ssd")   # warm-up
        for b in batches:
            n = b * per_client if per_client else max(8, b)
            prompts = [prompts_all[i % len(prompts_all)] for i in range(n)]
            for mode in modes:
                base, pin = (mode.rstrip("0123456789"), int(mode[-1])) if mode[-1].isdigit() else (mode, k)
                cpu0 = _cpu_seconds(stack)
                log_at = _size(log_dir / "router.log")
                before = _totals(client)
                r = run_mode(client, prompts, base, b, new_tokens, pin)
                d = _diff(_totals(client), before)
                cpu = {name: round(v - cpu0[name], 2) for name, v in _cpu_seconds(stack).items()}
                print(json.dumps({"label": label, "k": k, "batch": b, "mode": mode, "tok_s": round(r["tok_s"], 2),
                                  "verify": round(r["verify_s_per_batch"], 4), "draft": round(r["draft_round_s"], 4),
                                  "hit": round(r["hit_rate"], 3), "wall": round(r["wall_s"], 2),
                                  "rounds": d["rounds"], "vb": d["verify_batches"], "offered": d["offered"],
                                  "verify_s": round(d["target_verify_s"], 2), "rt_s": round(d["verify_roundtrip_s"], 2),
                                  "jitb": d["jit_batches"], "jit_s": round(d["jit_s"], 2), "cache": d["cache"],
                                  **({"waits": d["waits"], "wait_s": round(d["wait_s"], 3)}
                                     if "waits" in d else {}),   # (an older checkout has none)
                                  "tpr": round(r["tokens_per_round"], 2), "cpu": cpu,
                                  **({"switches": _switches(log_dir / "router.log", log_at, base)}
                                     if router_debug else {})}), flush=True)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _switches(router_log: Path, start: int, mode: str) -> int:
    """The adaptive policy's K changes for `mode` (sd or ssd) the router logged from byte `start` of its log on (at
    DEBUG it logs every change; at INFO one in 10 s)."""
    if mode not in ("sd", "sd-auto", "ssd", "ssd-auto"):
        return 0
    with open(router_log, "rb") as f:
        f.seek(start)
        text = f.read().decode("utf-8", "replace")
    return text.count(f"adaptive speculation ({mode.removesuffix('-auto')}, ")


def _cpu_seconds(stack) -> dict[str, float]:
    """User + system CPU seconds of each of the stack's processes so far (Linux /proc)."""
    out = {}
    for name, proc in stack.procs.items():
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        out[name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("label", nargs="?", default="run")
    ap.add_argument("--batches", default="8,16")
    ap.add_argument("--modes", default="ssd,sd,ssd")
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--draft-dtype", default="", help="the draft's --dtype (default: the service's own)")
    ap.add_argument("--per-client", type=int, default=0,
                    help="prompts per client (batch x this many a run, so finished clients start new requests and the "
                         "batch stays full until the last ones; default: max(8, batch) prompts)")
    ap.add_argument("--k", type=int, default=3, help="the stack's K (the router's most and the draft's own)")
    ap.add_argument("--max-batch", type=int, default=0,
                    help="the stack's largest batch (default: the largest of --batches; `ssd bench` sizes its "
                         "stack for its own largest batch)")
    ap.add_argument("--router-debug", action="store_true",
                    help="run the router at DEBUG and count each run's adaptive K changes for its mode (`switches`)")
    ap.add_argument("--draft-flag", action="append", default=[], dest="draft_flags",
                    help="one more flag for the draft service, repeatable (e.g. --draft-flag=--min-confidence "
                         "--draft-flag=0.1)")
    a = ap.parse_args()
    main(a.label, tuple(int(b) for b in a.batches.split(",")), tuple(a.modes.split(",")), a.new_tokens, a.draft_dtype,
         a.per_client, a.k, tuple(a.draft_flags), a.router_debug, a.max_batch)
