"""SSD cache hit rate against the fan-out budget and its split, on the default pair (in-process engine).

For each (budget, split) the in-process SSD engine (K=3 by default, greedy, fp32, EOS ignored, `--batches` prompts
at a time) answers the held-out chat-templated prompts of `ssd.prompts`; every cache lookup is recorded with its
outcome (j, t*) and, where the draft had published forks for that j, the rank of t* among them (forks are
published best first). Splits: `uniform`, `geometric` (Theorem 12 with `--acceptance` and `--r`), `default` (what
a draft runs when told nothing: `ssd.spec.fanout.default_fanout`) and `online` (that as the draft's own, then
the router's `FanoutPolicy` each round, as in the services). From that:

* hit rate per run, by reason (hit / no_entry; in process every entry is on time, so late is 0 by
  construction: the draft's lateness in the services is `speculate_over_verify`, the draft's speculate time per
  round over the target's verify time on the same machine);
* the outcome distribution P(j) and the coverage curve P(t* among the top F | j) for F = 1..F_j of the widest
  run, and from them the best split of each budget (an exact knapsack over the measured curves: in-sample, so an
  upper bound) beside the splits that were run, and the router's `FanoutPolicy` replayed at each budget over the
  widest run's lookups in order (its split learnt online, out of sample: with one miss curve for all outcome
  positions and with each position's own scale);
* the draft's time per round split into its glue forward and its branch steps, and the tokens a round commits
  by where its speculation came from (cache entry or JIT).

    python bench/fanout.py [--prompts 8] [--new-tokens 48] [--budgets 8,16,32,64] [--splits uniform,geometric]
                           [--coverage-budget 128] [--batches 1] [--k 3] [--threads 1] [--out bench/results/fanout.json]

Hit rates are counts: they do not depend on the machine's load. Times are ratios within one run.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))


from pair import add_pair_args, load_pair  # noqa: E402
from ssd.engine.speculative import SpecConfig, SpeculativeEngine  # noqa: E402
from ssd.engine.stats import SpecStats  # noqa: E402
from ssd.prompts import PROMPTS_BY_KIND  # noqa: E402
from ssd.sampling import SamplingParams  # noqa: E402
from ssd.spec.fanout import FanoutPolicy, default_fanout, geometric_fanout, uniform_fanout  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "fanout.json"


def _mean(xs):
    return sum(xs) / len(xs) if xs else 0.0


class Probe:
    """Wraps one engine's cache lookup and draft/target calls to record ranks and times."""

    def __init__(self, engine: SpeculativeEngine, k: int):
        self.k = k
        self.lookups: list[tuple[int, int | None, int, str]] = []   # (j, rank of t* or None, forks at j, reason)
        ids = getattr(engine.draft.model, "vocab_ids", None)
        self.vocab = set(ids.tolist()) if ids is not None else None   # a feature draft proposes only these
        self.outside_vocab = 0                                       # outcomes whose t* no fork can be
        self.sequence: list[tuple[int, int, str]] = []   # every lookup in order: (seq, j, reason)
        self.speculate: list[float] = []
        self.glue: list[float] = []
        self.branches: list[float] = []
        self.verify: list[float] = []
        cache, draft, target = engine.core.cache, engine.draft, engine.target
        inner_lookup = cache.lookup

        def lookup(seq_id, rnd, j, t):
            state = cache._seqs.get(seq_id)
            ranks = [e.token for (a, _), e in state.entries.items() if a == j] if state is not None else []
            entry, reason = inner_lookup(seq_id, rnd, j, t)
            self.sequence.append((seq_id, j, reason.value))
            if reason.value in ("hit", "no_entry"):
                self.outside_vocab += self.vocab is not None and t not in self.vocab
                self.lookups.append((j, ranks.index(t) if t in ranks else None, len(ranks), reason.value))
            return entry, reason

        cache.lookup = lookup
        self._timed(draft, "speculate", lambda w, dt: self.speculate.append(w.last_speculate_s))
        self._timed(draft, "_glue_with_features", lambda w, dt: self.glue.append(dt))
        self._timed(draft, "_grow_branches", lambda w, dt: self.branches.append(dt))
        self._timed(target, "verify", lambda w, dt: self.verify.append(w.last_verify_s))

    @staticmethod
    def _timed(worker, name, record):
        inner = getattr(worker, name, None)
        if inner is None:
            return

        def wrapped(*args, **kwargs):
            t0 = time.perf_counter()
            out = inner(*args, **kwargs)
            record(worker, time.perf_counter() - t0)
            return out
        setattr(worker, name, wrapped)   # an instance attribute shadows the method for this worker only


