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
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from ssd.config import ModelConfig  # noqa: E402
from ssd.models.decoder import Decoder, ForwardBatch  # noqa: E402
from ssd.models.kv_cache import DEFAULT_BLOCK_SIZE, blocks_for  # noqa: E402

SEED = 1234


def qwen3_8b(layers: int = 36) -> ModelConfig:
    return ModelConfig("qwen3", 151936, 4096, 12288, layers, 32, 8, 128, rms_norm_eps=1e-6, rope_theta=1e6,
                       max_position_embeddings=4096, name="qwen3-8b-size")


CONFIGS = {
    "qwen3-small": ModelConfig("qwen3", 4096, 512, 1536, 4, 8, 4, 64, rope_theta=1e6, max_position_embeddings=2048,
                               name="qwen3-small"),
    "llama-small": ModelConfig("llama", 4096, 512, 1408, 4, 8, 2, 64, rms_norm_eps=1e-5, rope_theta=5e5,
                               max_position_embeddings=2048, name="llama-small"),
}
SMOKE = {
    "qwen3-tiny": ModelConfig("qwen3", 256, 64, 128, 2, 4, 2, 16, max_position_embeddings=512, name="qwen3-tiny"),
    "llama-tiny": ModelConfig("llama", 256, 64, 128, 2, 4, 2, 16, max_position_embeddings=512, name="llama-tiny"),
}


def random_model(cfg: ModelConfig, device, dtype, deep_scale: float = 1.0, keep: int = 2) -> Decoder:
    """Weights drawn per parameter name (so a model with fewer layers shares the others' weights exactly).
    `deep_scale` scales what layers `keep`.. add to the residual stream (their o and down projections): a
    model of the first `keep` layers then agrees with this one more often the smaller it is (0: always)."""
    with torch.device("meta"):
        model = Decoder(cfg)
    model = model.to_empty(device=device)
    for name, p in model.named_parameters():
        g = torch.Generator(device=device).manual_seed(SEED + zlib.crc32(name.encode()))
        w = torch.randn(p.shape, generator=g, device=device, dtype=torch.float32)
        if name.endswith("norm.weight"):
            w = 1.0 + 0.1 * w
        else:
            w = w * (0.02 if "embed" not in name else 1.0)
        if deep_scale != 1.0 and name.startswith("layers.") and int(name.split(".")[1]) >= keep \
                and name.endswith(("o_weight", "down_weight")):
            w = w * deep_scale
        p.data = w.to(dtype)
        del w
    model._rope = None
    return model.eval().requires_grad_(False)


def copy_model(src: Decoder, device, dtype) -> Decoder:
    with torch.device("meta"):
        model = Decoder(src.cfg)
    model = model.to_empty(device=device)
    for (name, p), q in zip(model.named_parameters(), src.parameters()):
        p.data = q.detach().to(device=device, dtype=dtype)
    model._rope = None
    return model.eval().requires_grad_(False)


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def prompts_for(cfg: ModelConfig, batch: int, length: int, seed: int = 7) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, cfg.vocab_size, (length + 3 * b,), generator=g).tolist() for b in range(batch)]


@torch.inference_mode()
def greedy(model: Decoder, prompts: list[list[int]], steps: int, graph: str = "off"):
    """Prefill, then `steps` greedy decode steps; graph: off (ordinary forward), eager (the static step run
    eagerly) or on (CUDA graph). Returns tokens per row and the first step's logits (float32, CPU)."""
    from ssd.models.cuda_graph import GraphRunner
    dev = model.embed.device
    B = len(prompts)
    max_len = max(len(p) for p in prompts) + steps + 2
    cache = model.make_cache(B, max_len, num_blocks=B * blocks_for(max_len, DEFAULT_BLOCK_SIZE))
    forward = model if graph == "off" else GraphRunner(model, cache, B, graphs=graph == "on")
    slots = list(range(B))
    h = model(ForwardBatch.ragged(prompts, [0] * B, slots, dev), cache)
    last = torch.tensor([len(p) - 1 for p in prompts], device=dev)
    logits = model.logits(h[torch.arange(B, device=dev), last])
    first = logits.float().cpu()
    toks, pos, out = logits.argmax(-1).tolist(), [len(p) for p in prompts], []
    out.append(toks)
    for _ in range(steps):
        logits = model.logits(forward(ForwardBatch.ragged([[t] for t in toks], pos, slots, dev), cache)[:, -1])
        toks, pos = logits.argmax(-1).tolist(), [p + 1 for p in pos]
        out.append(toks)
    return [list(r) for r in zip(*out)], first


