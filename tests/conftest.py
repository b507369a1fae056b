"""Suite-wide fixtures and rules.

- Models: the suite prepares the embedded default pair into a temporary models folder of its own
  (``$SSD_MODELS_DIR`` is set for the whole run, so every service a test starts reads the same folder), never into
  the user's ``~/.cache/ssd/models``. ``SSD_TEST_MODELS_DIR`` names a folder to keep between runs instead (a
  developer's loop: the GGUF conversion then happens once).
- ``CI=true``: a skipped test fails, unless it was skipped for want of CUDA (the only thing a CI machine may lack):
  a missing service (redis-server, the embedded GGUF) must not pass as a skip there.
"""
import os
import shutil
import tempfile

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

_OWN_MODELS_DIR: str | None = None


def pytest_configure(config):
    global _OWN_MODELS_DIR
    keep = os.environ.get("SSD_TEST_MODELS_DIR")
    if keep:
        os.makedirs(keep, exist_ok=True)
        os.environ["SSD_MODELS_DIR"] = keep
    else:
        _OWN_MODELS_DIR = tempfile.mkdtemp(prefix="ssd-test-models-")
        os.environ["SSD_MODELS_DIR"] = _OWN_MODELS_DIR


def pytest_unconfigure(config):
    if _OWN_MODELS_DIR:
        shutil.rmtree(_OWN_MODELS_DIR, ignore_errors=True)


def _ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if _ci() and report.skipped and not hasattr(report, "wasxfail"):
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if "cuda" not in reason.lower():
            report.outcome = "failed"
            report.longrepr = f"skipped under CI=true, where only CUDA may be missing: {reason}"


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """A random-initialised Llama folder (GQA, tied embeddings) for fast CPU tests. Weights of std 0.1, so its
    greedy tokens depend on the context (at the default 0.02 it repeats one token whatever came before, which hides
    a token computed from wrong KV)."""
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, initializer_range=0.1)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def default_models():
    """The embedded default pair, prepared once into the suite's models folder ({"target": ..., "draft": ...})."""
    from ssd.models.prepare import prepare_default_models
    from ssd.paths import default_models_dir

    return prepare_default_models(default_models_dir(), log=lambda *a: None)
