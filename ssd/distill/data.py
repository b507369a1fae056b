"""Teacher data: the target answers synthesised prompts, and its final pre-norm hidden state is kept for every
token (prompt and answer), the features a feature-reading draft learns from.

Output is a folder of shards `shard-NNNNN.safetensors`, each holding `tokens` (int32, all sequences
concatenated), `offsets` (int64, sequence starts, with the end last), `prompt_lens` (int32), `kinds` (uint8,
index into KINDS) and `features` (fp16, one row per token but each sequence's last). A shard is written
atomically once its prompts are answered, so an interrupted run resumes at the first missing shard and the
result does not depend on where it stopped (prompts and sampling seeds are fixed by the seed and the index).
Several processes may generate into one folder (one core each): a process claims a shard before answering it
(`shard-NNNNN.claim`, created exclusively, holding its pid) and skips shards another live process has claimed;
a claim whose process is gone is taken over.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ssd.engine.ar import AREngine
from ssd.models.decoder import padded
from ssd.params import SamplingParams
from ssd.prompts import KINDS
from ssd.tokenizer import Tokenizer
from ssd.distill.prompts import training_prompts


@dataclass
class DataConfig:
    prompts: int = 4000
    shard_size: int = 128
    max_new_tokens: int = 256
    batch: int = 64
    sampled_every: int = 3      # every n-th prompt is answered at temperature `temperature`, the rest greedily
    temperature: float = 1.0
    seed: int = 0
    extra_layers: tuple[int, ...] = (2, 15)   # also keep these decoder layers' outputs (`features_l{i}`), for
                                              # drafts that fuse several depths of the target (EAGLE-3 style)
    device: str = "cpu"         # where `generate` runs the target (fp32 either way)
    kv_tokens: int = 0          # the engine's KV capacity in tokens (0: its default; a wide batch needs batch x 1024)
    seconds: float = 0.0        # `generate`'s wall-clock budget: no shard starts that would end past it (0: none)
    first_shard: int = 0        # answer shards from this one on (the earlier prompts went into an earlier run)


class _FeatureTap:
    """Keeps the input of the model's final norm (the pre-norm hidden states) of the last forward, and the outputs
    of the decoder layers in `layers`, each as [B, T, hidden]: a ragged forward carries its real tokens flat
    ([N, hidden], `Decoder.forward`), laid out here by the batch's `valid`."""

    def __init__(self, model, layers: tuple[int, ...] = ()):
        self.last: torch.Tensor | None = None
        self.valid: torch.Tensor | None = None
        self.layer_out: dict[int, torch.Tensor] = {}
        self.handles = [model.register_forward_pre_hook(self._batch_hook),
                        model.norm.register_forward_pre_hook(self._hook)]
        for i in layers:
            self.handles.append(model.layers[i].register_forward_hook(self._layer_hook(i)))

    def _batch_hook(self, module, args):
        self.valid = getattr(args[0], "valid", None) if args else None

    def _hook(self, module, args):
        self.last = args[0].detach()

    def _layer_hook(self, i):
        def hook(module, args, out):
            self.layer_out[i] = (out[0] if isinstance(out, tuple) else out).detach()
        return hook

    def rows(self) -> dict[str, torch.Tensor]:
        out = {"features": self.last}
        out.update({f"features_l{i}": x for i, x in self.layer_out.items()})
        return {name: padded(x, self.valid) if x.dim() == 2 else x for name, x in out.items()}

    def close(self):
        for h in self.handles:
            h.remove()


def chat_ids(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))


