"""The Hugging Face layout of a model's weights: the tensor names and shapes a folder for a config holds
(`expected_tensors`, what the loader checks), and the names of one decoder layer's tensors
(`hf_layer_tensors`, the inverse of the loader's fusing of q/k/v and gate/up, for writing drafts back out).

Kept apart from the loader so that the feature draft (`ssd.models.eagle`), which the loader builds, can write
its layers in the same layout without importing the loader.
"""
from __future__ import annotations

import torch

from ssd.config import ModelConfig


def expected_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor name -> shape for a model with this config."""
    D, hd = cfg.hidden_size, cfg.head_dim
    q, kv, inter = cfg.num_heads * hd, cfg.num_kv_heads * hd, cfg.intermediate_size
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, D), "model.norm.weight": (D,)}
    if cfg.feature_draft:
        Vd, Fs = cfg.feature_draft["draft_vocab_size"], cfg.feature_draft["feature_size"]
        shapes |= {"lm_head.weight": (Vd, D), "fc.weight": (D, Fs + D), "fc.bias": (D,), "vocab_ids": (Vd,),
                   "fc.feature_norm.weight": (Fs,), "fc.embed_norm.weight": (D,)}
    elif not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, D)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (q, D), p + "self_attn.k_proj.weight": (kv, D),
                   p + "self_attn.v_proj.weight": (kv, D), p + "self_attn.o_proj.weight": (D, q),
                   p + "mlp.gate_proj.weight": (inter, D), p + "mlp.up_proj.weight": (inter, D),
                   p + "mlp.down_proj.weight": (D, inter), p + "input_layernorm.weight": (D,),
                   p + "post_attention_layernorm.weight": (D,)}
        if cfg.attention_bias:
            shapes |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                       p + "self_attn.v_proj.bias": (kv,), p + "self_attn.o_proj.bias": (D,)}
        if cfg.mlp_bias:
            shapes |= {p + "mlp.gate_proj.bias": (inter,), p + "mlp.up_proj.bias": (inter,),
                       p + "mlp.down_proj.bias": (D,)}
        if cfg.qk_norm:
            shapes |= {p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)}
    return shapes


def hf_layer_tensors(layer, i: int) -> dict[str, torch.Tensor]:
    """Hugging Face names -> tensors of decoder layer `i` (the inverse of `load_model`'s layer mapping)."""
    a, p = layer.attn, f"model.layers.{i}."
    q, k, v = a.qkv_weight.split((a.q_size, a.kv_size, a.kv_size))
    gate, up = layer.mlp.gate_up_weight.split(layer.mlp.inter)
    out = {p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k, p + "self_attn.v_proj.weight": v,
           p + "self_attn.o_proj.weight": a.o_weight, p + "mlp.gate_proj.weight": gate,
           p + "mlp.up_proj.weight": up, p + "mlp.down_proj.weight": layer.mlp.down_weight,
           p + "input_layernorm.weight": layer.input_norm.weight,
           p + "post_attention_layernorm.weight": layer.post_attn_norm.weight}
    if a.q_norm is not None:
        out |= {p + "self_attn.q_norm.weight": a.q_norm.weight, p + "self_attn.k_norm.weight": a.k_norm.weight}
    if a.qkv_bias is not None or layer.mlp.gate_up_bias is not None:
        raise ValueError("biased layers are not written by this trainer")
    return out
