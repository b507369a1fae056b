"""Model configuration read from a Hugging Face `config.json`.

One decoder serves the Llama-3 family (SmolLM2 is this architecture) and Qwen3 (Llama plus RMSNorm on q
and k). `ModelConfig.from_folder` accepts only what the decoder implements and otherwise raises a
`ModelConfigError` that names the file and the field.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3"}
ROPE_TYPES = ("default", "llama3", "linear")


class ModelConfigError(ValueError):
    """A model folder's config.json is missing, malformed or describes an unsupported model."""


@dataclass(slots=True)
class ModelConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict = field(default_factory=dict)
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    name: str = ""
    feature_draft: dict = field(default_factory=dict)  # set for a feature-reading draft (ssd.models.eagle)

    def __post_init__(self):
        if self.arch not in ARCHITECTURES.values():
            raise ModelConfigError(f"arch must be one of {sorted(ARCHITECTURES.values())}, got {self.arch!r}")
        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                  "head_dim", "max_position_embeddings"):
            if getattr(self, f) <= 0:
                raise ModelConfigError(f"{f} must be positive, got {getattr(self, f)}")
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of num_key_value_heads ({self.num_kv_heads})")
        rope_type = self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise ModelConfigError(f"rope_scaling.rope_type {rope_type!r} is not supported (supported: {ROPE_TYPES})")

    @property
    def qk_norm(self) -> bool:
        return self.arch == "qwen3"

    @classmethod
    def from_dict(cls, d: dict, source: str = "config.json") -> "ModelConfig":
        archs = d.get("architectures") or []
        arch = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
        if arch is None:
            raise ModelConfigError(
                f"{source}: field 'architectures' is {archs!r}; supported: {sorted(ARCHITECTURES)}")
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ModelConfigError(f"{source}: field 'hidden_act' is {act!r}; only 'silu' is supported")
        try:
            heads = int(d["num_attention_heads"])
            hidden = int(d["hidden_size"])
            rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
            theta = rope.pop("rope_theta", None) or d.get("rope_theta", 10000.0)
            if rope.get("rope_type", rope.get("type", "default")) == "default":
                rope = {}
            eos = d.get("eos_token_id")
            eos = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            return cls(
                arch=arch,
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_layers=int(d["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or hidden // heads),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                rope_theta=float(theta),
                rope_scaling=rope,
                max_position_embeddings=int(d.get("max_position_embeddings", 8192)),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                attention_bias=bool(d.get("attention_bias", False)),
                mlp_bias=bool(d.get("mlp_bias", False)),
                bos_token_id=d.get("bos_token_id"),
                eos_token_ids=eos,
                name=str(d.get("_name_or_path", "")),
                feature_draft=_feature_draft(d.get("ssd_feature_draft"), source),
            )
        except KeyError as e:
            raise ModelConfigError(f"{source}: required field {e.args[0]!r} is missing") from None
        except ModelConfigError as e:
            raise ModelConfigError(f"{source}: {e}") from None

    def context_length(self, requested: int = 0, strict: bool = False) -> int:
        """The longest sequence served: `requested` (0 = the model's own, max_position_embeddings), never past
        the model's own (`strict`: asking for more is a ValueError rather than cut to it)."""
        own = self.max_position_embeddings
        if strict and requested > own:
            raise ValueError(f"--max-len {requested} is past the model's context of {own} tokens "
                             f"(max_position_embeddings in its config.json); use at most {own}, or 0 for it")
        return min(requested or own, own)

    @property
    def reads_features(self) -> bool:
        return bool(self.feature_draft)

    @classmethod
    def from_folder(cls, folder: str | Path) -> "ModelConfig":
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise ModelConfigError(f"{path}: file not found (a model folder needs config.json)")
        try:
            d = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ModelConfigError(f"{path}: invalid JSON ({e})") from None
        cfg = cls.from_dict(d, source=str(path))
        cfg.name = cfg.name or Path(folder).name
        return cfg


def _feature_draft(d, source: str) -> dict:
    """The `ssd_feature_draft` block of a feature-reading draft's config.json: its output vocabulary size and
    the size of the target features it reads."""
    if d is None:
        return {}
    if not isinstance(d, dict):
        raise ModelConfigError(f"{source}: field 'ssd_feature_draft' must be an object")
    try:
        out = {"draft_vocab_size": int(d["draft_vocab_size"]), "feature_size": int(d["feature_size"])}
    except (KeyError, TypeError, ValueError) as e:
        raise ModelConfigError(f"{source}: field 'ssd_feature_draft' needs integer draft_vocab_size and "
                               f"feature_size ({e})") from None
    if min(out.values()) <= 0:
        raise ModelConfigError(f"{source}: ssd_feature_draft sizes must be positive, got {out}")
    return out
