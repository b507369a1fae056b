"""In-process AR / SD / SSD on the default pair, measured against the Theorem 7 speedup model.

One process runs the AR engine, SD, and SSD with uniform fan-out budgets F in {1, 2, 3} forks per position
(budget F*(K+1)) on the same chat-templated mixed prompts (`ssd.prompts.PROMPTS`), greedy, fp32, EOS ignored.
The engines take turns prompt group by prompt group (`--batch` prompts at a time), so machine noise hits all of
them alike. Tokens/s = generated tokens / wall time incl. prefill.

In-process SSD speculates *serially* (the draft's speculate runs before the verify, on the same cores), so it is
expected to be slower than SD here. What concurrent drafting (draft on its own hardware, as in the services)
would give is predicted from the measured timings with Theorem 7 (docs: /design section 2):

    T_v = target verify time per round, t_d = draft JIT time per step, t_s = draft speculate time per round
    SSD: predicted_speedup(p_hit, E, E, T_p = t_s / T_v, T_b = K t_d / T_v)   (jit backup)
    SD:  E / (1 + K t_d / T_v)          bound: E / 1 (every round hits, drafting hidden)

with E the measured tokens per round and p_hit the measured cache hit rate. The theorem's unit is one verify;
on this CPU a (K+1)-token verify costs more than one AR step, so the JSON also gives the predicted tokens/s
(speedup / T_v) and its ratio to the measured AR tokens/s. Writes bench/results/inprocess.json.

    python bench/inprocess.py [--draft DIR] [--prompts 16] [--prompts-wide 8] [--new-tokens 48] [--k 3]
                              [--batch 1] [--threads 1]

The defaults are sized to finish in about 10 minutes on the 2-core development machine (see the JSON's
`config.reduced`); `--new-tokens 256 --prompts-wide 16` is the full workload (about an hour there).
The "measured / AR" and "predicted / measured AR" ratios compare against AR on the same prompts.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import torch  # noqa: E402

from ssd.engine.ar import AREngine  # noqa: E402
from ssd.engine.speculative import SpecConfig, SpeculativeEngine  # noqa: E402
from ssd.engine.stats import SpecStats  # noqa: E402
from ssd.models.loader import load_model  # noqa: E402
from ssd.models.prepare import prepare_default_models  # noqa: E402
from ssd.paths import default_models_dir  # noqa: E402
from ssd.prompts import PROMPTS_BY_KIND  # noqa: E402
from ssd.sampling import SamplingParams  # noqa: E402
from ssd.spec.theory import expected_tokens, predicted_speedup  # noqa: E402
from ssd.tokenizer import Tokenizer  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "inprocess.json"
FANOUTS = (1, 2, 3)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


class Timed:
    """Per-round timings of one speculative engine, read from the workers' last_* fields after each call."""

    def __init__(self, engine: SpeculativeEngine):
        self.verify: list[float] = []
        self.jit_step: list[float] = []
        self.speculate: list[float] = []
        self.round_wall: list[float] = []
        self._wrap(engine.target, "verify", lambda w: self.verify.append(w.last_verify_s))
        self._wrap(engine.draft, "jit", lambda w: self.jit_step.append(w.last_jit_step_s))
        self._wrap(engine.draft, "speculate", lambda w: self.speculate.append(w.last_speculate_s))

    @staticmethod
    def _wrap(worker, name, record):
        inner = getattr(worker, name)

        def wrapped(*args, **kwargs):
            out = inner(*args, **kwargs)
            record(worker)
            return out
        setattr(worker, name, wrapped)  # instance attribute: shadows the bound method for this worker only

    def clear(self):
        for xs in (self.verify, self.jit_step, self.speculate, self.round_wall):
            xs.clear()


