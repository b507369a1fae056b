"""Does the draft gain from reading more of the target than its last feature? An EAGLE-3-style measurement on CPU.

Two warm starts of the shipped draft train on the same teacher data (`ssd models distill --stage data` shards,
which keep the target's layers 2 and 15 beside its last pre-norm feature), with the same batches in the same order,
and are scored on the same held-out answers:

* ``last``: the draft as shipped, reading the target's last feature;
* ``fused``: the same draft behind a fuse matrix ``[l2 ; l15 ; last] -> H`` (each part scaled by a fixed factor
  to the last feature's RMS). The matrix starts as ``[0 ; 0 ; I]``, so at step 0 the fused draft computes exactly
  what the shipped one computes, and any difference after is what the two extra layers taught it. The fuse has its
  own learning rate (``--fuse-lr``).

``--part all`` trains every tensor the shipped draft trained; ``--part input`` trains its input layer ``fc`` alone
(and the fuse), the decoder layer frozen: the fused draft then differs from the other only in what it reads.
Speculated positions read the draft's own output in both, as in the engine. Scored greedily, teacher-forced:
conditional acceptance at depths 1-4 and tokens a round at K = 3 over every answer position of the held-out shards.
The data (two processes, one core each, sharing the folder; prompts from 38,400 on, which no shipped draft saw):

    ssd models distill --stage data --work-dir W --prompts 60000 --first-shard 300   # twice; DIR is W/data

    taskset -c 0 python bench/fused_features.py last  --data DIR --out OUT/last  --minutes 50 --part input \
        --lr 5e-5 --fuse-lr 5e-5 &
    taskset -c 1 python bench/fused_features.py fused --data DIR --out OUT/fused --minutes 50 --part input \
        --lr 5e-5 --fuse-lr 5e-5

Each run appends JSON lines to OUT/<variant>/log.jsonl (the training loss and accuracy every 10 steps, the held-out
figures every ``--eval-every`` steps) and writes OUT/<variant>/result.json. Nothing here changes the product: the
engine's draft reads the last feature only. (2026-12-06, twenty-first session: bench/results/fused_features/.)
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from ssd.distill.corpus import Corpus, make_batch
from ssd.distill.data import load_shards
from ssd.distill.evaluate import chain_acceptance
from ssd.distill.train import TrainConfig, copy_trained, init_from_target, loss_fn, trainable
from ssd.models.eagle import FeatureDraft
from ssd.models.prepare import EAGLE_WEIGHTS

EXTRA = ("features_l2", "features_l15")


class FusedDraft(FeatureDraft):
    """A feature draft whose committed positions read ``fuse_weight @ (fuse_scale * [l2 ; l15 ; last])``; a row of
    hidden size (the draft's own output at a speculated position) passes as it is."""

    fuse_weight: torch.nn.Parameter
    fuse_scale: torch.Tensor

    def input_states(self, features: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if features.shape[-1] == self.fuse_weight.shape[1]:
            features = F.linear(features.float() * self.fuse_scale, self.fuse_weight.float())
        return super().input_states(features, ids)


def make_fused(draft: FeatureDraft, scales: tuple[float, float]) -> FusedDraft:
    """`draft` turned into a FusedDraft (in place) whose fuse starts as [0 ; 0 ; I]: it computes what `draft` did."""
    H = draft.cfg.hidden_size
    draft.__class__ = FusedDraft
    w = torch.zeros(H, 3 * H)
    w[:, 2 * H:] = torch.eye(H)
    draft.fuse_weight = torch.nn.Parameter(w)
    draft.fuse_scale = torch.cat((torch.full((H,), scales[0]), torch.full((H,), scales[1]), torch.ones(H)))
    return draft


def rms_scales(shard: dict) -> tuple[float, float]:
    """Factors that bring layers 2 and 15 to the last feature's median RMS per row (applied in float32: the
    stored features are float16, and layer 15 holds values past 20,000)."""
    def rms(t):
        return float(t[:4096].float().pow(2).mean(-1).sqrt().median())
    last = rms(shard["features"])
    return last / rms(shard[EXTRA[0]]), last / rms(shard[EXTRA[1]])


def sequences(shards: list[dict], fused: bool) -> list[tuple]:
    """`Corpus` sequences (tokens, features, prompt length, kind) whose features are the draft's input: the last
    feature [n-1, H], or [l2 ; l15 ; last] [n-1, 3H] when `fused`. Either way the last H columns are the target's
    last feature (`last_of`)."""
    if fused:
        for sh in shards:
            missing = [k for k in EXTRA if k not in sh]
            if missing:
                raise ValueError(f"a shard lacks {missing}: make the data with ssd.distill.data's default "
                                 "extra_layers")
        shards = [sh | {"features": torch.cat((sh[EXTRA[0]], sh[EXTRA[1]], sh["features"]), -1)} for sh in shards]
    return Corpus.from_shards(shards).seqs


def last_of(feats: torch.Tensor, hidden: int) -> torch.Tensor:
    """The target's last feature in a batch of the draft's input features (its last `hidden` columns)."""
    return feats[..., -hidden:]


def held_out(draft: FeatureDraft, head: torch.Tensor, seqs, seq_len: int, depth: int = 4) -> dict:
    """Greedy, teacher-forced (`chain_acceptance`, the target's tokens from its last feature): conditional
    acceptance per depth from every answer position, and tokens a round at K = 3 (bonus included)."""
    H = draft.cfg.hidden_size
    r = chain_acceptance(draft, seqs, depth, head=head, target_norm=lambda f: draft.norm(last_of(f, H)),
                         seq_len=seq_len)
    return {"starts": r["positions"], "conditional": r["conditional"], "tokens_k3": r["tokens_per_round"]["3"]}


def run(variant: str, target, data: Path, out: Path, minutes: float, lr: float = 2e-4, fuse_lr: float = 1e-3,
        batch: int = 8, seq_len: int = 384, held: int = 2, held_seqs: int = 80, eval_every: int = 150,
        max_steps: int = 0, depth: int = 3, decay: float = 0.8, warm_from: Path = EAGLE_WEIGHTS,
        part: str = "all", log=print) -> dict:
    """Train `variant` from the shipped draft; `part`: "all" of the draft's trained tensors (`trainable`), or
    "input" (its input layer `fc` alone, the decoder layer frozen). The fused draft's fuse trains in both."""
    if part not in ("all", "input"):
        raise ValueError(f"part must be 'all' or 'input', got {part!r}")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    def say(rec: dict) -> None:
        rec["t"] = round(time.time() - t0, 1)
        log(json.dumps(rec))
        with open(out / "log.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")

    fused = variant == "fused"
    torch.manual_seed(0)
    warm = load_file(str(warm_from))
    draft = init_from_target(target, warm["vocab_ids"].long(), 1, 0)
    copy_trained(draft, warm)
    shards = load_shards(data)
    if len(shards) <= held:
        raise ValueError(f"{data}: {len(shards)} shards, need more than the {held} held out")
    scales = rms_scales(shards[0]) if fused else (1.0, 1.0)
    held_set = sequences(shards[:held], fused)[:held_seqs]
    train = sequences(shards[held:], fused)
    del shards
    params = trainable(draft) if part == "all" else [draft.fc_weight, draft.fc_bias]
    groups = [{"params": params, "base": lr}]
    if fused:
        make_fused(draft, scales)
    draft.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    if fused:
        draft.fuse_weight.requires_grad_(True)
        groups.append({"params": [draft.fuse_weight], "base": fuse_lr})
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    head = target.embed if target.lm_head is None else target.lm_head
    H, cfg = draft.cfg.hidden_size, TrainConfig(depth=depth, depth_decay=decay)
    say({"variant": variant, "train_seqs": len(train), "train_tokens": sum(len(s[0]) for s in train),
         "held_seqs": len(held_set), "scales": scales, "lr": lr, "fuse_lr": fuse_lr if fused else None,
         "part": part, "trained_parameters": sum(p.numel() for g in groups for p in g["params"])})
    curve = [{"step": 0, **held_out(draft, head, held_set, seq_len)}]
    say({"step": 0, "held": curve[-1]})
    rng = random.Random(1234)      # the same batches in the same order for both variants
    order = sorted(range(len(train)), key=lambda i: len(train[i][0]))
    step, start, budget = 0, time.time(), minutes * 60
    losses, accs = [], []
    while time.time() - start < budget and (not max_steps or step < max_steps):
        i = rng.randrange(0, max(1, len(order) - batch))
        toks, feats, valid, _ = make_batch([train[j] for j in order[i:i + batch]], seq_len)
        frac = min(1.0, (time.time() - start) / budget)
        for g in opt.param_groups:
            g["lr"] = g["base"] * min(1.0, (step + 1) / 20) * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, acc = loss_fn(draft, toks, feats, valid, cfg, target_feats=last_of(feats, H))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for g in groups for p in g["params"]], 1.0)
        opt.step()
        step += 1
        losses.append(float(loss.detach()))
        accs.append(acc.tolist())
        if step % 10 == 0:
            say({"step": step, "loss": round(sum(losses) / len(losses), 4),
                 "acc": [round(sum(a[k] for a in accs) / len(accs), 4) for k in range(depth)]})
            losses, accs = [], []
        if step % eval_every == 0:
            curve.append({"step": step, **held_out(draft, head, held_set, seq_len)})
            say({"step": step, "held": curve[-1]})
    if curve[-1]["step"] != step:
        curve.append({"step": step, **held_out(draft, head, held_set, seq_len)})
        say({"step": step, "held": curve[-1]})
    result = {"variant": variant, "part": part, "lr": lr, "fuse_lr": fuse_lr if fused else None, "steps": step,
              "minutes": round((time.time() - start) / 60, 2),
              "train_tokens": sum(len(s[0]) for s in train), "curve": curve}
    if fused:
        w = draft.fuse_weight.detach()
        result["fuse_block_norms"] = [round(float(w[:, i * H:(i + 1) * H].norm()), 3) for i in range(3)]
    (out / "result.json").write_text(json.dumps(result, indent=1))
    return result


def main() -> None:
    from ssd.models.loader import load_model
    from ssd.paths import target_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variant", choices=["last", "fused"])
    ap.add_argument("--data", type=Path, required=True, help="teacher-data shards (with layers 2 and 15)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--minutes", type=float, default=55.0, help="training wall-clock budget")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps too (0: none)")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--fuse-lr", type=float, default=1e-3)
    ap.add_argument("--part", choices=["all", "input"], default="all",
                    help="train all of the draft's trained tensors, or its input layer alone (the layer frozen)")
    ap.add_argument("--held", type=int, default=2, help="the first shards, held out")
    ap.add_argument("--held-seqs", type=int, default=80)
    ap.add_argument("--eval-every", type=int, default=150)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model(target_dir(), dtype=torch.float32)
    run(args.variant, target, args.data, args.out, args.minutes, lr=args.lr, fuse_lr=args.fuse_lr, held=args.held,
        held_seqs=args.held_seqs, eval_every=args.eval_every, max_steps=args.max_steps, part=args.part)


if __name__ == "__main__":
    main()