def check_correctness(configs: dict, device: str, steps: int, smoke: bool) -> list[dict]:
    rows = []
    for name, cfg in configs.items():
        big = cfg.hidden_size >= 4096
        t0 = time.perf_counter()
        prompts = prompts_for(cfg, 2, 16)
        src = random_model(cfg, device, torch.bfloat16 if big else torch.float32)
        cpu = copy_model(src, "cpu", torch.float32)
        ref_tokens, ref_logits = greedy(cpu, prompts, steps)
        del cpu
        variants = [] if big else [("fp32", torch.float32, "off")]
        variants += [("bf16", torch.bfloat16, "off")]
        if device == "cuda" or smoke:
            variants += [("bf16+static", torch.bfloat16, "eager")]
        if device == "cuda":
            variants += [("bf16+graph", torch.bfloat16, "on")]
        static_bf16 = None
        for label, dtype, graph in variants:
            model = src if src.embed.dtype == dtype else copy_model(src, device, dtype)
            tokens, logits = greedy(model, prompts, steps, graph)
            same = sum(a == b for r, q in zip(tokens, ref_tokens) for a, b in zip(r, q))
            total = sum(len(r) for r in ref_tokens)
            row = {"model": name, "variant": label, "tokens_equal": same, "tokens": total,
                   "max_abs_logit_diff": round(float((logits - ref_logits).abs().max()), 5),
                   "first_step_argmax_equal": bool(torch.equal(logits.argmax(-1), ref_logits.argmax(-1)))}
            row["ok"] = same == total if label == "fp32" else None   # bf16: reported, not required
            if label == "bf16+graph":   # the graph must reproduce its static steps run eagerly, token for token
                row["ok"] = tokens == static_bf16
            if label == "bf16+static":
                static_bf16 = tokens
            rows.append(row)
            print(f"correctness {row}", flush=True)
            if model is not src:
                del model
        del src
        if device == "cuda":
            torch.cuda.empty_cache()
        print(f"  {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    return rows


def copy_bandwidth(device: str, nbytes: int = 2 << 30) -> float:
    """Bytes per second a device-to-device copy moves, counting bytes read and bytes written."""
    x = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    sync(device)
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        y.copy_(x)
        sync(device)
        times.append(time.perf_counter() - t0)
    del x, y
    return 2 * nbytes / statistics.median(times)


@torch.inference_mode()
def time_decode(model: Decoder, batches: list[int], bandwidth: float, prompt_len: int, reps: int,
                graphs: bool) -> list[dict]:
    from ssd.models.cuda_graph import GraphRunner
    dev = model.embed.device
    weight_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if n != "embed")
    if model.lm_head is None:
        weight_bytes += model.embed.numel() * model.embed.element_size()
    bound_ms = 1e3 * weight_bytes / bandwidth
    rows = []
    for B in batches:
        prompts = prompts_for(model.cfg, B, prompt_len, seed=B)
        max_len = max(len(p) for p in prompts) + 2 * reps + 8
        for mode in (["eager", "graph"] if graphs else ["eager"]):
            cache = model.make_cache(B, max_len, num_blocks=B * blocks_for(max_len, DEFAULT_BLOCK_SIZE))
            forward = GraphRunner(model, cache, B, graphs=True) if mode == "graph" else model
            slots = list(range(B))
            h = model(ForwardBatch.ragged(prompts, [0] * B, slots, dev), cache)
            toks = model.logits(h[:, -1]).argmax(-1).tolist()
            pos = [len(p) for p in prompts]
            times = []
            for i in range(reps + 3):
                sync(dev)
                t0 = time.perf_counter()
                fb = ForwardBatch.ragged([[t] for t in toks], pos, slots, dev)
                logits = model.logits(forward(fb, cache)[:, -1])
                toks = logits.argmax(-1).tolist()   # the host needs the tokens: a real step syncs here
                times.append(time.perf_counter() - t0)
                pos = [p + 1 for p in pos]
            ms = 1e3 * statistics.median(times[3:])
            rows.append({"batch": B, "mode": mode, "step_ms": round(ms, 3), "tok_s": round(B * 1e3 / ms, 1),
                         "bound_ms": round(bound_ms, 3), "of_bound": round(bound_ms / ms, 3)})
            print(f"decode {rows[-1]}", flush=True)
            del cache, forward
    return rows


# ---- SSD with the draft in a second process -------------------------------------------------------------