class Runner:
    """One engine, fed prompt group after prompt group; keeps wall time, outputs and stats per group."""

    def __init__(self, name: str, engine, spec: bool):
        self.name, self.engine, self.spec = name, engine, spec
        self.timed = Timed(engine) if spec else None
        self.ar_step: list[float] = []       # AR decode steps (prefill steps excluded)
        self.groups: list[dict] = []

    def run(self, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
        e = self.engine
        seqs = [e.add_request(p, params) for p in prompts]
        verifies = len(self.timed.verify) if self.spec else 0
        t0 = time.perf_counter()
        while e.has_unfinished():
            prefill = bool(e.waiting)
            a = time.perf_counter()
            e.step()
            dt = time.perf_counter() - a
            if self.spec:
                if len(self.timed.verify) > verifies:  # this step verified: it was a round
                    self.timed.round_wall.append(dt)
                    verifies = len(self.timed.verify)
            elif not prefill:
                self.ar_step.append(dt)
        wall = time.perf_counter() - t0
        stats = SpecStats()
        for s in seqs:
            if getattr(s, "stats", None) is not None:
                stats.merge(s.stats)
        self.groups.append({"n": len(prompts), "wall": wall, "tokens": sum(len(s.output) for s in seqs),
                            "stats": stats})
        return [list(s.output) for s in seqs]

    def reset(self):
        self.groups.clear()
        self.ar_step.clear()
        if self.timed:
            self.timed.clear()

    def summary(self, first_groups: int | None = None) -> dict:
        groups = self.groups if first_groups is None else self.groups[:first_groups]
        wall = sum(g["wall"] for g in groups)
        tokens = sum(g["tokens"] for g in groups)
        row = {"prompts": sum(g["n"] for g in groups), "tokens": tokens, "wall_s": round(wall, 2),
               "tok_s": round(tokens / wall, 3) if wall else 0.0}
        if self.spec:
            stats = SpecStats()
            for g in groups:
                stats.merge(g["stats"])
            row.update(stats.as_dict())
        return row


def build_prompts(tok: Tokenizer, n: int) -> tuple[list[list[int]], list[str]]:
    chosen = PROMPTS_BY_KIND[:n]
    ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for _, p in chosen]
    return ids, [k for k, _ in chosen]


def theorem7(row: dict, timed: Timed, k: int, batch: int, ar_tok_s: float) -> dict:
    """The measured timings and what Theorem 7 predicts from them (drafting concurrent with verification)."""
    T_v, t_d, t_s = _mean(timed.verify), _mean(timed.jit_step), _mean(timed.speculate)
    E, a = row["tokens_per_round"], row["acceptance_rate"]
    out = {"rounds_timed": len(timed.verify), "T_v_s": round(T_v, 5), "t_d_s": round(t_d, 5),
           "t_s_s": round(t_s, 5), "round_wall_s": round(_mean(timed.round_wall), 5),
           "jit_calls": len(timed.jit_step), "E_from_a": round(expected_tokens(min(a, 1.0), k), 4)}
    if not T_v:
        return out
    T_b = k * t_d / T_v
    out["T_b"] = round(T_b, 4)
    out["sd_model_speedup"] = round(E / (1 + T_b), 4)
    out["bound_speedup"] = round(E / 1.0, 4)
    if t_s:
        T_p = t_s / T_v
        p_hit = row["hit_rate"]
        sp = predicted_speedup(p_hit, E, E, T_p, T_b)
        miss = 1.0 - p_hit
        out.update({"T_p": round(T_p, 4), "p_hit": p_hit, "ssd_predicted_speedup": round(sp, 4),
                    # serial in-process round: speculate, a JIT backup on a miss, then the verify
                    "serial_model_tok_s": round(batch * E / (T_v + t_s + miss * k * t_d), 3)})
        pred_tok_s = batch * sp / T_v
    else:
        out["serial_model_tok_s"] = round(batch * E / (T_v + k * t_d), 3)
        pred_tok_s = batch * out["sd_model_speedup"] / T_v
    # the theorem's unit is one verify: in tokens/s and against the measured AR rate
    out["predicted_concurrent_tok_s"] = round(pred_tok_s, 3)
    out["predicted_over_measured_ar"] = round(pred_tok_s / ar_tok_s, 4) if ar_tok_s else None
    out["bound_tok_s"] = round(batch * E / T_v, 3)
    return out


