"""bench/gpu/distill.sh, the GPU recipe for the default draft: its CPU smoke path runs every stage (models,
teacher data, training with a draft exported at each checkpoint, evaluation against the packaged draft) and
leaves a draft that `ssd models prepare` would install; it says so where there is no GPU, and fails where the
interpreter has no torch. On a CUDA machine the full run is the `gpu` test."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ssd.distill.train import load_trained
from ssd.models.eagle import FeatureDraft, trained_tensors
from ssd.models.loader import load_model
from ssd.models.prepare import EAGLE_WEIGHTS, _write_eagle

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu" / "distill.sh"


def _run(tmp_path, models_dir, timeout: int, *args: str, **env):
    full = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "SSD_GPU_DISTILL_SMOKE")}
    full |= {"PYTHON": sys.executable, "OUT": str(tmp_path / "out"), "SSD_GPU_DISTILL_WORK": str(tmp_path / "work"),
             "SSD_MODELS_DIR": str(models_dir)} | env
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=full, cwd=ROOT)


def test_the_smoke_path_leaves_an_installable_draft_its_history_and_a_summary(default_models, tmp_path):
    # the packaged draft grown by a layer that alone trains, with the loss weighted after draft errors, unrolled 5
    # deep: the recipe's options reach its training; two generator processes share the teacher data's shards
    r = _run(tmp_path, default_models["target"].parent, 600, "--layers", "2", "--init-from", str(EAGLE_WEIGHTS),
             "--train", "grown", "--correction-weight", "1", "--depth", "5", "--depth-decay", "0.9",
             "--gen-procs", "2", SSD_GPU_DISTILL_SMOKE="1")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "== gpu_distill ==" in r.stdout
    out = tmp_path / "out"
    for name in ("draft.safetensors", "draft.json", "draft_config.json", "history.json", "gpu_distill_smoke.json",
                 "distill.log"):
        assert (out / name).is_file(), name

    # the packaged format: the trained tensors only (bf16), provenance in the file's metadata and beside it
    target = load_model(default_models["target"])
    draft = load_trained(target, out)
    with safe_open(str(out / "draft.safetensors"), framework="pt") as f:
        names, meta = set(f.keys()), f.metadata()
        dtypes = {f.get_tensor(k).dtype for k in names if k != "vocab_ids"}
    assert names == set(trained_tensors(draft)) and dtypes == {torch.bfloat16}
    provenance = json.loads((out / "draft.json").read_text())
    assert provenance == meta and provenance["steps"] == "2" and provenance["command"].startswith("bash bench/gpu")
    train_config = json.loads(provenance["train_config"])
    assert (train_config["device"], train_config["layers"], train_config["correction_weight"]) == ("cpu", 2, 1.0)
    assert (train_config["depth"], train_config["depth_decay"]) == (5, 0.9)
    assert train_config["train_only"] == "grown" and len(draft.layers) == 2
    shipped = load_file(str(EAGLE_WEIGHTS))   # only the grown layer trained: the packaged draft lies under it
    with safe_open(str(out / "draft.safetensors"), framework="pt") as f:
        for name, t in shipped.items():
            assert torch.equal(f.get_tensor(name), t), name
        assert f.get_tensor("model.layers.1.mlp.down_proj.weight").abs().sum() > 0

    # what `ssd models prepare` does with a shipped draft: a model folder the loader reads as a FeatureDraft
    folder = tmp_path / "installed"
    folder.mkdir()
    _write_eagle(default_models["target"], out / "draft.safetensors", {}, folder)
    installed = load_model(folder)
    assert isinstance(installed, FeatureDraft)
    for name, t in trained_tensors(installed).items():
        assert torch.equal(t, trained_tensors(draft)[name]), name

    history = json.loads((out / "history.json").read_text())
    assert max(r["step"] for r in history["log"]) == 2
    assert any("held_out" in r for r in history["log"])

    summary = json.loads((out / "gpu_distill_smoke.json").read_text())
    assert summary["errors"] == []
    # 9 prompts in shards of 3, every one answered once between the two processes
    assert summary["data"]["shards"] == 3 and summary["data"]["sequences"] == 9
    assert summary["data"]["answer_tokens"] > 0 and "helper process" not in r.stdout
    assert not list((tmp_path / "work" / "data").glob("*.claim"))
    assert summary["train"]["steps"] == 2
    for name in ("new", "packaged"):
        for set_name in ("unseen_prompts", "held_out_shard"):
            acc = summary["eval"][name][set_name]
            assert acc["positions"] > 0 and len(acc["conditional"]) == 6 and len(acc["t1_by_depth"]) == 6
        assert summary["eval"][name]["engine_sd_k3"]["rounds"] > 0
    assert isinstance(summary["eval"]["beats_packaged"], bool)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA exit")
def test_without_cuda_it_says_so_and_exits_zero(tmp_path):
    r = _run(tmp_path, tmp_path / "models", 120)
    assert r.returncode == 0, r.stderr
    assert "no CUDA device" in r.stdout and not (tmp_path / "out").exists()


def test_an_interpreter_without_torch_fails(tmp_path):
    fake = tmp_path / "python-without-torch"
    fake.write_text("#!/bin/sh\n"   # the same interpreter with torch hidden from it
                    f"if [ \"$1\" = -c ]; then exec {sys.executable} -c \"import sys; sys.modules['torch'] = None\n$2\"; fi\n"
                    f"exec {sys.executable} \"$@\"\n")
    fake.chmod(0o755)
    r = _run(tmp_path, tmp_path / "models", 120, PYTHON=str(fake))
    assert r.returncode == 1 and "cannot import torch" in r.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_the_full_recipe_makes_millions_of_teacher_tokens_and_a_draft(default_models, tmp_path):
    r = _run(tmp_path, default_models["target"].parent, 560)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    summary = json.loads((tmp_path / "out" / "gpu_distill.json").read_text())
    assert summary["data"]["tokens"] > 1_000_000 and summary["train"]["steps"] > 100
    assert load_trained(load_model(default_models["target"]), tmp_path / "out").vocab_ids.numel() > 0
