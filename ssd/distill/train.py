"""Training the feature-reading draft on teacher data (`ssd.distill.data`).

Loss: cross-entropy of the draft's distribution against the target's at the same position, both over the
draft vocabulary (the target's is its own output layer applied to its stored feature there), at every depth
of the draft unrolled on its own outputs (`ssd.distill.unroll`). The data are `ssd.distill.corpus`'s; the
held-out chained accuracy logged at checkpoints is `ssd.distill.evaluate`'s.
"""
from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from ssd.config import ModelConfig
from ssd.distill.corpus import Corpus, build_vocab, make_batch, vocab_cover
from ssd.distill.data import load_shards
from ssd.distill.evaluate import chain_acceptance
from ssd.distill.unroll import unrolled_logits
from ssd.models.decoder import Decoder
from ssd.models.eagle import FeatureDraft, feature_draft_config, trained_tensors
from ssd.models.hf_layout import hf_layer_tensors


@dataclass
class TrainConfig:
    draft_vocab: int = 8192
    layers: int = 1
    depth: int = 3                 # unroll depth of the training-time test
    depth_decay: float = 0.8       # loss weight of depth k: decay^(k-1)
    seq_len: int = 384             # sequences are cut to this many tokens
    batch: int = 8
    lr: float = 1e-3
    warmup: int = 60
    minutes: float = 100.0         # wall-clock budget (the schedule is laid out over `steps`)
    steps: int = 4000
    schedule: str = "steps"        # the learning rate's cosine runs over "steps", or over the "minutes" budget
                                   # (then `steps` is only a cap: a run on a device of unknown speed fills its time)
    seed: int = 0
    correction_weight: float = 0.0  # extra loss weight of the chains that start right after a draft error (where
                                    # the engine's rounds start: the token there is the target's correction)
    bf16: bool = True              # bf16 autocast, where the device computes bfloat16 natively (`train` says when not)
    held_out_shards: int = 1       # the first shard(s) of the data are kept for validation
    reload_every: int = 50         # steps between looks for new shards (data generation may still run)
    follow: bool = False           # wait for the first shards of a data stage running alongside
    init_from: str = ""            # start from a trained draft's tensors (a packaged `.safetensors`), keeping its vocabulary
    train_only: str = "all"        # "grown": with `init_from` a draft of fewer layers, train only the layers grown on
                                   # it (they start as identities); the rest stays as trained and cannot be forgotten
    checkpoint_every: int = 50
    device: str = "cpu"            # where the draft trains (bf16 autocast on that device's type)
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.schedule not in ("steps", "minutes"):
            raise ValueError(f"schedule must be 'steps' or 'minutes', got {self.schedule!r}")
        if self.train_only not in ("all", "grown"):
            raise ValueError(f"train_only must be 'all' or 'grown', got {self.train_only!r}")
        if self.train_only == "grown" and not self.init_from:
            raise ValueError("train_only='grown' needs init_from: the trained draft the new layers grow on")
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1, got {self.depth}")
        if not 0 < self.depth_decay <= 1:
            raise ValueError(f"depth_decay must be in (0, 1], got {self.depth_decay}")


# ---------------------------------------------------------------------------------------------- model

