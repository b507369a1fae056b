"""The default target's weights from the SmolLM2 GGUF with gguf-py alone, for a GPU machine with no network whose
transformers differs from ours (or is missing): the same tensors, bit for bit, as `ssd models prepare` writes
(transformers' GGUF loader: gguf-py's dequantiser, llama.cpp's q/k row permutation undone, float32).

    python bench/gpu/offline_target.py GGUF MODELS_DIR --files FOLDER [--expect DIGEST]

writes MODELS_DIR/smollm2-135m-instruct/: model.safetensors decoded from GGUF, beside the small files of a
prepared target folder copied from FOLDER (config, tokenizer files, source.json and the `.ssd-prepared` marker,
which `prepare_default_models(models_dir, gguf=GGUF)` then accepts as done). It prints a digest over every
tensor (name and bytes, sorted by name); with --expect, a different one is an error (exit 3) and nothing is
written. `python bench/gpu/offline_target.py --digest FOLDER` prints a prepared folder's digest to expect.
bench/gpu/carry.sh uses both; tests/distill/test_offline_target.py checks the decoder against prepare.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from ssd.paths import target_dir  # noqa: E402

_PARTS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
          "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
          "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
SMALL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json", "source.json",
               ".ssd-prepared")


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's interleaving of each head's rotary halves in the q and k rows."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def decode_gguf(path: str | Path, heads: int, kv_heads: int) -> dict[str, torch.Tensor]:
    import gguf

    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        w = gguf.dequantize(t.data, t.tensor_type)
        if t.name == "token_embd.weight":
            name = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            name = "model.norm.weight"
        else:
            blk, i, part, _ = t.name.split(".")
            if blk != "blk" or part not in _PARTS:
                raise ValueError(f"{path}: unexpected tensor {t.name}")
            name = f"model.layers.{i}.{_PARTS[part]}.weight"
            if part in ("attn_q", "attn_k"):
                w = _unpermute(w, heads if part == "attn_q" else kv_heads)
        out[name] = torch.from_numpy(np.copy(w)).to(torch.float32).contiguous()
    return out


def digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", nargs="?", type=Path)
    ap.add_argument("models_dir", nargs="?", type=Path)
    ap.add_argument("--files", type=Path, help="a prepared target folder's small files")
    ap.add_argument("--expect", help="the digest the decoded tensors must have")
    ap.add_argument("--digest", type=Path, metavar="FOLDER", help="print a prepared folder's digest and exit")
    args = ap.parse_args(argv)
    if args.digest:
        print(digest(load_file(str(args.digest / "model.safetensors"))))
        return 0
    if not (args.gguf and args.models_dir and args.files):
        ap.error("GGUF, MODELS_DIR and --files are needed")
    cfg = json.loads((args.files / "config.json").read_text())
    tensors = decode_gguf(args.gguf, cfg["num_attention_heads"], cfg["num_key_value_heads"])
    got = digest(tensors)
    print(f"digest {got} over {len(tensors)} tensors")
    if args.expect and got != args.expect:
        print(f"digest mismatch: expected {args.expect}", file=sys.stderr)
        return 3
    folder = target_dir(args.models_dir)
    folder.mkdir(parents=True, exist_ok=True)
    for name in SMALL_FILES:
        shutil.copyfile(args.files / name, folder / name)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
