"""gpu_check part 3, speculation on the device: AR, SD and two-process SSD on one target (exactness in fp32, speed
in bf16: `run_spec`), seeded sampling through SD and SSD (`sampling_check`), and the parts of a round timed alone
(`round_parts`)."""
from __future__ import annotations

import statistics
import time

import torch

from bench.gpu.models import prompts_for, random_model, sync
from bench.gpu.two_process import draft_process, two_process_engine
from ssd.config import ModelConfig


def _timed(engine_fn, prompts, params, device) -> tuple[list[list[int]], float, object]:
    """Build an engine, run it on prompts of the same lengths (its graphs are captured then), then time it on
    the prompts (their statistics start there)."""
    engine = engine_fn()
    engine.generate([[(t * 7 + 1) % (engine.vocab_size - 3) + 3 for t in p] for p in prompts], params)
    if hasattr(engine, "stats"):
        engine.stats = type(engine.stats)()
    if hasattr(engine, "timing"):
        engine.timing = dict.fromkeys(engine.timing, 0)
    sync(device)
    t0 = time.perf_counter()
    seqs = engine.generate(prompts, params)
    sync(device)
    return [s.output for s in seqs], time.perf_counter() - t0, engine


def _acceptance(stats) -> float:
    return round(sum(stats.accepted) / max(1, sum(stats.offered)), 3)


def run_spec(cfg: ModelConfig, device: str, dtype, runs: list[tuple[float, int]], new_tokens: int, k: int,
             prompt_len: int, graphs: str = "auto") -> list[dict]:
    """AR, SD (draft in this process) and SSD (draft in a second process) on the same target, every engine with
    its CUDA graphs (`graphs`: auto, or static to run their steps eagerly), for each (deep_scale, batch) of
    `runs`; the draft is the target's first two layers."""
    import dataclasses
    import multiprocessing as mp
    from ssd.engine.ar import AREngine
    from ssd.engine.speculative import SpecConfig, SpeculativeEngine
    from ssd.sampling import SamplingParams
    from ssd.spec.fanout import uniform_fanout

    draft_cfg = dataclasses.replace(cfg, num_layers=2, name="draft-2-layers")
    max_batch = max(b for _, b in runs)
    max_len = prompt_len + 3 * max_batch + new_tokens + 2 * k + 8
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    fanout = uniform_fanout(k, 2 * (k + 1))
    dtype_name = str(dtype).removeprefix("torch.")
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=draft_process, args=(there, dataclasses.asdict(draft_cfg), device, dtype_name, k,
                                                   fanout, max_batch, max_len, graphs), daemon=True)
    proc.start()
    rows = []
    try:
        local_draft = random_model(draft_cfg, device, dtype)
        if not here.poll(300):
            raise RuntimeError("the draft process did not get ready in 300 s")
        here.recv_bytes()
        target, scale_built = None, None
        for scale, batch in runs:
            if scale != scale_built:
                del target
                if device == "cuda":
                    torch.cuda.empty_cache()
                target, scale_built = random_model(cfg, device, dtype, deep_scale=scale), scale
            prompts = prompts_for(cfg, batch, prompt_len, seed=99)
            ar_out, ar_s, _ = _timed(lambda: AREngine(target, max_batch=batch, max_len=max_len, eos_token_ids=(),
                                                      cuda_graphs=graphs), prompts, params, device)
            sd_out, sd_s, sd = _timed(lambda: SpeculativeEngine(target, local_draft, SpecConfig(mode="sd", k=k),
                                                                max_batch=batch, max_len=max_len, eos_token_ids=(),
                                                                cuda_graphs=graphs), prompts, params, device)
            ssd_out, ssd_s, ssd = _timed(lambda: two_process_engine(target, draft_cfg, here, k, batch, max_len,
                                                                    graphs), prompts, params, device)
            total = sum(len(r) for r in ar_out)
            same = lambda out: sum(a == b for r, q in zip(out, ar_out) for a, b in zip(r, q))  # noqa: E731
            row = {"dtype": dtype_name, "deep_scale": scale, "batch": batch, "k": k, "new_tokens": new_tokens,
                   "tokens": total, "sd_equal_ar": same(sd_out), "ssd_equal_ar": same(ssd_out),
                   "ar_tok_s": round(total / ar_s, 1), "sd_tok_s": round(total / sd_s, 1),
                   "ssd_tok_s": round(total / ssd_s, 1), "sd_acceptance": _acceptance(sd.stats),
                   "ssd_acceptance": _acceptance(ssd.stats), "ssd_cache": dict(ssd.stats.cache),
                   "ssd_round_ms": {k.removesuffix("_s"): round(1e3 * v / max(1, ssd.timing["rounds"]), 2)
                                    for k, v in ssd.timing.items() if k != "rounds"},
                   "graphs_target": dataclasses.asdict(ssd.target.forward.stats)
                   if hasattr(ssd.target.forward, "stats") else None}
            row["ok"] = row["sd_equal_ar"] == row["ssd_equal_ar"] == total if dtype == torch.float32 else None
            rows.append(row)
            print(f"spec {row}", flush=True)
        here.send_bytes(b"stop")
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    return rows


