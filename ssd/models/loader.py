"""Load a Hugging Face model folder (config.json + one or more *.safetensors) into a `Decoder`.

Every expected tensor (`ssd.models.hf_layout`) must be present with its exact shape; the errors name the file
and the tensor. q/k/v and gate/up projections are fused while loading, so each layer runs two matmuls fewer
per token.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from ssd.config import ModelConfig
from ssd.models.decoder import Decoder
from ssd.models.eagle import FeatureDraft
from ssd.models.hf_layout import expected_tensors
from ssd.models.linear import pack_model
from ssd.models.parallel import TPGroup

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class WeightLoadError(ValueError):
    """A weight file or tensor is missing, unreadable or has the wrong shape."""


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError) as e:
            raise WeightLoadError(f"{index}: not a valid safetensors index ({e})") from None
        files = [folder / n for n in names]
        for f in files:
            if not f.is_file():
                raise WeightLoadError(f"{f}: file not found (listed in {index.name})")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise WeightLoadError(f"{folder}: no *.safetensors weight files found")
    return files


def read_state_dict(folder: Path, cfg: ModelConfig, progress: bool | None = None) -> dict[str, torch.Tensor]:
    expected = expected_tensors(cfg)
    found: dict[str, torch.Tensor] = {}
    files = _weight_files(folder)
    show = progress if progress is not None else len(files) > 1
    for f in tqdm(files, desc=f"loading {folder.name}", unit="file", disable=not show):
        try:
            with safe_open(str(f), framework="pt") as sf:
                for name in sf.keys():
                    if name.endswith(IGNORED_SUFFIXES) or (name == "lm_head.weight" and cfg.tie_word_embeddings
                                                           and not cfg.feature_draft):
                        continue
                    if name not in expected:
                        raise WeightLoadError(f"{f}: unexpected tensor {name!r} for a {cfg.arch} model")
                    t = sf.get_tensor(name)
                    if tuple(t.shape) != expected[name]:
                        raise WeightLoadError(
                            f"{f}: tensor {name!r} has shape {tuple(t.shape)}, expected {expected[name]}")
                    found[name] = t
        except (OSError, RuntimeError) as e:
            raise WeightLoadError(f"{f}: cannot read safetensors file ({e})") from None
    missing = [n for n in expected if n not in found]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise WeightLoadError(f"{folder}: tensor {missing[0]!r} is missing{more}")
    return found


def load_model(folder: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               progress: bool | None = None, tp: TPGroup | None = None) -> Decoder:
    """With `tp`, this rank keeps its shard: its heads of q/k/v and o, its part of gate/up and down (rows,
    columns) and of lm_head's vocabulary. On CPU every matrix the model multiplies by gets a packed copy
    (`ssd.models.linear.pack_model`; ``SSD_PACKED_WEIGHTS=0`` turns it off)."""
    folder = Path(folder)
    cfg = ModelConfig.from_folder(folder)
    sd = read_state_dict(folder, cfg, progress)
    if cfg.feature_draft:
        if tp is not None:
            raise ValueError(f"{folder}: a feature-reading draft runs without tensor parallelism")
        model = FeatureDraft(cfg)
    else:
        model = Decoder(cfg, tp)
    cat = torch.cat

    def heads(t, dim=0):
        return t if tp is None else tp.head_rows(t, cfg.num_kv_heads, dim)

    def rows(t):
        return t if tp is None else tp.shard_rows(t)

    def cols(t):
        return t if tp is None else tp.shard_cols(t)

    def put(param: torch.nn.Parameter, value: torch.Tensor):
        param.data = value.to(device=device, dtype=dtype).contiguous()

    put(model.embed, sd["model.embed_tokens.weight"])
    put(model.norm.weight, sd["model.norm.weight"])
    if tp is not None:
        put(model.lm_head, tp.vocab_rows(sd["model.embed_tokens.weight" if cfg.tie_word_embeddings
                                            else "lm_head.weight"]))
    elif model.lm_head is not None:
        put(model.lm_head, sd["lm_head.weight"])
    if cfg.feature_draft:
        put(model.fc_weight, sd["fc.weight"])
        put(model.fc_bias, sd["fc.bias"])
        put(model.feature_norm.weight, sd["fc.feature_norm.weight"])
        put(model.embed_norm.weight, sd["fc.embed_norm.weight"])
        ids = sd["vocab_ids"].to(torch.long)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size):
            raise WeightLoadError(f"{folder}: vocab_ids must lie in [0, {cfg.vocab_size})")
        model.vocab_ids = ids.to(device)
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        put(layer.attn.qkv_weight, cat([heads(sd[a + f"{x}_proj.weight"]) for x in "qkv"]))
        put(layer.attn.o_weight, heads(sd[a + "o_proj.weight"], dim=1))
        if layer.attn.qkv_bias is not None:
            put(layer.attn.qkv_bias, cat([heads(sd[a + f"{x}_proj.bias"]) for x in "qkv"]))
            put(layer.attn.o_bias, sd[a + "o_proj.bias"])
        if layer.attn.q_norm is not None:
            put(layer.attn.q_norm.weight, sd[a + "q_norm.weight"])
            put(layer.attn.k_norm.weight, sd[a + "k_norm.weight"])
        put(layer.mlp.gate_up_weight, cat([rows(sd[m + "gate_proj.weight"]), rows(sd[m + "up_proj.weight"])]))
        put(layer.mlp.down_weight, cols(sd[m + "down_proj.weight"]))
        if layer.mlp.gate_up_bias is not None:
            put(layer.mlp.gate_up_bias, cat([rows(sd[m + "gate_proj.bias"]), rows(sd[m + "up_proj.bias"])]))
            put(layer.mlp.down_bias, sd[m + "down_proj.bias"])
        put(layer.input_norm.weight, sd[p + "input_layernorm.weight"])
        put(layer.post_attn_norm.weight, sd[p + "post_attention_layernorm.weight"])
    model.eval().requires_grad_(False)
    pack_model(model)
    return model
