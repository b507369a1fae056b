"""The figures of `ssd bench serve`: one request's measurements (`Outcome`), latency statistics and goodput
(`summarize`), speculation statistics from before/after `/metrics` samples or from the final chunks' `ssd`
fields, and the printed table."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

N_ERRORS_SHOWN = 3


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
