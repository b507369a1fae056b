import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM



@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """A random-initialised Llama folder (GQA, tied embeddings) for fast CPU tests."""
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def default_models():
    """The embedded default pair, prepared once into the shared models folder ({"target": ..., "draft": ...})."""
    from ssd.models.prepare import prepare_default_models
    from ssd.paths import default_models_dir

    return prepare_default_models(default_models_dir(), log=lambda *a: None)
