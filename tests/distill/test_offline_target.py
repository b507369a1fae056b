"""The pieces that carry the GPU recipe to an offline machine (bench/gpu/carry.sh): the target rebuilt from the
GGUF with gguf-py alone must be `ssd models prepare`'s, tensor for tensor and bit for bit (the digest checked
there), a wrong digest must stop it, and the preflight must run the recipe's stages on a tiny target."""
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from bench.gpu.offline_target import decode_gguf, digest, main
from ssd.models.prepare import default_gguf_path, is_prepared, read_marker

ROOT = Path(__file__).resolve().parents[2]


def test_the_gguf_decodes_to_the_prepared_target_bit_for_bit(default_models, tmp_path):
    target = default_models["target"]
    prepared = load_file(str(target / "model.safetensors"))
    decoded = decode_gguf(default_gguf_path(), heads=9, kv_heads=3)
    assert set(decoded) == set(prepared)
    for name, t in prepared.items():
        assert decoded[name].dtype == t.dtype and torch.equal(decoded[name], t), name
    want = digest(prepared)
    assert digest(decoded) == want

    # the command line: a wrong digest writes nothing; the right one writes a folder prepare accepts as done
    assert main([str(default_gguf_path()), str(tmp_path / "bad"), "--files", str(target), "--expect", "0" * 64]) == 3
    assert not (tmp_path / "bad").exists()
    assert main([str(default_gguf_path()), str(tmp_path / "models"), "--files", str(target), "--expect", want]) == 0
    folder = tmp_path / "models" / target.name
    marker = read_marker(target)
    assert is_prepared(folder, {k: marker[k] for k in ("format", "kind", "source")})
    assert digest(load_file(str(folder / "model.safetensors"))) == want


def test_a_permutation_left_in_place_changes_the_digest(default_models):
    # the check is not blind: q rows interleaved as in the GGUF give another digest
    prepared = load_file(str(default_models["target"] / "model.safetensors"))
    name = "model.layers.0.self_attn.q_proj.weight"
    w = prepared[name]
    prepared[name] = w.reshape(9, 2, 32, -1).transpose(1, 2).reshape(w.shape).contiguous()
    assert not torch.equal(prepared[name], w)
    assert digest(prepared) != digest(load_file(str(default_models["target"] / "model.safetensors")))


def test_the_preflight_runs_every_stage_on_a_tiny_target(default_models, tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench/gpu/preflight.py"), "--files", str(default_models["target"]),
                        "--device", "cpu", "--work", str(tmp_path / "w")], capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "PREFLIGHT OK" in r.stdout
    # two generator processes, a warm start from the first export, both drafts evaluated
    assert "initialised from" in r.stdout and r.stdout.count("== gpu_distill ==") == 2