def draft_process(conn, cfg_dict: dict, device: str, dtype_name: str, k: int, fanout: list[int], max_seqs: int,
                  max_len: int, graphs: str = "auto") -> None:
    """The draft service's handler (ssd.engine.draft_handler) over a pipe: each batch of messages is handled as
    the service handles one, its replies sent back, then b"end"."""
    from ssd.engine.draft import DraftWorker
    from ssd.engine.draft_handler import DraftHandler
    torch.set_num_threads(1)
    cfg = ModelConfig(**cfg_dict)
    worker = DraftWorker(random_model(cfg, device, getattr(torch, dtype_name)), max_seqs, max_len, k, fanout,
                         cuda_graphs=graphs)

    class PipeEndpoint:
        def send(self, peer, msg) -> None:
            _send(conn, msg)

    handler = DraftHandler(worker, PipeEndpoint())
    conn.send_bytes(b"ready")
    while True:
        batch = []
        while True:
            frames = conn.recv_bytes()
            if frames == b"stop":
                return
            if frames == b"batch":
                break
            batch.append((b"router", _decode(frames)))
        handler.handle(batch)
        conn.send_bytes(b"end")


def _send(conn, msg) -> None:
    from ssd import wire
    head, body = wire.encode(msg)
    conn.send_bytes(head + body)


def _decode(frames: bytes):
    from ssd import wire
    return wire.decode([frames[:1], frames[1:]])


def two_process_engine(target: Decoder, draft_cfg: ModelConfig, conn, k: int, max_batch: int, max_len: int,
                       graphs: str = "auto"):
    """The in-process engine (the shipped round core) whose draft handle carries its messages to the draft
    process: the draft speculates while the target verifies, as in the services."""
    from ssd import wire
    from ssd.engine.speculative import LocalWorker, SpecConfig, SpeculativeEngine

    class PipeDraft(LocalWorker):
        def __init__(self, ready):
            self.role, self.address, self.alive, self.ready = "draft", "draft process", True, ready
            self.inbox, self.pending, self.handler = [], False, None
            self.timing = {"rounds": 0, "verify_s": 0.0, "wait_s": 0.0, "draft_s": 0.0}
            self._sent_at = 0.0

        def deliver(self) -> list:
            batch, self.inbox = self.inbox, []
            for msg in batch:
                _send(conn, msg)
            if batch:
                conn.send_bytes(b"batch")
                self.pending, self._sent_at = True, time.perf_counter()
            return batch

        def replies(self) -> list:
            if not self.pending:
                return []
            t0, out = time.perf_counter(), []
            while (frames := conn.recv_bytes()) != b"end":
                out.append(_decode(frames))
            self.pending = False
            t = self.timing
            rounds = [m for m in out if isinstance(m, wire.CacheEntries)]
            if rounds:
                t["rounds"] += 1
                t["verify_s"] += t0 - self._sent_at            # the target's share while the draft worked
                t["wait_s"] += time.perf_counter() - t0         # how long the target then waited for the draft
                t["draft_s"] += rounds[0].elapsed_s
            return out

    class TwoProcessSSD(SpeculativeEngine):
        def _draft_handle(self, worker):
            return PipeDraft(self._ready("draft", worker.max_len, 0, self.spec.fanout))

        @property
        def timing(self) -> dict:
            return self.draft_handle.timing

        @timing.setter
        def timing(self, value: dict) -> None:
            self.draft_handle.timing = value

    with torch.device("meta"):
        placeholder = Decoder(draft_cfg)   # the engine builds a DraftWorker, unused: the draft process has its own
    return TwoProcessSSD(target, placeholder, SpecConfig(mode="ssd", k=k), max_batch=max_batch, max_len=max_len,
                         eos_token_ids=(), cuda_graphs=graphs)


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
    from ssd.engine.target import TargetWorker, VerifyItem
    from ssd.sampling import SamplingParams
    from ssd.spec.fanout import uniform_fanout

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
            outs = tw.verify([VerifyItem(s, sp) for s, sp in zip(seqs, specs)])
            sync(device)
            t3 = time.perf_counter()
            for o, sp in zip(outs, specs):
                dw.commit(o.seq_id, list(sp[:o.accepted]) + [o.token])
            if r >= 3:
                times["jit_step"].append((t1 - t0) / k)
                times["speculate"].append(t2 - t1)
                times["verify"].append(t3 - t2)
        row = {"batch": B, "k": k, **{f"{n}_ms": round(1e3 * statistics.median(v), 2) for n, v in times.items()}}
        rows.append(row)
        print(f"parts {row}", flush=True)
        del tw, dw
    return rows


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
