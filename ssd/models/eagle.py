"""A feature-reading draft (EAGLE-style): a decoder layer over the target's own hidden states.

Each input token is represented by `fc([norm(feature of its predecessor) ; norm(embedding of the token)])`
(two RMSNorms with their own weights: the target's features have an RMS near 30 with a few dimensions in the
thousands, its embeddings one near 0.1, so unnormalised the token would be drowned out), where the
feature is the target's final pre-norm hidden state at the previous position: known exactly for verified
tokens, and replaced by the draft's own output (its prediction of that feature) for tokens it drafted
itself. One decoder layer (initialised from the target's last layer) follows, then the target's frozen
final norm and an output layer restricted to a draft vocabulary (rows of the target's output layer for the
most frequent tokens of the target's own generations): the draft proposes only those tokens, so its cost
per token stays a small fraction of the target's. The pre-norm output at a position is the draft's
estimate of the target's feature there, which feeds the next drafted position.

Exactness does not depend on any of this: a proposal distribution with zeros outside the draft vocabulary
is a valid `q` for speculative sampling, and greedy verification only compares tokens.

A draft folder is a Hugging Face style folder whose config.json is the target's with `num_hidden_layers` set
to the draft's layers, `tie_word_embeddings` false and an `ssd_feature_draft` block; its weights are the
layer(s) (HF names), `model.embed_tokens.weight` and `model.norm.weight` (copies of the target's),
`lm_head.weight` ([draft vocab, hidden]), `fc.weight`, `fc.bias`, `fc.feature_norm.weight`,
`fc.embed_norm.weight` and `vocab_ids` (int64 target token ids).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from ssd.config import ModelConfig
from ssd.models.decoder import Decoder, ForwardBatch, RMSNorm
from ssd.models.hf_layout import hf_layer_tensors
from ssd.models.linear import linear


class FeatureDraft(Decoder):
    reads_features = True

    def __init__(self, cfg: ModelConfig):
        if not cfg.feature_draft:
            raise ValueError("a FeatureDraft needs a config with an ssd_feature_draft block")
        super().__init__(dataclasses.replace(cfg, tie_word_embeddings=False))
        H, Fs, Vd = cfg.hidden_size, cfg.feature_draft["feature_size"], cfg.feature_draft["draft_vocab_size"]
        if Fs != H:
            raise ValueError(f"feature_size {Fs} must equal the draft's hidden_size {H}")
        self.feature_size = Fs
        self.fc_weight = nn.Parameter(torch.empty(H, Fs + H))
        self.fc_bias = nn.Parameter(torch.empty(H))
        self.feature_norm = RMSNorm(Fs, cfg.rms_norm_eps)
        self.embed_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = nn.Parameter(torch.empty(Vd, H))
        self.register_buffer("vocab_ids", torch.zeros(Vd, dtype=torch.long))

    def embed_inputs(self, batch: ForwardBatch) -> torch.Tensor:
        if batch.features is None:
            raise ValueError("a feature-reading draft needs batch.features")
        return self.input_states(batch.features, batch.input_ids)

    def input_states(self, features: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The first layer's input for tokens `ids` whose predecessors have `features`."""
        e = F.embedding(ids, self.embed)
        x = torch.cat((self.feature_norm(features.to(e.dtype)), self.embed_norm(e)), dim=-1)
        return linear(x, self.fc_weight, self.fc_bias)

    def linear_weights(self) -> list[torch.Tensor]:
        return [self.fc_weight] + super().linear_weights()

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary only ([..., draft_vocab_size], float32)."""
        return linear(hidden, self.lm_head).float()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits: -inf outside the draft vocabulary, so sampling never proposes those."""
        small = self.draft_logits(hidden)
        full = small.new_full((*small.shape[:-1], self.cfg.vocab_size), float("-inf"))
        full[..., self.vocab_ids] = small
        return full


def feature_draft_config(target: ModelConfig, draft_vocab_size: int, layers: int = 1) -> dict:
    """The config.json dict of a feature draft for `target` (a Llama or Qwen3 config)."""
    arch = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[target.arch]
    d = {
        "architectures": [arch], "model_type": target.arch, "vocab_size": target.vocab_size,
        "hidden_size": target.hidden_size, "intermediate_size": target.intermediate_size,
        "num_hidden_layers": layers, "num_attention_heads": target.num_heads,
        "num_key_value_heads": target.num_kv_heads, "head_dim": target.head_dim,
        "rms_norm_eps": target.rms_norm_eps, "rope_theta": target.rope_theta,
        "max_position_embeddings": target.max_position_embeddings, "tie_word_embeddings": False,
        "attention_bias": target.attention_bias, "mlp_bias": target.mlp_bias, "hidden_act": "silu",
        "bos_token_id": target.bos_token_id, "eos_token_id": list(target.eos_token_ids),
        "ssd_feature_draft": {"draft_vocab_size": int(draft_vocab_size), "feature_size": target.hidden_size},
    }
    if target.rope_scaling:
        d["rope_scaling"] = dict(target.rope_scaling)
    return d


def trained_tensors(draft: FeatureDraft) -> dict[str, torch.Tensor]:
    """What training changes (fc, the layers) plus the vocabulary ids: the part worth shipping; the rest
    (embedding, final norm, head rows) is the target's own and is taken from it at install time."""
    out = {"fc.weight": draft.fc_weight, "fc.bias": draft.fc_bias, "vocab_ids": draft.vocab_ids,
           "fc.feature_norm.weight": draft.feature_norm.weight, "fc.embed_norm.weight": draft.embed_norm.weight}
    for i, layer in enumerate(draft.layers):
        out |= hf_layer_tensors(layer, i)
    return {k: v.detach().contiguous() for k, v in out.items()}


def write_draft_folder(draft: FeatureDraft, folder, tokenizer_from=None, dtype=torch.float32,
                       extra_config: dict | None = None) -> None:
    """A loadable model folder (config.json, model.safetensors, and the tokenizer files copied from
    `tokenizer_from`, the target's folder)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = trained_tensors(draft) | {"model.embed_tokens.weight": draft.embed.detach(),
                                        "model.norm.weight": draft.norm.weight.detach(),
                                        "lm_head.weight": draft.lm_head.detach()}
    tensors = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in tensors.items()}
    config = feature_draft_config(draft.cfg, len(draft.vocab_ids), len(draft.layers)) | (extra_config or {})
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer_from is not None:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            src = Path(tokenizer_from) / name
            if src.is_file():
                shutil.copyfile(src, folder / name)