def fmt(x, nd=2):
    return "-" if x is None else f"{x:.{nd}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", type=Path, default=None, help="target model folder (default: prepared SmolLM2)")
    ap.add_argument("--draft", type=Path, default=None, help="draft model folder (default: the 2-layer draft)")
    ap.add_argument("--prompts", type=int, default=16, help="prompts for AR, SD and SSD F=1")
    ap.add_argument("--prompts-wide", type=int, default=8, help="prompts (the first ones) for SSD F=2 and F=3")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: at batch 1 the fp32 forward is memory-bound, and 2 threads "
                         "stall several-fold whenever other work shares the 2 cores)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if not 1 <= args.prompts <= len(PROMPTS_BY_KIND):
        ap.error(f"--prompts must be in 1..{len(PROMPTS_BY_KIND)}")
    args.prompts_wide = min(args.prompts_wide, args.prompts)
    torch.set_num_threads(args.threads)
    start, load_start = time.perf_counter(), os.getloadavg()

    if args.target is None or args.draft is None:
        prepared = prepare_default_models(default_models_dir(), log=lambda *a: None)
        args.target = args.target or prepared["target"]
        args.draft = args.draft or prepared["draft"]
    tok = Tokenizer.from_folder(args.target)
    prompts, kinds = build_prompts(tok, args.prompts)
    target, draft = load_model(args.target), load_model(args.draft)
    K, B = args.k, args.batch
    max_len = max(len(p) for p in prompts) + args.new_tokens + 2 * (K + 1)
    params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)

    runners = [Runner("AR", AREngine(target, max_batch=B, max_len=max_len), spec=False),
               Runner("SD", SpeculativeEngine(target, draft, SpecConfig(mode="sd", k=K), B, max_len), spec=True)]
    for F in FANOUTS:
        cfg = SpecConfig(mode="ssd", k=K, budget=F * (K + 1))
        runners.append(Runner(f"SSD F={F}", SpeculativeEngine(target, draft, cfg, B, max_len), spec=True))
    for r in runners:  # warm-up, then forget it
        r.run(prompts[:1], SamplingParams(max_tokens=8, ignore_eos=True))
        r.reset()
    print(f"{len(prompts)} prompts ({args.prompts_wide} for F=2,3), {args.new_tokens} new tokens, K={K}, "
          f"batch {B}, {args.threads} threads; load average {load_start[0]:.2f}", flush=True)

    groups = [list(range(i, min(i + B, len(prompts)))) for i in range(0, len(prompts), B)]
    wide_groups = sum(1 for g in groups if g[-1] < args.prompts_wide)
    identical = {r.name: 0 for r in runners[1:]}
    compared = {r.name: 0 for r in runners[1:]}
    for gi, g in enumerate(groups):
        batch = [prompts[i] for i in g]
        ref = runners[0].run(batch, params)
        for r in runners[1:]:
            if r.name in ("SSD F=2", "SSD F=3") and gi >= wide_groups:
                continue
            out = r.run(batch, params)
            identical[r.name] += sum(a == b for a, b in zip(out, ref))
            compared[r.name] += len(g)
        print(f"  prompts {g[0]}..{g[-1]} done, {time.perf_counter() - start:.0f}s", flush=True)

    ar = runners[0].summary()
    ar["decode_step_s"] = round(_mean(runners[0].ar_step), 5)
    # the same comparison on the prompts every engine ran (the F=2,3 subset)
    subset = {r.name: r.summary(first_groups=wide_groups)["tok_s"] for r in runners}
    rows = {"AR": ar}
    for r in runners[1:]:
        row = r.summary()
        ar_same = ar["tok_s"] if row["prompts"] == ar["prompts"] else subset["AR"]  # AR on the same prompts
        row["identical_to_ar"] = f"{identical[r.name]}/{compared[r.name]}"
        row["measured_over_ar"] = round(row["tok_s"] / ar_same, 4)
        row["theorem7"] = theorem7(row, r.timed, K, B, ar_same)
        rows[r.name] = row
    fanout_rows = []
    for F, r in zip(FANOUTS, runners[2:]):
        row = rows[r.name]
        fanout_rows.append({"F": F, "budget": F * (K + 1), "fanout": list(r.engine.spec.fanout),
                            "prompts": row["prompts"], "tok_s": row["tok_s"],
                            "tok_s_common_subset": subset[r.name], "measured_over_ar": row["measured_over_ar"],
                            "hit_rate": row["hit_rate"],
                            "cache": row["cache"], "tokens_per_round": row["tokens_per_round"],
                            **{k: v for k, v in row["theorem7"].items() if k != "rounds_timed"}})

    runtime = time.perf_counter() - start
    reduced = args.new_tokens < 256 or args.prompts_wide < args.prompts or args.prompts < 16
    result = {
        "config": {"target": str(args.target), "draft": str(args.draft), "prompts": args.prompts,
                   "prompt_kinds": kinds, "prompts_f2_f3": args.prompts_wide, "new_tokens": args.new_tokens,
                   "k": K, "batch": B, "greedy": True, "ignore_eos": True, "dtype": "float32",
                   "fanout": "uniform, budget F*(K+1)", "backup": "jit", "max_len": max_len,
                   "reduced": (f"{args.prompts} prompts x {args.new_tokens} new tokens, F=2,3 on the first "
                               f"{args.prompts_wide} prompts, to keep the run near 10 minutes on the 2-core "
                               "machine; the full workload (16 x 256, all F on 16) takes about an hour there")
                   if reduced else None},
        "engines": rows,
        "fanout": fanout_rows,
        "common_subset_tok_s": {"prompts": args.prompts_wide, **subset},
        "predicted": {
            "note": ("speedups in Theorem 7's unit (one verify = one AR step); *_tok_s = speedup / T_v; "
                     "predicted_over_measured_ar = that against the measured AR tokens/s on the same prompts"),
            "sd_model": {k: rows["SD"]["theorem7"].get(k) for k in
                         ("sd_model_speedup", "predicted_concurrent_tok_s", "predicted_over_measured_ar")},
            "ssd_theorem7": {f"F={F}": {k: rows[f"SSD F={F}"]["theorem7"].get(k) for k in
                                        ("p_hit", "T_p", "T_b", "ssd_predicted_speedup",
                                         "predicted_concurrent_tok_s", "predicted_over_measured_ar",
                                         "bound_speedup", "bound_tok_s")} for F in FANOUTS},
        },
        "runtime_s": round(runtime, 1),
        "load_average": {"start": round(load_start[0], 2), "end": round(os.getloadavg()[0], 2),
                         "note": "shared 2-core machine; other agents' tests run concurrently: timings are noisy"},
        "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "threads": args.threads,
        "machine": platform.processor() or platform.machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    print()
    print("| engine | prompts | tok/s | tok/s (first %d) | tokens/round | a | a per position | hit rate |"
          " measured / AR | T_v ms | t_d ms | t_s ms | predicted speedup (concurrent) | predicted / measured AR |"
          % args.prompts_wide)
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(f"| AR | {ar['prompts']} | {ar['tok_s']:.2f} | {subset['AR']:.2f} | 1.00 | - | - | - | 1.00 | "
          f"{ar['decode_step_s'] * 1e3:.1f} (step) | - | - | 1.00 | 1.00 |")
    for r in runners[1:]:
        row, t7 = rows[r.name], rows[r.name]["theorem7"]
        pred = t7.get("ssd_predicted_speedup", t7.get("sd_model_speedup"))
        app = " / ".join(f"{x:.3f}" for x in row["acceptance_per_position"])
        hit = fmt(row["hit_rate"], 3) if r.name.startswith("SSD") else "-"
        ts = fmt(t7["t_s_s"] * 1e3, 1) if t7["t_s_s"] else "-"
        print(f"| {r.name} | {row['prompts']} | {row['tok_s']:.2f} | {subset[r.name]:.2f} | "
              f"{row['tokens_per_round']:.3f} | {row['acceptance_rate']:.3f} | {app} | {hit} | "
              f"{row['measured_over_ar']:.2f} | {t7['T_v_s'] * 1e3:.1f} | {fmt(t7['t_d_s'] * 1e3, 1)} | {ts} | "
              f"{fmt(pred)} | "
              f"{fmt(t7.get('predicted_over_measured_ar'))} |")
    print(f"\nbound (every round hits, drafting hidden): "
          + ", ".join(f"F={F} {rows[f'SSD F={F}']['theorem7'].get('bound_speedup', 0):.2f}" for F in FANOUTS))
    print(f"runtime {runtime:.0f}s, load average {load_start[0]:.2f} -> {os.getloadavg()[0]:.2f}; wrote {args.out}")


if __name__ == "__main__":
    main()