def init_from_target(target: Decoder, vocab_ids: torch.Tensor, layers: int = 1, seed: int = 0,
                     feature_rms: float = 30.0) -> FeatureDraft:
    """A feature draft whose layer(s) copy the target's last layer(s), with the target's embedding, final norm
    and the output rows of `vocab_ids`. `fc` starts as [identity ; identity] (plus a little noise) and both
    input norms' weights at `feature_rms`: the first layer initially sees the previous token's feature plus
    the token's embedding at the scale of the target's residual stream, and Adam's steps on `fc` are small
    relative to its entries."""
    cfg = ModelConfig.from_dict(feature_draft_config(target.cfg, len(vocab_ids), layers))
    cfg.name = target.cfg.name + "-eagle"
    g = torch.Generator().manual_seed(seed)
    draft = FeatureDraft(cfg)
    H = target.cfg.hidden_size
    with torch.no_grad():
        draft.embed.data = target.embed.data.clone()
        draft.norm.weight.data = target.norm.weight.data.clone()
        head = target.embed if target.lm_head is None else target.lm_head
        draft.lm_head.data = head.data[vocab_ids].clone()
        draft.vocab_ids = vocab_ids.clone()
        for i in range(layers):
            src = target.layers[target.cfg.num_layers - layers + i]
            draft.layers[i].load_state_dict(src.state_dict())
        eye = torch.eye(H)
        draft.fc_weight.data = torch.cat((eye, eye), dim=1) + torch.randn(H, 2 * H, generator=g) * (0.1 / math.sqrt(H))
        draft.fc_bias.data = torch.zeros(H)
        draft.feature_norm.weight.data = torch.full((H,), feature_rms)
        draft.embed_norm.weight.data = torch.full((H,), feature_rms)
    return draft


def target_logprobs(draft: FeatureDraft, feats: torch.Tensor) -> torch.Tensor:
    """The target's log-distribution over the draft vocabulary at each position, from its stored features."""
    with torch.no_grad():
        return torch.log_softmax(draft.draft_logits(draft.norm(feats)), -1)


def loss_fn(draft, toks, feats, valid, cfg: TrainConfig,
            target_feats: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss and the training accuracy per depth ([depth], on the batch's device: read it only when logging,
    which on a GPU waits for the step). The target's distribution comes from `target_feats` (default `feats`), for
    a draft whose input is more than the target's last feature (bench/fused_features.py)."""
    logits = unrolled_logits(draft, toks, feats, cfg.depth)
    tgt = target_logprobs(draft, feats if target_feats is None else target_feats).float()
    tprob = tgt.exp()
    total, accs = 0.0, []
    T = toks.shape[1]
    pos = torch.arange(T, device=toks.device)
    weight = torch.ones(toks.shape, device=toks.device)
    if cfg.correction_weight:
        # wrong[p]: the draft's first drafted token after p is not the target's, so the token at p + 1 is a
        # correction and a round starts there; the depth-k chain at p started at p - k + 1
        with torch.no_grad():
            wrong = (logits[0].argmax(-1) != tgt.argmax(-1)).float()
    for k, lg in enumerate(logits, start=1):
        m = valid & (pos >= k - 1)[None, :]
        if cfg.correction_weight:
            weight = 1.0 + cfg.correction_weight * torch.cat((torch.zeros_like(wrong[:, :k]), wrong[:, :T - k]), 1)
        lp = torch.log_softmax(lg.float(), -1)
        ce = -(tprob * lp).sum(-1)
        w = m * weight
        total = total + cfg.depth_decay ** (k - 1) * (ce * w).sum() / w.sum().clamp(min=1)
        with torch.no_grad():
            accs.append(((lg.argmax(-1) == tgt.argmax(-1)) & m).sum() / m.sum().clamp(min=1))
    return total, torch.stack(accs)


# ---------------------------------------------------------------------------------------------- loop

def _lr(step: int, cfg: TrainConfig, seconds: float = 0.0) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if cfg.schedule == "minutes":
        frac = min(1.0, seconds / (cfg.minutes * 60))
    else:
        frac = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def trainable(draft: FeatureDraft, first_layer: int = 0) -> list[torch.nn.Parameter]:
    """What training moves: all of the draft's own tensors, or (`first_layer` > 0) only its decoder layers from
    `first_layer` on."""
    if first_layer:
        return [p for layer in draft.layers[first_layer:] for p in layer.parameters()]
    return [draft.fc_weight, draft.fc_bias, draft.feature_norm.weight, draft.embed_norm.weight,
            *draft.layers.parameters()]


def save_draft(draft: FeatureDraft, folder: Path, dtype=torch.bfloat16) -> None:
    """The trained part (`trained_tensors`) as `draft.safetensors` plus `draft_config.json`."""
    folder.mkdir(parents=True, exist_ok=True)
    small = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous().cpu()
             for k, v in trained_tensors(draft).items()}
    _atomic_save(small, folder / "draft.safetensors")
    (folder / "draft_config.json").write_text(json.dumps(feature_draft_config(draft.cfg, len(draft.vocab_ids),
                                                                              len(draft.layers)), indent=1))