def generate_shard(model, tok: Tokenizer, items: list[tuple[int, str, str]], cfg: DataConfig) -> dict:
    """Answer `items` (index, kind, prompt) with continuous batching; returns the shard's tensors."""
    # no CUDA graphs: the hooks must see every forward (a replayed graph runs none)
    engine = AREngine(model, max_batch=cfg.batch, max_len=1024, prefix_caching=False, kv_tokens=cfg.kv_tokens,
                      cuda_graphs="off")
    tap = _FeatureTap(model, cfg.extra_layers)
    feats: dict[int, dict[str, list[torch.Tensor]]] = {}
    meta = {}
    try:
        for index, kind, text in items:
            sampled = cfg.sampled_every and index % cfg.sampled_every == cfg.sampled_every - 1
            # a seeded stream, not the position-coupled rule: one uniform per row and step instead of a
            # vocabulary of CPU noise (which made a wide GPU batch CPU-bound); still fixed by the seed and index
            params = SamplingParams(temperature=cfg.temperature if sampled else 0.0, max_tokens=cfg.max_new_tokens,
                                    seed=cfg.seed * 1_000_003 + index, seed_stream=True)
            seq = engine.add_request(chat_ids(tok, text), params)
            meta[seq.seq_id] = (seq, kind)
            feats[seq.seq_id] = {}
        while engine.has_unfinished():
            stepped = engine.step()
            if tap.last is None or not stepped:
                continue
            for name, x in tap.rows().items():
                full = last = None   # converted once per step, then viewed per row (a wide batch stays a few kernels)
                for row, seq in enumerate(stepped):
                    got = feats[seq.seq_id].setdefault(name, [])
                    if not got:   # a prefill: every prompt token
                        full = x.to(torch.float16) if full is None else full
                        got.append(full[row, :len(seq.prompt)])
                    else:         # a decode step: the token before the one just appended
                        last = x[:, -1:].to(torch.float16) if last is None else last
                        got.append(last[row])
    finally:
        tap.close()
    tokens, offsets, plens, kinds, rows = [], [0], [], [], {}
    for sid, (seq, kind) in meta.items():
        ids = seq.prompt + seq.output
        for name, parts in feats[sid].items():
            f = torch.cat(parts)
            if f.shape[0] != len(ids) - 1:
                raise RuntimeError(f"sequence {sid}: {f.shape[0]} feature rows for {len(ids)} tokens "
                                   "(a preemption recomputed it; give the generator more KV)")
            rows.setdefault(name, []).append(f)
        tokens.extend(ids)
        offsets.append(len(tokens))
        plens.append(len(seq.prompt))
        kinds.append(KINDS.index(kind))
    return {"tokens": torch.tensor(tokens, dtype=torch.int32), "offsets": torch.tensor(offsets, dtype=torch.int64),
            "prompt_lens": torch.tensor(plens, dtype=torch.int32), "kinds": torch.tensor(kinds, dtype=torch.uint8),
            **{name: torch.cat(parts).cpu() for name, parts in rows.items()}}


def shard_path(out: Path, i: int) -> Path:
    return out / f"shard-{i:05d}.safetensors"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # alive, under another user
        pass
    return True


def claim_shard(path: Path) -> bool:
    """Claim the shard at `path` for this process: False when another live process holds it."""
    claim = path.with_suffix(".claim")
    for _ in range(2):
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                pid = int(claim.read_text())
            except (OSError, ValueError):   # gone meanwhile, or its pid not written yet: held
                return False
            if pid == os.getpid():
                return True
            if _alive(pid):
                return False
            claim.unlink(missing_ok=True)   # its process died: take it over
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def generate(target_dir: str | Path, out: str | Path, cfg: DataConfig, log=print) -> Path:
    from ssd.models.loader import load_model

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    model = load_model(target_dir, dtype=torch.float32, device=cfg.device)
    tok = Tokenizer.from_folder(target_dir)
    items = [(i, kind, text) for i, (kind, text) in enumerate(training_prompts(cfg.prompts, cfg.seed))]
    n_shards = (len(items) + cfg.shard_size - 1) // cfg.shard_size
    if not 0 <= cfg.first_shard < n_shards:
        raise ValueError(f"first_shard {cfg.first_shard} is outside the {n_shards} shards of {cfg.prompts} prompts")
    done = sum(shard_path(out, i).exists() for i in range(cfg.first_shard, n_shards))
    log(f"teacher data: shards {cfg.first_shard}-{n_shards - 1} of {cfg.shard_size} prompts, {done} already "
        f"present in {out}")
    t0, made, took = time.time(), 0, []
    for i in range(cfg.first_shard, n_shards):
        path = shard_path(out, i)
        if path.exists():
            continue
        if cfg.seconds and took and time.time() - t0 + sum(took) / len(took) > cfg.seconds:
            log(f"teacher data: stopping before shard {i + 1}/{n_shards}: the {cfg.seconds:.0f} s budget would "
                f"run out ({len(took)} shards made in {time.time() - t0:.0f} s)")
            break
        if not claim_shard(path):
            continue
        t = time.time()
        try:
            shard = generate_shard(model, tok, items[i * cfg.shard_size:(i + 1) * cfg.shard_size], cfg)
            tmp = path.with_suffix(".tmp")   # the claim makes this process the shard's only writer
            save_file(shard, str(tmp), metadata={"seed": str(cfg.seed), "prompts": str(cfg.prompts)})
            os.replace(tmp, path)
        finally:
            path.with_suffix(".claim").unlink(missing_ok=True)
        n = int(shard["tokens"].numel())
        made += n
        took.append(time.time() - t)
        log(f"shard {i + 1}/{n_shards}: {n} tokens in {time.time() - t:.0f} s "
            f"({n / (time.time() - t):.0f} tok/s incl. prompts; total {made} new tokens, {time.time() - t0:.0f} s)")
    return out


def load_shards(folder: str | Path, limit: int | None = None) -> list[dict]:
    paths = sorted(Path(folder).glob("shard-*.safetensors"))
    return [load_file(str(p)) for p in paths[:limit]]
