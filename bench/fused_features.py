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

from ssd.distill.data import load_shards
from ssd.distill.train import copy_trained, init_from_target, trainable
from ssd.distill.unroll import unrolled_logits
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
    """(tokens, the draft's input features [n-1, H or 3H], prompt length, kind, the last features [n-1, H])."""
    seqs = []
    for sh in shards:
        missing = [k for k in EXTRA if k not in sh] if fused else []
        if missing:
            raise ValueError(f"a shard lacks {missing}: make the data with ssd.distill.data's default extra_layers")
        off, toks = sh["offsets"], sh["tokens"].long()
        feats = torch.cat((sh[EXTRA[0]], sh[EXTRA[1]], sh["features"]), -1) if fused else sh["features"]
        row = 0
        for i in range(len(off) - 1):
            n = int(off[i + 1]) - int(off[i])
            seqs.append((toks[int(off[i]):int(off[i + 1])], feats[row:row + n - 1], int(sh["prompt_lens"][i]),
                         int(sh["kinds"][i]), sh["features"][row:row + n - 1]))
            row += n - 1
    return seqs


def batch_of(seqs, seq_len: int):
    T = min(seq_len, max(len(s[0]) - 1 for s in seqs))
    H, W = seqs[0][4].shape[1], seqs[0][1].shape[1]
    toks = torch.zeros(len(seqs), T, dtype=torch.long)
    feats, last = torch.zeros(len(seqs), T, W), torch.zeros(len(seqs), T, H)
    valid = torch.zeros(len(seqs), T, dtype=torch.bool)
    for b, (t, f, _, _, fl) in enumerate(seqs):
        n = min(T, len(t) - 1)
        toks[b, :n], feats[b, :n], last[b, :n], valid[b, :n] = t[:n], f[:n].float(), fl[:n].float(), True
    return toks, feats, last, valid, [s[2] for s in seqs]


@torch.no_grad()
def held_out(draft: FeatureDraft, head: torch.Tensor, seqs, seq_len: int, depth: int = 4) -> dict:
    """Greedy, teacher-forced: from every answer position, how many of `depth` drafted tokens the target's greedy
    tokens accept; conditional acceptance per depth and tokens a round at K = 3 (bonus included)."""
    lengths = []
    for i in range(0, len(seqs), 8):
        toks, feats, last, valid, plens = batch_of(seqs[i:i + 8], seq_len)
        logits = unrolled_logits(draft, toks, feats, depth)
        labels = F.linear(draft.norm(last), head).argmax(-1).tolist()
        preds = [draft.vocab_ids[lg.argmax(-1)].tolist() for lg in logits]
        for b, n in enumerate(valid.sum(-1).tolist()):
            for s in range(max(0, plens[b] - 1), n - depth + 1):
                L = 0
                while L < depth and preds[L][b][s + L] == labels[b][s + L]:
                    L += 1
                lengths.append(L)
    reach = [sum(x >= k for x in lengths) for k in range(depth + 1)]
    return {"starts": len(lengths),
            "conditional": [round(reach[k + 1] / max(1, reach[k]), 4) for k in range(depth)],
            "tokens_k3": round(1 + sum(min(x, 3) for x in lengths) / max(1, len(lengths)), 4)}


def loss_of(draft, toks, feats, last, valid, depth: int, decay: float):
    """`ssd.distill.train.loss_fn`'s loss (cross-entropy to the target's draft-vocabulary distribution at every
    unrolled depth), with the target's distribution read from the last feature whatever the draft reads."""
    logits = unrolled_logits(draft, toks, feats, depth)
    with torch.no_grad():
        tprob = torch.softmax(draft.draft_logits(draft.norm(last)).float(), -1)
    pos = torch.arange(toks.shape[1])
    total, accs = 0.0, []
    for k, lg in enumerate(logits, start=1):
        m = valid & (pos >= k - 1)[None, :]
        ce = -(tprob * torch.log_softmax(lg.float(), -1)).sum(-1)
        total = total + decay ** (k - 1) * (ce * m).sum() / m.sum().clamp(min=1)
        with torch.no_grad():
            accs.append(float(((lg.argmax(-1) == tprob.argmax(-1)) & m).sum() / m.sum().clamp(min=1)))
    return total, accs


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
        toks, feats, last, valid, _ = batch_of([train[j] for j in order[i:i + batch]], seq_len)
        frac = min(1.0, (time.time() - start) / budget)
        for g in opt.param_groups:
            g["lr"] = g["base"] * min(1.0, (step + 1) / 20) * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, acc = loss_of(draft, toks, feats, last, valid, depth, decay)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for g in groups for p in g["params"]], 1.0)
        opt.step()
        step += 1
        losses.append(float(loss.detach()))
        accs.append(acc)
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
        H = draft.cfg.hidden_size
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