def _atomic_save(tensors: dict, path: Path, metadata: dict | None = None) -> None:
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    os.replace(tmp, path)


def train(target: Decoder, data_dir: str | Path, out: str | Path, cfg: TrainConfig, log=print,
          progress: bool = True, on_checkpoint: Callable[[int], object] | None = None) -> dict:
    """Fit a feature draft; resumable from `out/state.safetensors` (weights, optimiser moments, step, RNG
    position). `target` stays on the CPU (the draft starts from its tensors there and then moves to
    `cfg.device`, with the teacher data); `on_checkpoint(step)` runs after each checkpoint is written.
    Returns the training history."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(cfg.device)
    def load() -> tuple[Corpus, int]:
        shards = load_shards(data_dir)
        while cfg.follow and len(shards) <= cfg.held_out_shards:
            log(f"waiting for teacher data in {data_dir} ({len(shards)} shards so far)")
            time.sleep(30)
            shards = load_shards(data_dir)
        if len(shards) <= cfg.held_out_shards:
            raise ValueError(f"{data_dir}: {len(shards)} shards; need more than the {cfg.held_out_shards} held out")
        return Corpus.from_shards(shards[cfg.held_out_shards:]), len(shards)

    corpus, n_shards = load()
    held = Corpus.from_shards(load_shards(data_dir, cfg.held_out_shards)).to(dev) if cfg.held_out_shards else None
    state_path, hist_path = out / "state.safetensors", out / "history.json"
    # a resumed run's state holds only what trains: with `train_only="grown"` the rest comes from `init_from` again
    resuming = state_path.exists()
    warm = load_file(cfg.init_from) if cfg.init_from and (not resuming or cfg.train_only == "grown") else None
    if resuming:
        st = load_file(str(state_path))
        vocab_ids, cover, feature_rms = st["vocab_ids"], float(st["cover"]), float(st["feature_rms"])
    else:
        if warm is not None:
            vocab_ids = warm["vocab_ids"].long()
            cover = vocab_cover(corpus, vocab_ids)
        else:
            vocab_ids, cover = build_vocab(corpus, cfg.draft_vocab, target.cfg.eos_token_ids)
        sample = torch.cat([f[:64] for _, f, _, _ in corpus.seqs[:64]]).float()
        feature_rms = float(sample.pow(2).mean(-1).sqrt().median())
    corpus = corpus.to(dev)
    draft = init_from_target(target, vocab_ids, cfg.layers, cfg.seed, feature_rms)
    first_layer = 0
    if warm is not None:
        copy_trained(draft, warm, grow=True)
        have = trained_layers(warm)
        grown = cfg.layers - have
        if cfg.train_only == "grown":
            if not grown:
                raise ValueError(f"train_only='grown': {cfg.init_from} already has {cfg.layers} layer(s); "
                                 "grow it with more layers")
            first_layer = have
        if not resuming:
            log(f"initialised from {cfg.init_from}" + (f", {grown} identity layer(s) added" if grown else "")
                + (" (only they train)" if first_layer else ""))
    draft = draft.to(dev)
    draft._rope = None      # rebuilt on the draft's device at the first forward
    draft.requires_grad_(False)
    params = trainable(draft, first_layer)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    step, history = 0, {"config": asdict(cfg), "vocab_cover": cover, "train_tokens": corpus.tokens, "log": []}
    if resuming:
        names = dict(draft.named_parameters())
        for n, p in names.items():
            if "w." + n in st:
                p.data.copy_(st["w." + n])
        opt.load_state_dict(_opt_state_from(st, opt))
        step = int(st["step"])
        history = json.loads(hist_path.read_text())
        # resumed with another schedule or budget: keep both on record (a field the record predates had its default)
        if asdict(TrainConfig()) | history["config"] != asdict(cfg):
            history.setdefault("resumes", []).append({"step": step, "previous_config": history["config"]})
            history["config"] = asdict(cfg)
        log(f"resumed at step {step}")
    from ssd.worker import service as worker_service

    # bf16 autocast only where the device multiplies bfloat16 in hardware: an AVX2 CPU emulates it, and a step of
    # the grown 2-layer draft took 150 s there against 7.5 s in float32 (2026-12-07)
    autocast = cfg.bf16 and worker_service.native_bf16(cfg.device)
    if cfg.bf16 and not autocast:
        log(f"bf16 autocast off: {cfg.device} has no native bfloat16 (emulated, ~20x slower); training in float32")
    history["autocast"] = "bfloat16" if autocast else "float32"
    log(f"{len(corpus.seqs)} training sequences ({corpus.tokens} tokens), draft vocab {len(vocab_ids)} covers "
        f"{cover:.1%} of answer tokens; {sum(p.numel() for p in params) / 1e6:.2f} M trainable parameters")
    rng = random.Random(cfg.seed * 7919 + step)
    order = sorted(range(len(corpus.seqs)), key=lambda i: len(corpus.seqs[i][0]))
    t0 = time.time() - history.get("seconds", 0.0)
    bar = tqdm(total=cfg.steps, initial=step, disable=not progress, desc="distill", unit="step")
    while step < cfg.steps and (time.time() - t0) < cfg.minutes * 60:
        if cfg.reload_every and step % cfg.reload_every == 0 and step:
            if len(list(Path(data_dir).glob("shard-*.safetensors"))) > n_shards:
                corpus, n_shards = load()
                corpus = corpus.to(dev)
                order = sorted(range(len(corpus.seqs)), key=lambda i: len(corpus.seqs[i][0]))
                history["train_tokens"] = corpus.tokens
                log(f"step {step}: {n_shards} shards, {corpus.tokens} training tokens")
        # batches of similar length (less padding): a random start in the length-sorted order
        i = rng.randrange(0, max(1, len(order) - cfg.batch))
        seqs = [corpus.seqs[j] for j in order[i:i + cfg.batch]]
        toks, feats, valid, _ = make_batch(seqs, cfg.seq_len, dev)
        for g in opt.param_groups:
            g["lr"] = _lr(step, cfg, time.time() - t0)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
            loss, accs = loss_fn(draft, toks, feats, valid, cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        bar.update(1)
        loss = loss.detach()
        if dev.type == "cpu" or step % 20 == 0:   # reading the loss waits for the device
            accs = accs.tolist()
            bar.set_postfix(loss=f"{float(loss):.3f}", acc=" ".join(f"{a:.2f}" for a in accs))
        if step % 20 == 0:
            history["log"].append({"step": step, "minutes": (time.time() - t0) / 60, "loss": float(loss),
                                   "train_acc": accs})
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            if held is not None:
                history["log"].append({"step": step, "minutes": (time.time() - t0) / 60,
                                       "held_out": held_out_accuracy(draft, held, cfg)})
                log(f"step {step}: held-out chained accuracy {history['log'][-1]['held_out']}")
            history["seconds"] = time.time() - t0
            _checkpoint(draft, opt, step, vocab_ids, cover, feature_rms, history, out)
            if on_checkpoint is not None:
                on_checkpoint(step)
    bar.close()
    history["seconds"] = time.time() - t0
    _checkpoint(draft, opt, step, vocab_ids, cover, feature_rms, history, out)
    if on_checkpoint is not None:
        on_checkpoint(step)
    return history


def held_out_accuracy(draft: FeatureDraft, held: Corpus, cfg: TrainConfig, depth: int = 4) -> list[float]:
    """Per-depth conditional greedy acceptance on answer positions of held-out teacher data."""
    return chain_acceptance(draft, held.seqs[:48], depth)["conditional"]


def _checkpoint(draft, opt, step, vocab_ids, cover, feature_rms, history, out: Path) -> None:
    st = {"w." + n: p.detach().cpu().clone() for n, p in draft.named_parameters() if p.requires_grad}
    st |= {"step": torch.tensor(step), "vocab_ids": vocab_ids, "cover": torch.tensor(cover),
           "feature_rms": torch.tensor(feature_rms)}
    osd = opt.state_dict()
    for pid, s in osd["state"].items():
        for key, v in s.items():
            st[f"opt.{pid}.{key}"] = v.cpu() if torch.is_tensor(v) else torch.tensor(v)
    _atomic_save(st, out / "state.safetensors")
    (out / "history.json").write_text(json.dumps(history, indent=1))
    save_draft(draft, out)


def _opt_state_from(st: dict, opt) -> dict:
    sd = opt.state_dict()
    state = {}
    for pid in range(len(sd["param_groups"][0]["params"])):
        keys = {k.split(".", 2)[2]: v for k, v in st.items() if k.startswith(f"opt.{pid}.")}
        if keys:
            state[pid] = keys
    return {"state": state, "param_groups": sd["param_groups"]}


def load_trained(target: Decoder, run: str | Path) -> FeatureDraft:
    """The draft of a training run (`run/draft.safetensors`) on `target`'s embedding, norm and head."""
    st = load_file(str(Path(run) / "draft.safetensors"))
    ids = st["vocab_ids"].long()
    cfg = ModelConfig.from_dict(json.loads((Path(run) / "draft_config.json").read_text()))
    draft = init_from_target(target, ids, cfg.num_layers)
    copy_trained(draft, st)
    return draft.eval().requires_grad_(False)