def run_config(target, draft, prompts, fanout, k, new_tokens, batch=1, online=False) -> dict:
    """One engine over the prompts, `batch` at a time; `online`: the router's FanoutPolicy sizes each round's
    fan-out (from the draft's own, `fanout`), as in the services."""
    spec = SpecConfig(mode="ssd", k=k, fanout=tuple(fanout), adaptive_fanout=online)
    engine = SpeculativeEngine(target, draft, spec, max_batch=batch)
    probe = Probe(engine, k)
    sent = []   # online: the budget of every DraftRound's fan-out
    if online:
        planner, inner = engine.core.planner, engine.core.planner.round_fanouts

        def round_fanouts(d, *args):
            f = inner(d, *args)
            sent.append(max(map(sum, f.values()), default=0))   # every length's split sums to the same budget
            return f
        planner.round_fanouts = round_fanouts
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    stats, outputs = SpecStats(), []
    t0 = time.perf_counter()
    for i in range(0, len(prompts), batch):
        for seq in engine.generate(prompts[i:i + batch], params):
            stats.merge(seq.stats)
            outputs.append(list(seq.output))
    wall = time.perf_counter() - t0
    lk = probe.lookups
    by_j = []
    for j in range(k + 1):
        at = [x for x in lk if x[0] == j]
        by_j.append({"lookups": len(at), "hits": sum(x[3] == "hit" for x in at),
                     "hit_rate": round(sum(x[3] == "hit" for x in at) / len(at), 4) if at else None})
    spec_s, verify_s = _mean(probe.speculate), _mean(probe.verify)
    after = {"hit": [], "miss": []}   # tokens a round committed, by where its speculation came from
    last: dict = {}
    for seq, j, reason in probe.sequence:
        if seq in last:
            after["hit" if last[seq] == "hit" else "miss"].append(j + 1)
        last[seq] = reason
    row = {"fanout": list(fanout), "budget": sum(fanout), "wall_s": round(wall, 1), "lookups": len(lk),
           "hit_rate": round(sum(x[3] == "hit" for x in lk) / len(lk), 4) if lk else 0.0,
           "t_star_outside_draft_vocab": probe.outside_vocab,
           "by_j": by_j, "tokens_per_round_from": {"cache": round(_mean(after["hit"]), 3),
                                                    "jit": round(_mean(after["miss"]), 3)},
           "cache": dict(stats.cache), "tokens_per_round": round(stats.tokens_per_round, 4),
           "acceptance_per_position": [round(x, 4) for x in stats.acceptance_per_position],
           "speculate_s": round(spec_s, 5), "glue_s": round(_mean(probe.glue), 5),
           "branches_s": round(_mean(probe.branches), 5), "verify_s": round(verify_s, 5),
           "speculate_over_verify": round(spec_s / verify_s, 3) if verify_s else None,
           "stepwise_glues": engine.draft.stepwise_glues}
    if online:
        policy = next(iter(engine.core.planner._fanout.values()))
        row["online"] = {"mean_forks_per_sequence": round(_mean(sent), 1), "last": sent[-1] if sent else None,
                         "forks_per_round": policy.budget,
                         "last_fanout": policy.fanout(), "acceptance": [round(a, 3) for a in policy.acceptance()],
                         "r": round(policy.exponent(), 3)}
    return row, lk, outputs


def coverage(lookups, k: int) -> dict:
    """P(j) and P(t* ranked < F | j) for F = 1..the fewest forks published at j in these lookups."""
    n = len(lookups)
    out = {"p_j": [], "curve": []}
    for j in range(k + 1):
        at = [x for x in lookups if x[0] == j]
        width = min((x[2] for x in at), default=0)
        out["p_j"].append(round(len(at) / n, 4) if n else 0.0)
        out["curve"].append([round(sum(1 for x in at if x[1] is not None and x[1] < f) / len(at), 4)
                             for f in range(1, width + 1)] if at else [])
    return out


def best_split(cov: dict, budget: int) -> tuple[list[int], float]:
    """The split of `budget` that maximises sum_j P(j) curve_j(F_j) within the measured widths (a small knapsack,
    solved exactly), and that hit rate."""
    p, curve = cov["p_j"], cov["curve"]
    best = {0: (0.0, [])}                       # forks used -> (hit rate, split so far)
    for j in range(len(p)):
        nxt = {}
        for used, (hit, fan) in best.items():
            for f in range(min(len(curve[j]), budget - used) + 1):
                h = hit + p[j] * (curve[j][f - 1] if f else 0.0)
                if h > nxt.get(used + f, (-1.0,))[0]:
                    nxt[used + f] = (h, fan + [f])
        best = nxt
    hit, fan = max(best.values(), key=lambda x: (x[0], -sum(x[1])))
    return fan, round(hit, 4)