def sampling_check(cfg: ModelConfig, device: str, graphs: str = "auto") -> list[dict]:
    """Seeded sampling (temperature 0.8) through SD and SSD in one process on the device, fp32: two runs with
    the graphs give the same tokens (ok), and the tokens of a run with the ordinary forward are reported."""
    import dataclasses
    from ssd.engine.speculative import SpecConfig, SpeculativeEngine
    from ssd.sampling import SamplingParams

    target = random_model(cfg, device, torch.float32, deep_scale=0.05)
    draft = random_model(dataclasses.replace(cfg, num_layers=2), device, torch.float32)
    prompts = prompts_for(cfg, 3, 24, seed=11)
    params = [SamplingParams(max_tokens=32, ignore_eos=True, temperature=0.8, top_p=0.95, seed=100 + b)
              for b in range(len(prompts))]
    rows = []
    for mode in ("sd", "ssd"):
        def run(how):
            engine = SpeculativeEngine(target, draft, SpecConfig(mode=mode, k=3), max_batch=3, max_len=128,
                                       eos_token_ids=(), cuda_graphs=how)
            return [s.output for s in engine.generate(prompts, params)], engine
        a, engine = run(graphs)
        b, _ = run(graphs)
        c, _ = run("off")
        total = sum(len(r) for r in a)
        rows.append({"mode": mode, "tokens": total, "repeat_equal": sum(x == y for r, q in zip(a, b)
                                                                         for x, y in zip(r, q)),
                     "plain_forward_equal": sum(x == y for r, q in zip(a, c) for x, y in zip(r, q)),
                     "acceptance": _acceptance(engine.stats), "ok": a == b and total == 3 * 32})
        print(f"sampling {rows[-1]}", flush=True)
    return rows


@torch.inference_mode()
def round_parts(cfg: ModelConfig, device: str, dtype, batches: list[int], k: int, prompt_len: int,
                rounds: int, graphs: str = "auto") -> list[dict]:
    """The parts of a round timed alone, in one process (no second process on the device): the draft's JIT
    step, its SSD speculate (glue, forks, K branch steps) and the target's verify of K + 1 positions, with the
    graphs on. Against the round times of the two-process runs, this says whether the draft's speculate there is
    slow by itself or slowed by sharing the device with the target's verify."""
    import dataclasses
    from ssd.engine.draft import DraftParams, DraftWorker
    from ssd.engine.target import TargetWorker
    from ssd.sampling import SamplingParams
    from ssd.spec.fanout import uniform_fanout
    from ssd.wire import VerifyItem

    target = random_model(cfg, device, dtype, deep_scale=0.0)
    draft = random_model(dataclasses.replace(cfg, num_layers=2), device, dtype)
    fanout = uniform_fanout(k, 2 * (k + 1))
    rows = []
    for B in batches:
        max_len = prompt_len + 3 * B + (rounds + 4) * (k + 1) + 8
        tw = TargetWorker(target, B, max_len, cuda_graphs=graphs)
        dw = DraftWorker(draft, B, max_len, k, fanout, cuda_graphs=graphs)
        prompts = prompts_for(cfg, B, prompt_len, seed=5)
        firsts = tw.prefill([(b, p, SamplingParams()) for b, p in enumerate(prompts)])
        for b, (p, t) in enumerate(zip(prompts, firsts)):
            dw.add(b, p + [t], DraftParams())
        seqs = list(range(B))
        times = {"jit_step": [], "speculate": [], "verify": []}
        for r in range(rounds + 3):
            sync(device)
            t0 = time.perf_counter()
            specs = [sp.tokens for sp in dw.jit(seqs, k)]
            sync(device)
            t1 = time.perf_counter()
            dw.speculate(list(zip(seqs, specs)))
            sync(device)
            t2 = time.perf_counter()
            outs = tw.verify([VerifyItem(s, sp, None) for s, sp in zip(seqs, specs)])
            sync(device)
            t3 = time.perf_counter()
            for o, sp in zip(outs, specs):
                dw.commit(o.seq, list(sp[:o.accepted]) + [o.token])
            if r >= 3:
                times["jit_step"].append((t1 - t0) / k)
                times["speculate"].append(t2 - t1)
                times["verify"].append(t3 - t2)
        row = {"batch": B, "k": k, **{f"{n}_ms": round(1e3 * statistics.median(v), 2) for n, v in times.items()}}
        rows.append(row)
        print(f"parts {row}", flush=True)
        del tw, dw
    return rows
