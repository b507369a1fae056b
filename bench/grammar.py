"""Grammar engines on CPU: llguidance vs xgrammar on the default target's tokenizer.

Measures, for a JSON schema and for json_object: tokenizer setup, grammar compile, per-token
mask time along a valid token path (mean and p99), and the cost of the accept/rollback that a
verify of K drafted tokens needs (advance K tokens, roll back K). Writes bench/results/grammar.json.

    .venv/bin/python bench/grammar.py [--model DIR] [--out bench/results/grammar.json]

xgrammar is optional (it pulls triton and torch); its figures are skipped when it does not import.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city"]},
    },
    "required": ["name", "age", "tags"],
}
DOCUMENT = '{"name": "Ada Lovelace", "age": 36, "tags": ["math", "engine"], "address": {"city": "London"}}'
K = 4


def _stats(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {"mean_us": round(statistics.fmean(ordered) * 1e6, 1),
            "p99_us": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e6, 1)}


def bench_llguidance(model: Path, ids: list[int], eos: int) -> dict:
    import llguidance
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    t0 = time.perf_counter()
    tok = llguidance.LLTokenizer((model / "tokenizer.json").read_text(), eos_token=eos)
    out = {"version": llguidance.__version__, "tokenizer_setup_ms": round((time.perf_counter() - t0) * 1e3, 1)}
    for kind, grammar in (("json_schema", llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)),
                          ("json_object", llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}))):
        t0 = time.perf_counter()
        m = llguidance.LLMatcher(tok, grammar, log_level=0)
        compile_ms = (time.perf_counter() - t0) * 1e3
        assert not m.is_error(), m.get_error()
        mask = allocate_token_bitmask(1, tok.vocab_size)
        masks = []
        for token in ids:
            t0 = time.perf_counter()
            fill_next_token_bitmask(m, mask)
            masks.append(time.perf_counter() - t0)
            assert (int(mask[0, token // 32]) >> (token % 32)) & 1, "valid token masked out"
            assert m.consume_token(token)
        m.reset()
        rounds = []
        for start in range(0, len(ids) - K, K):
            m.reset()
            if start:
                m.consume_tokens(ids[:start])
            t0 = time.perf_counter()
            for token in ids[start:start + K]:
                fill_next_token_bitmask(m, mask)
                m.consume_token(token)
            fill_next_token_bitmask(m, mask)
            m.rollback(K)
            rounds.append(time.perf_counter() - t0)
        out[kind] = {"compile_ms": round(compile_ms, 2), "mask": _stats(masks),
                     f"verify_k{K}_masks_and_rollback": _stats(rounds)}
    return out


def bench_xgrammar(model: Path, ids: list[int]) -> dict:
    try:
        import xgrammar as xgr
        from transformers import AutoTokenizer
    except Exception as err:  # noqa: BLE001  (optional engine)
        return {"skipped": f"{type(err).__name__}: {err}"}
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(model))
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    out = {"tokenizer_setup_ms": round((time.perf_counter() - t0) * 1e3, 1)}
    for kind, make in (("json_schema", lambda: compiler.compile_json_schema(json.dumps(SCHEMA))),
                       ("json_object", lambda: compiler.compile_builtin_json_grammar())):
        t0 = time.perf_counter()
        compiled = make()
        compile_ms = (time.perf_counter() - t0) * 1e3
        m = xgr.GrammarMatcher(compiled, max_rollback_tokens=K + 1)
        mask = xgr.allocate_token_bitmask(1, info.vocab_size)
        masks = []
        for token in ids:
            t0 = time.perf_counter()
            m.fill_next_token_bitmask(mask)
            masks.append(time.perf_counter() - t0)
            assert (int(mask[0, token // 32]) >> (token % 32)) & 1, "valid token masked out"
            assert m.accept_token(token)
        rounds = []
        for start in range(0, len(ids) - K, K):
            m.reset()
            for token in ids[:start]:
                m.accept_token(token)
            t0 = time.perf_counter()
            for token in ids[start:start + K]:
                m.fill_next_token_bitmask(mask)
                m.accept_token(token)
            m.fill_next_token_bitmask(mask)
            m.rollback(K)
            rounds.append(time.perf_counter() - t0)
        out[kind] = {"compile_ms": round(compile_ms, 2), "mask": _stats(masks),
                     f"verify_k{K}_masks_and_rollback": _stats(rounds)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("/tmp/ssd-test-models/smollm2-135m-instruct"))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "grammar.json")
    args = parser.parse_args()
    from ssd.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_folder(args.model)
    ids = tokenizer.encode(DOCUMENT)
    eos = sorted(tokenizer.eos_token_ids)[0]
    result = {"model": args.model.name, "vocab": tokenizer.vocab_size, "document_tokens": len(ids), "k": K,
              "llguidance": bench_llguidance(args.model, ids, eos), "xgrammar": bench_xgrammar(args.model, ids)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
