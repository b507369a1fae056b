"""Acceptance and cost of a feature-reading draft against its target.

`chain_acceptance` runs the unrolled forward of `ssd.distill.unroll` over teacher-forced sequences: depth k at
position p is exactly the k-th token the draft proposes when the last verified token sits at p-k+1, so one
forward gives, for every start position in the answers, how many drafted tokens the target's greedy choice
would accept. `measure_cost` times a draft step against a target decode step in one run.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from ssd.distill.corpus import Corpus, make_batch
from ssd.distill.data import DataConfig, generate_shard
from ssd.distill.unroll import unrolled_logits
from ssd.models.decoder import Decoder, ForwardBatch
from ssd.models.eagle import FeatureDraft
from ssd.prompts import KINDS, PROMPTS_BY_KIND
from ssd.sampling import SamplingParams


def _head(model: Decoder) -> torch.Tensor:
    return model.embed if model.lm_head is None else model.lm_head


@torch.no_grad()
def chain_acceptance(draft: FeatureDraft, seqs, depth: int = 6, head: torch.Tensor | None = None,
                     target_norm=None, batch: int = 8, seq_len: int = 1024, t1: bool = False) -> dict:
    """`seqs`: (tokens, features, prompt_len, kind) as in `Corpus`. `head`/`target_norm`: the target's full
    output layer and final norm (default: the draft's embedding and norm, right for a tied-embedding target).
    Returns conditional acceptance per depth, accepted-length histogram, per-kind figures, and with `t1` the
    expected acceptance at temperature 1 (sum of min(p, q)) per depth along the same contexts."""
    head = draft.embed if head is None else head
    norm = draft.norm if target_norm is None else target_norm
    lengths: dict[str, list[int]] = {k: [] for k in KINDS}
    t1_sum = [0.0] * depth
    t1_n = 0
    for i in range(0, len(seqs), batch):
        chunk = seqs[i:i + batch]
        toks, feats, valid, answer = make_batch(chunk, seq_len, draft.embed.device)
        logits = unrolled_logits(draft, toks, feats, depth)
        tfull = F.linear(norm(feats), head).float()          # target logits at each position
        # host lists for the walk below (one copy per batch, not one per token on a GPU)
        labels = tfull.argmax(-1).tolist()                    # the target's greedy next token after p
        preds = [draft.vocab_ids[lg.argmax(-1)].tolist() for lg in logits]
        counts = valid.sum(-1).tolist()
        T = toks.shape[1]
        for b, (_, _, plen, kind) in enumerate(chunk):
            n = counts[b]
            starts = range(max(0, plen - 1), n - depth + 1)
            for s in starts:
                L = 0
                while L < depth and preds[L][b][s + L] == labels[b][s + L]:
                    L += 1
                lengths[KINDS[kind]].append(L)
        if t1:
            # depth k+1 at position p and the target at p predict the same token (the one after p); the
            # chain then starts at p - k, which must lie in the answer like the greedy starts above
            p = torch.softmax(tfull, -1)[..., draft.vocab_ids]
            start_ok = answer & valid
            start_ok[:, -depth:] = False
            for k, lg in enumerate(logits):
                ov = torch.minimum(p, torch.softmax(lg.float(), -1)).sum(-1)
                m = torch.zeros_like(start_ok)
                m[:, k:] = start_ok[:, :T - k]
                t1_sum[k] += float((ov * m).sum())
            t1_n += int(start_ok.sum())
    return summarize(lengths, depth, [s / max(1, t1_n) for s in t1_sum] if t1 else None)


def summarize(lengths: dict[str, list[int]], depth: int, t1: list[float] | None = None) -> dict:
    every = [x for v in lengths.values() for x in v]

    def stats(ls: list[int]) -> dict:
        if not ls:
            return {}
        reach = [sum(1 for x in ls if x >= k) for k in range(depth + 1)]
        cond = [reach[k] / reach[k - 1] if reach[k - 1] else 0.0 for k in range(1, depth + 1)]
        per_k = {K: 1 + sum(min(x, K) for x in ls) / len(ls) for K in range(1, depth + 1)}
        return {"positions": len(ls), "conditional": [round(c, 4) for c in cond],
                "tokens_per_round": {str(K): round(v, 4) for K, v in per_k.items()},
                "a_fit_k3": round(fit_a(per_k[min(3, depth)], min(3, depth)), 4)}

    out = stats(every)
    out["by_kind"] = {k: stats(v) for k, v in lengths.items() if v}
    if t1 is not None:
        out["t1_expected_acceptance"] = [round(x, 4) for x in t1]
    return out


def fit_a(tokens_per_round: float, k: int) -> float:
    """The per-token acceptance a with (1 - a^(k+1)) / (1 - a) = tokens_per_round (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        a = (lo + hi) / 2
        e = (1 - a ** (k + 1)) / (1 - a) if a < 1 else k + 1
        lo, hi = (a, hi) if e < tokens_per_round else (lo, a)
    return (lo + hi) / 2


@torch.no_grad()
def measure_cost(target: Decoder, draft: Decoder, batch: int = 1, context: int = 256, steps: int = 30,
                 threads: int | None = None) -> dict:
    """Median time of one decode step (forward + logits over the full vocabulary) of the target and of the
    draft at `batch` rows with `context` tokens of KV, interleaved in one run; returns both and the ratio."""
    if threads:
        torch.set_num_threads(threads)
    times: dict[str, list[float]] = {"target": [], "draft": []}
    models = {"target": target, "draft": draft}
    caches = {n: m.make_cache(batch, context + steps + 8) for n, m in models.items()}
    for n, m in models.items():
        slots = [caches[n].allocate() for _ in range(batch)]
        for s in slots:
            caches[n].ensure(s, context + steps + 2)
        fb = ForwardBatch.ragged([[1] * context for _ in range(batch)], [0] * batch, slots)
        if m.reads_features:
            fb.features = torch.zeros(batch, context, m.feature_size)
        m(fb, caches[n])
    for i in range(steps):
        for n, m in models.items():
            fb = ForwardBatch.ragged([[7] for _ in range(batch)], [context + i] * batch, list(range(batch)))
            if m.reads_features:
                fb.features = torch.randn(batch, 1, m.feature_size)
            t = time.perf_counter()
            m.logits(m(fb, caches[n])[:, -1])
            times[n].append(time.perf_counter() - t)
    med = {n: statistics.median(v[3:]) for n, v in times.items()}
    return {"batch": batch, "context": context, "target_ms": round(med["target"] * 1e3, 3),
            "draft_ms": round(med["draft"] * 1e3, 3), "ratio": round(med["draft"] / med["target"], 4)}


def held_out_sequences(target: Decoder, tokenizer, max_new_tokens: int = 192, batch: int = 20,
                       limit: int | None = None) -> list:
    """The target's greedy answers (with features) to the held-out prompts of `ssd.prompts` (the first `limit`
    of them), as Corpus rows."""
    items = [(i, kind, text) for i, (kind, text) in enumerate(PROMPTS_BY_KIND)][:limit]
    cfg = DataConfig(max_new_tokens=max_new_tokens, batch=batch, sampled_every=0)
    return Corpus.from_shards([generate_shard(target, tokenizer, items, cfg)]).seqs


def engine_tokens_per_round(target: Decoder, draft: Decoder, prompts: list[list[int]], k: int,
                            max_tokens: int) -> dict:
    """Tokens per round and acceptance measured by the in-process SD engine (greedy), the product's own path.
    With the held-out prompts and their answers' length it decodes the same positions `chain_acceptance`
    scores (the last rounds of each answer are cut short by max_tokens)."""
    from ssd.engine.speculative import SpecConfig, SpeculativeEngine

    engine = SpeculativeEngine(target, draft, SpecConfig(mode="sd", k=k), max_batch=len(prompts))
    seqs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens))
    st = engine.stats
    drafted = sum(st.offered[:1]) or 1
    return {"k": k, "rounds": st.rounds, "tokens": st.tokens, "tokens_per_round": round(st.tokens / max(1, st.rounds), 4),
            "first_token_acceptance": round(st.accepted[0] / drafted, 4),
            "outputs": [s.output for s in seqs]}


