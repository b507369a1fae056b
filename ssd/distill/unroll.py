"""The unrolled forward of a feature draft ("training-time test"): at depth k the query at position p reads, for
its own input, the draft's depth-(k-1) output at p-1 instead of the target's feature, and in every layer attends
to that layer's target-fed keys up to position p-k+1 plus one key of each depth 2..k-1 at p-k+2..p-1. This is exactly what
the draft sees when it drafts k tokens after the last verified one, so one forward serves both training's loss
(`ssd.distill.train`) and the measure of chained acceptance (`ssd.distill.evaluate`).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ssd.models.eagle import FeatureDraft
from ssd.models.rope import apply_rotary


def _layer(layer, x, cos, sin, attend):
    """One decoder layer with a custom attention `attend(q, k, v) -> [B, T, h, d]`; returns (out, k, v)."""
    a = layer.attn
    B, T, _ = x.shape
    h = layer.input_norm(x)
    q, k, v = F.linear(h, a.qkv_weight, a.qkv_bias).split((a.q_size, a.kv_size, a.kv_size), dim=-1)
    q, k, v = q.view(B, T, a.h, a.d), k.view(B, T, a.hkv, a.d), v.view(B, T, a.hkv, a.d)
    if a.q_norm is not None:
        q, k = a.q_norm(q), a.k_norm(k)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    out = attend(q, k, v)
    out = F.linear(out.reshape(B, T, a.q_size), a.o_weight)
    x = x + (out if a.o_bias is None else out + a.o_bias)
    return x + layer.mlp(layer.post_attn_norm(x)), k, v


def _shift(t: torch.Tensor, n: int) -> torch.Tensor:
    """t[:, p] -> t[:, p - n] along dim 1 (zeros where p < n)."""
    if n == 0:
        return t
    return torch.cat((torch.zeros_like(t[:, :n]), t[:, :-n]), dim=1)


def _attention(q, kk, vv, keys: list, k: int, pos: torch.Tensor, scale: float, rep: int) -> torch.Tensor:
    """Depth k's attention in one layer: `keys` holds that layer's (k, v) of depths 1..k-1; (kk, vv) are depth k's."""
    if k == 1:
        return F.scaled_dot_product_attention(
            q.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2), is_causal=True,
            enable_gqa=True).transpose(1, 2)
    T = q.shape[1]
    qh = q.transpose(1, 2)                                            # [B, h, T, d]
    k1 = keys[0][0].repeat_interleave(rep, 2).transpose(1, 2)         # [B, h, T, d]
    v1 = keys[0][1].repeat_interleave(rep, 2).transpose(1, 2)
    s1 = (qh @ k1.transpose(-1, -2)) * scale                          # [B, h, T, T]
    allowed = pos[None, :] <= pos[:, None] - (k - 1)                  # col <= p - k + 1
    s1 = s1.masked_fill(~allowed, float("-inf"))
    diag_k, diag_v = [], []
    for j in range(2, k + 1):                                         # depth j's key at p-(k-j)
        kj, vj = (kk, vv) if j == k else keys[j - 1]
        diag_k.append(_shift(kj, k - j).repeat_interleave(rep, 2).transpose(1, 2))
        diag_v.append(_shift(vj, k - j).repeat_interleave(rep, 2).transpose(1, 2))
    sd = torch.stack([(qh * dk).sum(-1) for dk in diag_k], -1) * scale  # [B, h, T, k-1]
    p = torch.softmax(torch.cat((s1, sd), -1).float(), -1).to(qh.dtype)
    out = p[..., :T] @ v1 + sum(p[..., T + i, None] * dv for i, dv in enumerate(diag_v))
    return out.transpose(1, 2)


def unrolled_logits(draft: FeatureDraft, toks: torch.Tensor, feats: torch.Tensor, depth: int) -> list[torch.Tensor]:
    """Draft-vocabulary logits [B, T, Vd] for depths 1..depth. Depth k at position p is the draft's k-th
    drafted token when the last verified token sits at p-k+1 (its label is the token after p)."""
    B, T = toks.shape
    pos = torch.arange(T, device=toks.device)
    cos, sin = draft.rope(T).lookup(pos[None].expand(B, T))
    first = draft.layers[0].attn
    scale = 1.0 / math.sqrt(first.d)
    rep = first.h // first.hkv
    keys: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in draft.layers]   # per layer, per depth: k, v
    prev = _shift(feats, 1)                               # depth 1 reads the target's feature at p-1
    outs = []
    for k in range(1, depth + 1):
        x = draft.input_states(prev, toks)
        for layer, lkeys in zip(draft.layers, keys):
            x, kk, vv = _layer(layer, x, cos, sin,
                               lambda q, kk, vv, lkeys=lkeys, k=k: _attention(q, kk, vv, lkeys, k, pos, scale, rep))
            lkeys.append((kk, vv))
        outs.append(draft.draft_logits(draft.norm(x)))
        prev = _shift(x, 1)
    return outs