def replay(lookups, k: int, budget: int, per_position: bool) -> tuple[float, list[int]]:
    """The router's `FanoutPolicy` split at a fixed `budget`, replayed over recorded lookups in their order (each
    lookup's fan-out chosen from what came before it, as online; hit when t* ranks below the forks its j got,
    within the widths recorded): its hit rate and last split. `per_position`: the policy's own miss scale per
    outcome position (else one curve for all positions, as before 2026-12-04)."""
    policy, hits, fan = FanoutPolicy(k, budget), 0, []
    for j, rank, width, _ in lookups:
        fan = policy.fanout()
        forks = min(fan[j], width)
        hit = rank is not None and rank < forks
        hits += hit
        policy.observe_outcome(j, k)
        if fan[j] > 0:
            policy.observe_lookup(fan[j], hit, j if per_position else None)
    return round(hits / len(lookups), 4) if lookups else 0.0, fan


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_pair_args(ap, RESULTS)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--budgets", default="8,16,32,64")
    ap.add_argument("--splits", default="uniform,geometric")
    ap.add_argument("--acceptance", type=float, default=0.47, help="a for the geometric split")
    ap.add_argument("--r", type=float, default=1.0, help="power-law exponent for the geometric split")
    ap.add_argument("--coverage-budget", type=int, default=128,
                    help="one more uniform run this wide, for the coverage curve (0: the widest of the others)")
    ap.add_argument("--batches", default="1", help="prompts generated at once, each run at each (at least that many "
                                                   "prompts are used)")
    args = ap.parse_args()
    target, draft, tok = load_pair(args)
    batches = [int(b) for b in args.batches.split(",")]
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]))
               for _, p in PROMPTS_BY_KIND[:max(args.prompts, *batches)]]
    splits = {"uniform": lambda b: uniform_fanout(args.k, b),
              "geometric": lambda b: geometric_fanout(args.k, b, args.acceptance, args.r),
              "default": lambda b: default_fanout(args.k, b),     # what a draft runs when told nothing
              "online": lambda b: default_fanout(args.k, b)}      # that, then the router's FanoutPolicy
    runs, widest, reference = [], None, None
    plan = [(batch, int(b), split) for batch in batches for b in args.budgets.split(",")
            for split in args.splits.split(",")]
    if args.coverage_budget:
        plan.append((1, args.coverage_budget, "uniform"))
    for batch, budget, split in plan:
        fan = splits[split](budget)
        used = prompts[:max(args.prompts, batch)]
        row, lk, outputs = run_config(target, draft, used, fan, args.k, args.new_tokens, batch,
                                      online=split == "online")
        row.update(split=split, batch=batch, prompts=len(used))
        reference = reference if reference and len(reference) >= len(outputs) else outputs
        row["outputs_identical"] = outputs == reference[:len(outputs)]   # greedy: every run generates the same
        runs.append(row)
        if batch == 1 and split != "online" and (widest is None or min(fan) > min(widest[0])):
            widest = (fan, lk)
        print(f"b{batch:<3d}{split:9s} {str(fan):18s} hit {row['hit_rate']:.3f} by j "
              f"{[x['hit_rate'] for x in row['by_j']]} tpr {row['tokens_per_round']:.2f} "
              f"spec/verify {row['speculate_over_verify']}", flush=True)
    cov = coverage(widest[1], args.k)
    budgets = sorted({r["budget"] for r in runs if r["batch"] == 1})
    best = {b: best_split(cov, b) for b in budgets}
    replays = {b: {name: replay(widest[1], args.k, b, per) for name, per in (("shared", False), ("per_position", True))}
               for b in budgets if b < sum(widest[0])}
    result = {"date": time.strftime("%Y-%m-%d"), "machine": platform.machine(),
              "config": {"target": str(args.target), "draft": str(args.draft), "prompts": args.prompts,
                         "new_tokens": args.new_tokens, "k": args.k, "threads": args.threads,
                         "command": " ".join(["python bench/fanout.py", *sys.argv[1:]]),
                         "geometric": {"a": args.acceptance, "r": args.r}},
              "runs": runs, "coverage": {"from_fanout": widest[0], **cov,
                                         "lookups": [[j, rank, width] for j, rank, width, _ in widest[1]]},
              "best_split": {str(b): {"fanout": f, "hit_rate": h} for b, (f, h) in best.items()},
              "policy_replay": {str(b): {name: {"hit_rate": h, "last_fanout": f} for name, (h, f) in r.items()}
                                for b, r in replays.items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n| batch | budget | split | fan-out | hit | hit j=0..K | tokens/round | speculate/verify | glue/verify |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        by_j = " / ".join("-" if x["hit_rate"] is None else f"{x['hit_rate']:.2f}" for x in r["by_j"])
        fan = r["fanout"] if "online" not in r else f"{r['fanout']} -> {r['online']['last_fanout']}"
        glue = round(r["glue_s"] / r["verify_s"], 3) if r["verify_s"] else None
        print(f"| {r['batch']} | {r['budget']} | {r['split']} | {fan} | {r['hit_rate']:.3f} | {by_j} | "
              f"{r['tokens_per_round']:.2f} | {r['speculate_over_verify']} | {glue} |")
    print(f"\nP(j) = {cov['p_j']}")
    for j, c in enumerate(cov["curve"]):
        print(f"coverage j={j}: {c}")
    for b, (f, h) in best.items():
        print(f"best split of {b}: {f} -> hit {h}")
    for b, r in replays.items():
        print(f"policy at {b} forks, replayed: " + ", ".join(f"{name} {h:.3f} (last {f})" for name, (h, f) in r.items()))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