def evaluate_draft(target: Decoder, draft: FeatureDraft, tokenizer, history: dict | None = None,
                   max_new_tokens: int = 192, log=print) -> dict:
    """Everything `bench/results/draft.json` reports, measured in one run."""
    log("evaluate: the target answers the held-out prompts")
    seqs = held_out_sequences(target, tokenizer, max_new_tokens)
    log("evaluate: chained acceptance (greedy and temperature 1)")
    acc = chain_acceptance(draft, seqs, depth=6, head=_head(target), target_norm=target.norm, t1=True)
    log("evaluate: cost per token against the target")
    cost = [measure_cost(target, draft, batch=b, steps=24) for b in (1, 8)]
    prompts = [list(t[:plen]) for t, _, plen, _ in seqs]
    log("evaluate: the in-process SD engine at K=3")
    eng = engine_tokens_per_round(target, draft, prompts, 3, max_new_tokens)
    trainable = sum(p.numel() for n, p in draft.named_parameters()
                    if n.startswith(("fc_", "feature_norm", "embed_norm", "layers.")))
    result = {
        "acceptance_greedy": acc["a_fit_k3"],
        "acceptance_greedy_definition": "per-token acceptance a with (1 - a^4) / (1 - a) = measured tokens per "
                                        "round at K = 3 (greedy, held-out prompts)",
        "first_token_acceptance": acc["conditional"][0],
        "conditional_acceptance_by_depth": acc["conditional"],
        "acceptance_t1": round(sum(acc["t1_expected_acceptance"][:3]) / 3, 4),
        "acceptance_t1_by_depth": acc["t1_expected_acceptance"],
        "acceptance_t1_definition": "mean over depths 1..3 of the expected acceptance sum_x min(p(x), q(x)) at "
                                    "temperature 1, along the greedy answers' contexts",
        "tokens_per_round": acc["tokens_per_round"],
        "by_kind": {k: {"acceptance_greedy": v["a_fit_k3"], "first_token_acceptance": v["conditional"][0],
                        "tokens_per_round_k3": v["tokens_per_round"]["3"], "positions": v["positions"]}
                    for k, v in acc["by_kind"].items()},
        "cost_ratio": cost[0]["ratio"],
        "cost": cost,
        "engine_sd_k3": {k: v for k, v in eng.items() if k != "outputs"},
        "acceptance_greedy_engine": round(fit_a(eng["tokens_per_round"], 3), 4),
        "params": trainable,
        "params_total_with_shared": sum(p.numel() for p in draft.parameters()),
        "draft_vocab": int(draft.vocab_ids.numel()),
        "held_out_positions": acc["positions"],
    }
    if history:
        result["train_minutes"] = round(history.get("seconds", 0.0) / 60, 1)
        result["train_tokens"] = history.get("train_tokens")
        result["vocab_cover_train"] = history.get("vocab_cover")
        result["curve"] = [{"step": r["step"], "minutes": round(r["minutes"], 1), "held_out_conditional": r["held_out"]}
                           for r in history.get("log", []) if "held_out" in r]
        result["train_config"] = history.get("config")
    return result
