"""`ssd bench`: AR, SD and SSD through real processes (router, target, draft), at several batch sizes.

One stack serves all three modes (the mode is per request), so every figure comes from the same processes in
one run. Target and draft are pinned to different cores with one torch thread each. For each batch size b,
b client streams run the prompts, each prompt once per mode; throughput = generated tokens / wall time, over all
of a mode's runs at that batch size. The router's cumulative totals (GetServerInfo), diffed around each run, give
acceptance, tokens per round, cache hit and late rates, and the round-time split.

Passes: at each batch size the prompts are split into shares, and each pass runs every mode on its share. A mode's
runs are minutes apart from another's, and this machine drifts by 10-25% in that time, so the order of the modes
changes from pass to pass:
- Two passes, the second in reverse order (ar, sd, ssd, ... then ..., ssd, sd, ar): a drift that is steady over the
  batch size's runs falls on all modes alike. One that is not does not: the modes in the middle run back to back
  mid-way, the first and the last at the two ends. In two runs of the twenty-fifth session the verifies at batch 1
  were slower the nearer a mode ran to the middle (`bench/results/ssd_avx2_s25*.json`, docs/benchmarks.md).
- As many passes as modes, the orders a Latin square (`orders`): every mode runs once at every place in the order,
  so any drift over the batch size's runs, of whatever shape, falls on all modes alike.
`passes` = 0 (the default) takes the square where its passes of at least b prompts each run no more than a quarter
more prompts than the batch size's own (batches 1 and 2 of 8 prompts and 5 modes; up to 4 of 16), and two reversed
passes elsewhere; another number takes that many passes, in a square where it is a multiple of the modes' number and
alternately reversed otherwise. A share holds at least b prompts (it must fill the batch), so where the prompts do not
split into shares of b, a pass runs b of them (wrapping around the list) and the batch size takes longer. Each pass's
own ratios are kept beside the totals (`passes`), their spread is the noise left.

The result records the host (`host_facts`): the CPU's model, its cores, whether it computes bfloat16 natively and the
dtype each service loaded. The same commit ran SSD / SD 1.07 at batch 1 on an AVX-512 BF16 host (a bfloat16 draft,
JIT 7 ms a round) and 1.08-1.17 on an AVX2 one (a float32 draft, JIT 19 ms), and the files did not say which was which.
"""
from __future__ import annotations

import json
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ssd.cli.launcher import Stack, StackConfig
from ssd.client import Client
from ssd.prompts import PROMPTS_BY_KIND


def _totals(client: Client) -> dict:
    t = client.server_info().totals
    return {"rounds": t.rounds, "round_tokens": t.round_tokens, "accepted": list(t.accepted),
            "offered": list(t.offered), "reached": t.reached, "cache": dict(t.cache), "backups": dict(t.backups),
            "waits": dict(t.waits),
            "verify_batches": t.verify_batches, "target_verify_s": t.target_verify_s,
            "verify_roundtrip_s": t.verify_roundtrip_s, "draft_rounds": t.draft_rounds,
            "draft_round_s": t.draft_round_s, "jit_batches": t.jit_batches, "jit_s": t.jit_s, "wait_s": t.wait_s}


def _diff(after: dict, before: dict) -> dict:
    out = {}
    for k, v in after.items():
        b = before[k]
        if isinstance(v, dict):
            out[k] = {key: v.get(key, 0) - b.get(key, 0) for key in v}
        elif isinstance(v, list):
            out[k] = [x - (b[i] if i < len(b) else 0) for i, x in enumerate(v)]
        else:
            out[k] = v - b
    return out


def measure_mode(client: Client, prompts: list[str], mode: str, batch: int, new_tokens: int, k: int = 0) -> dict:
    """One mode at one batch size, raw: the tokens generated, the wall time and the router's totals over the run.
    "sd"/"ssd" run with K pinned to k; "sd-auto"/"ssd-auto" let the router choose K."""
    if mode.endswith("-auto"):
        mode, k = mode[:-len("-auto")], 0
    elif mode == "ar":
        k = 0
    before = _totals(client)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(batch) as pool:
        results = list(pool.map(lambda p: client.generate(p, chat=True, max_tokens=new_tokens, ignore_eos=True,
                                                          mode=mode, k=k), prompts))
    wall = time.perf_counter() - t0
    return {"tokens": sum(r.completion_tokens for r in results), "wall_s": wall,
            "totals": _diff(_totals(client), before)}