def trained_layers(st: dict[str, torch.Tensor]) -> int:
    """How many decoder layers a draft's trained tensors hold."""
    return len({k.split(".")[2] for k in st if k.startswith("model.layers.")})


def copy_trained(draft: FeatureDraft, st: dict[str, torch.Tensor], grow: bool = False) -> None:
    """Set `draft`'s trained part (`trained_tensors`' names) from `st`; the vocabulary must match, and so must the
    layer count unless `grow`: then a draft with more layers than `st` holds takes them as its first layers, and
    each further layer becomes an exact identity (its attention output and MLP down projections zeroed, the
    residual passing through), so the grown draft starts out computing what `st`'s draft computes."""
    if len(st["vocab_ids"]) != len(draft.vocab_ids) or not torch.equal(st["vocab_ids"].long(), draft.vocab_ids):
        raise ValueError("the trained tensors were made for another draft vocabulary")
    have = trained_layers(st)
    if grow and not 0 < have <= len(draft.layers):
        raise ValueError(f"cannot grow a draft of {have} layers into one of {len(draft.layers)}")
    kept = draft.layers[:have] if grow else draft.layers
    names = {"fc.weight": draft.fc_weight, "fc.bias": draft.fc_bias,
             "fc.feature_norm.weight": draft.feature_norm.weight, "fc.embed_norm.weight": draft.embed_norm.weight}
    for i, layer in enumerate(kept):
        names |= hf_layer_tensors(layer, i)
    missing = sorted(n for n in names if n not in st)
    if missing:
        raise ValueError(f"the trained tensors lack {missing[:3]} (another layer count?)")
    with torch.no_grad():
        for name, param in names.items():
            param.copy_(st[name].float().view_as(param))
        for layer in draft.layers[len(kept):]:
            layer.attn.o_weight.zero_()
            layer.mlp.down_weight.zero_()


def export(run: str | Path, dest: str | Path, metadata: dict) -> Path:
    """Copy a run's trained tensors to `dest` (the packaged weights), with provenance in the file's metadata
    and in a `.json` beside it."""
    run, dest = Path(run), Path(dest)
    history = json.loads((run / "history.json").read_text())
    meta = {k: str(v) for k, v in metadata.items()} | {
        "train_minutes": f"{history.get('seconds', 0) / 60:.1f}", "train_tokens": str(history.get("train_tokens")),
        "train_config": json.dumps(history.get("config"))}
    dest.parent.mkdir(parents=True, exist_ok=True)
    _atomic_save(load_file(str(run / "draft.safetensors")), dest, meta)
    dest.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    return dest
