"""gpu_check part 2, the bandwidth bound: device-to-device copy bandwidth, and the AR decode step (eager and CUDA
graph) at several batch sizes against weight bytes / bandwidth."""
from __future__ import annotations

import statistics
import time

import torch

from bench.gpu.models import prompts_for, sync
from ssd.models.decoder import Decoder, ForwardBatch
from ssd.models.kv_cache import DEFAULT_BLOCK_SIZE, blocks_for


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