def add_measures(a: dict, b: dict) -> dict:
    """Two raw measures of one mode as one (tokens, wall time and every router total summed)."""
    def add(x, y):
        if isinstance(x, dict):
            return {key: add(x.get(key, 0), y.get(key, 0)) for key in {**x, **y}}
        if isinstance(x, list):
            n = max(len(x), len(y))
            return [(x[i] if i < len(x) else 0) + (y[i] if i < len(y) else 0) for i in range(n)]
        return x + y
    return add(a, b)


def mode_row(m: dict) -> dict:
    """A mode's figures from its raw measure (`measure_mode`, or several summed by `add_measures`)."""
    tokens, wall, d = m["tokens"], m["wall_s"], m["totals"]
    looked = sum(v for k, v in d["cache"].items() if k != "forced")
    row = {"tok_s": tokens / wall, "tokens": tokens, "wall_s": wall,
           "tokens_per_round": d["round_tokens"] / d["rounds"] if d["rounds"] else 0.0,
           "acceptance": sum(d["accepted"]) / d["reached"] if d["reached"] else 0.0,
           "acceptance_per_position": [a / o if o else 0.0 for a, o in zip(d["accepted"], d["offered"])],
           "hit_rate": d["cache"].get("hit", 0) / looked if looked else 0.0,
           "late_rate": d["cache"].get("late", 0) / looked if looked else 0.0,
           # rounds run from the cache, at once or after a late lookup waited for the draft's entries
           "served_rate": (d["cache"].get("hit", 0) + d.get("waits", {}).get("hit", 0)) / looked if looked else 0.0,
           "backups": d["backups"], "cache": d["cache"], "waits": d.get("waits", {})}
    nb = max(1, d["verify_batches"])
    row["verify_s_per_batch"] = d["target_verify_s"] / nb
    row["router_hop_s_per_batch"] = (d["verify_roundtrip_s"] - d["target_verify_s"]) / nb
    row["draft_round_s"] = d["draft_round_s"] / d["draft_rounds"] if d["draft_rounds"] else 0.0
    row["jit_s_per_batch"] = d["jit_s"] / d["jit_batches"] if d["jit_batches"] else 0.0
    waits = sum(d.get("waits", {}).values())
    row["wait_s_per_wait"] = d.get("wait_s", 0.0) / waits if waits else 0.0
    row["overhead_fraction"] = row["router_hop_s_per_batch"] / row["verify_s_per_batch"] if d["verify_batches"] else 0.0
    # Upper bound: every round hits and drafting is hidden -> tokens per round per verify, at this batch size
    tokens_per_batch = d["round_tokens"] / nb
    row["bound_tok_s"] = tokens_per_batch / row["verify_s_per_batch"] if row["verify_s_per_batch"] else 0.0
    return row


def run_mode(client: Client, prompts: list[str], mode: str, batch: int, new_tokens: int, k: int = 0) -> dict:
    """One mode at one batch size: its figures (`mode_row`)."""
    return mode_row(measure_mode(client, prompts, mode, batch, new_tokens, k))


