"""Loader errors name the file, tensor or field that is wrong."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from ssd.config import ModelConfigError
from ssd.models.loader import WeightLoadError, load_model


@pytest.fixture
def folder(tmp_path, tiny_llama_dir):
    dst = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, dst)
    return dst


def test_missing_config_names_file(tmp_path):
    with pytest.raises(ModelConfigError, match=r"config\.json: file not found"):
        load_model(tmp_path)


def test_missing_weights_names_folder(folder):
    (folder / "model.safetensors").unlink()
    with pytest.raises(WeightLoadError, match=r"no \*\.safetensors"):
        load_model(folder)


def test_missing_shard_named(folder):
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(WeightLoadError, match="model-00002-of-00002.safetensors: file not found"):
        load_model(folder)


def test_missing_tensor_named(folder):
    sd = load_file(folder / "model.safetensors")
    del sd["model.layers.1.mlp.up_proj.weight"]
    save_file(sd, folder / "model.safetensors")
    with pytest.raises(WeightLoadError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight' is missing"):
        load_model(folder)


def test_wrong_shape_named(folder):
    sd = load_file(folder / "model.safetensors")
    sd["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(7, 64)
    save_file(sd, folder / "model.safetensors")
    with pytest.raises(WeightLoadError, match=r"k_proj\.weight' has shape \(7, 64\), expected \(32, 64\)"):
        load_model(folder)


def test_unknown_architecture_named(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["MistralForCausalLM"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match=r"field 'architectures' is \['MistralForCausalLM'\]"):
        load_model(folder)


def test_missing_field_named(folder):
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["hidden_size"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match="'hidden_size' is missing"):
        load_model(folder)


def test_unsupported_rope_type_named(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match="rope_type 'yarn' is not supported"):
        load_model(folder)