def orders(modes: list, passes: int) -> list[list]:
    """The modes' order in each of `passes` passes. Where `passes` is a multiple of the number of modes n, the rows of
    a Latin square in turn (Williams': 0, 1, n-1, 2, n-2, ... shifted by one a row), so each mode runs at each place
    equally often and, for an even n, after each other mode once; elsewhere the modes as given, reversed on odd
    passes."""
    n = len(modes)
    if n > 1 and passes % n == 0:
        base = [0] + [((j + 1) // 2 if j % 2 else n - j // 2) for j in range(1, n)]
        return [[modes[(x + p) % n] for x in base] for p in range(passes)]
    return [list(modes) if p % 2 == 0 else list(reversed(modes)) for p in range(passes)]


def auto_passes(n_modes: int, n_prompts: int, batch: int) -> int:
    """The passes `passes` = 0 takes (module doc): as many as modes where their shares of at least `batch` prompts run at
    most a quarter more prompts than max(`n_prompts`, `batch`), else 2."""
    total = max(n_prompts, batch)
    square = n_modes * max(batch, -(-total // n_modes))
    return n_modes if n_modes > 2 and 4 * square <= 5 * total else 2


def pass_plan(modes: list, prompts: list[str], n_prompts: int, batch: int, passes: int) -> list[tuple[list, list[str]]]:
    """The passes at one batch size: (modes in the order they run, the prompts each mode runs in it). The first
    max(`n_prompts`, `batch`) prompts split into `passes` shares of at least `batch` each (`passes` 0: `auto_passes`),
    taken in turn along `prompts` (wrapping around it where the shares hold more than those); the order of the modes
    in each pass is `orders`'."""
    passes = passes if passes > 0 else auto_passes(len(modes), n_prompts, batch)
    total = max(n_prompts, batch)
    share = max(batch, -(-total // passes))
    plan, start = [], 0
    for order in orders(modes, passes):
        plan.append((order, [prompts[(start + i) % len(prompts)] for i in range(share)]))
        start += share
    return plan


def summary_row(per: dict) -> dict:
    """One batch size's row from its runs (`run_mode` rows keyed "ar", "sd<K>", "ssd<K>", optionally "sd-auto",
    and "ssd-auto"): the best SD (a fixed K or the router's own, "auto") and the best fixed K of SSD, and adaptive
    SSD against the best of all the others ("auto_over_best_fixed"), AR and the best SD."""
    tok = {name: r["tok_s"] for name, r in per.items()}
    best_sd = max((n for n in tok if n.startswith("sd")), key=tok.get)
    best_ssd = max((n for n in tok if n.startswith("ssd") and n != "ssd-auto"), key=tok.get)
    ar, auto = tok["ar"], tok["ssd-auto"]
    best_fixed = max(ar, tok[best_sd], tok[best_ssd])
    s = per[best_ssd]
    sd_k = "auto" if best_sd == "sd-auto" else int(best_sd[2:])
    return {"ar_tok_s": ar, "sd_tok_s": tok[best_sd], "sd_k": sd_k, "ssd_tok_s": tok[best_ssd],
            "ssd_k": int(best_ssd[3:]), "ssd_auto_tok_s": auto, "tok_s": tok,
            "auto_over_best_fixed": auto / best_fixed, "auto_over_ar": auto / ar, "auto_over_sd": auto / tok[best_sd],
            "auto_tokens_per_round": per["ssd-auto"]["tokens_per_round"], "ssd_over_sd": tok[best_ssd] / tok[best_sd],
            "ssd_over_ar": tok[best_ssd] / ar, "sd_over_ar": tok[best_sd] / ar, "hit_rate": s["hit_rate"],
            "served_rate": s["served_rate"], "wait_s_per_wait": s.get("wait_s_per_wait", 0.0),
            "late_rate": s["late_rate"], "acceptance": s["acceptance"], "tokens_per_round": s["tokens_per_round"],
            "bound_fraction": tok[best_ssd] / s["bound_tok_s"] if s["bound_tok_s"] else 0.0,
            "overhead_fraction": s["overhead_fraction"], "modes": per}


def cpu_name() -> str:
    """The CPU's model as Linux names it (`model name` in /proc/cpuinfo), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_facts(dtype: str = "", device: str = "cpu") -> dict:
    """What a figure of this host depends on: the CPU, its cores, whether it computes bfloat16 natively, and the dtype
    each service loads with `--dtype dtype` (empty: each service's own default, `DEFAULT_DTYPES`, as the stack passes
    none), resolved by the function the services use."""
    from ssd.worker.service import DEFAULT_DTYPES, native_bf16, resolve_dtype

    return {"cpu": cpu_name(), "cores": os.cpu_count(), "native_bf16": native_bf16(device),
            "dtype": {role: resolve_dtype(dtype or DEFAULT_DTYPES[role], device, role)
                      for role in ("target", "draft")}}


def bench(new_tokens: int = 256, n_prompts: int = 16, batches=(1, 2, 4, 8), k: int = 3, models_dir=None,
          draft_model=None, out: Path | None = None, log=print, ks=None, passes: int = 0) -> dict:
    """`ks`: the fixed K values SD and SSD run at (default: just `k`); the stack's draft speculates up to the
    largest. Each batch size runs max(n_prompts, batch) prompts per mode, in `passes` passes (`pass_plan`)."""
    ks = tuple(sorted(set(ks or (k,))))
    prompts_all = [p for _, p in PROMPTS_BY_KIND]
    cfg = StackConfig(mode="ssd", drafts=1, models_dir=models_dir, draft_model=draft_model, k=max(ks),
                      max_batch=max(batches), target_cpus="0", draft_cpus="1", router_cpus="1",
                      threads=1, log_dir=Path("bench/results/logs"))
    modes = [("ar", 0)] + [(m, kk) for kk in ks for m in ("sd", "ssd")] + [("sd-auto", 0), ("ssd-auto", 0)]
    named = [(m if m in ("ar", "sd-auto", "ssd-auto") else f"{m}{kk}", m, kk) for m, kk in modes]
    rows: dict = {}
    host = host_facts(cfg.dtype)
    log(f"host: {host['cpu']}, {host['cores']} cores, bfloat16 {'native' if host['native_bf16'] else 'emulated'}; "
        f"target {host['dtype']['target']}, draft {host['dtype']['draft']}")
    with Stack(cfg) as stack, Client(stack.grpc_address, timeout=3600) as client:
        client.generate(prompts_all[0], chat=True, max_tokens=4, mode="ssd")  # warm-up
        for b in batches:
            raw: dict = {}
            by_pass = []
            for order, prompts in pass_plan(named, prompts_all, n_prompts, b, passes):
                this = {name: measure_mode(client, prompts, m, b, new_tokens, kk) for name, m, kk in order}
                for name, measure in this.items():
                    raw[name] = add_measures(raw[name], measure) if name in raw else measure
                pr = summary_row({name: mode_row(this[name]) for name, _, _ in named})
                by_pass.append({"order": [name for name, _, _ in order], "prompts": len(prompts),
                                **{key: pr[key] for key in ("auto_over_best_fixed", "auto_over_ar", "auto_over_sd")}})
            r = rows[str(b)] = summary_row({name: mode_row(raw[name]) for name, _, _ in named})
            r["passes"] = by_pass
            log(f"batch {b}: " + "  ".join(f"{n} {v:.1f}" for n, v in r["tok_s"].items()) +
                f" tok/s (adaptive/best other {r['auto_over_best_fixed']:.2f}, by pass "
                f"{_by_pass(by_pass)}; adaptive/AR {r['auto_over_ar']:.2f}, "
                f"adaptive/best SD {r['auto_over_sd']:.2f}; ssd{r['ssd_k']}: hit {r['hit_rate']:.2f}, "
                f"from the cache {r['served_rate']:.2f}, late {r['late_rate']:.2f} "
                f"(a wait {1000 * r['wait_s_per_wait']:.1f} ms), "
                f"a {r['acceptance']:.2f}, overhead {r['overhead_fraction']:.3f})")
    result = {"date": time.strftime("%Y-%m-%d"), "machine": platform.machine(), "host": host,
              "new_tokens": new_tokens,
              "prompts": n_prompts, "passes": passes if passes > 0 else "auto", "k": max(ks), "ks": list(ks),
              "draft": str(draft_model or "default"),
              "pinning": "target cpu 0, draft and router cpu 1, 1 torch thread each", "batch": rows}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def _by_pass(passes: list[dict]) -> str:
    return ", ".join(f"{p['auto_over_best_fixed']:.2f}" for p in passes)


def markdown(result: dict) -> str:
    lines = ["| batch | AR tok/s | best SD tok/s (K) | best SSD tok/s (K) | SSD adaptive tok/s | "
             "adaptive / best other | adaptive / AR | adaptive / best SD | a | tokens/round | hit (from the cache) | "
             "late | overhead | "
             "adaptive / best other, by pass |",
             "|" + "---|" * 14]
    for b, r in result["batch"].items():
        sd_k, ssd_k = r.get("sd_k", result["k"]), r.get("ssd_k", result["k"])
        lines.append(f"| {b} | {r['ar_tok_s']:.1f} | {r['sd_tok_s']:.1f} ({sd_k}) | {r['ssd_tok_s']:.1f} ({ssd_k}) | "
                     f"{r['ssd_auto_tok_s']:.1f} | {r['auto_over_best_fixed']:.2f} | "
                     f"{r['ssd_auto_tok_s'] / r['ar_tok_s']:.2f} | {r['ssd_auto_tok_s'] / r['sd_tok_s']:.2f} | "
                     f"{r['acceptance']:.2f} | {r['tokens_per_round']:.2f} | {r['hit_rate']:.2f}"
                     f"{' (%.2f)' % r['served_rate'] if 'served_rate' in r else ''} | "
                     f"{r['late_rate']:.2f} | {r['overhead_fraction']:.3f} | "
                     f"{_by_pass(r.get('passes', [])) or '-'} |")
    return "\n".join(lines)
