"""The context a worker serves is its model's own (max_position_embeddings) unless --max-len sets less; the KV
budget is checked before anything loads, and a service that cannot hold one full context stops with exit code 2
and a message naming the flags."""
import subprocess
import sys

import pytest

from ssd.engine.target_tp import SETTINGS, build_target
from ssd.models.kv_cache import DEFAULT_KV_TOKENS, default_kv_tokens
from ssd.models.loader import load_model
from ssd.models.parallel import free_port
from ssd.worker.service import Role, WorkerConfig, context_problem


def _role(folder, k=0):
    return Role("draft" if k else "target", folder, load=lambda: None, handler=lambda w, e: None, k=k)


def _cfg(**changes) -> WorkerConfig:
    cfg = WorkerConfig()
    for name, value in changes.items():
        setattr(cfg, name, value)
    return cfg


def test_the_default_context_is_the_models_own_and_kv_holds_it(tiny_llama_dir):
    settings = {name: getattr(WorkerConfig(), name) for name in SETTINGS}
    worker = build_target(load_model(tiny_llama_dir), {**settings, "max_seqs": 3})
    assert worker.max_len == 512   # the tiny model's max_position_embeddings, not a fixed 2048
    assert worker.cache.capacity_tokens == 3 * 512
    worker = build_target(load_model(tiny_llama_dir), {**settings, "max_len": 128})
    assert worker.max_len == 128


def test_the_default_kv_budget_holds_every_slot_up_to_a_cap_and_one_context_always():
    assert default_kv_tokens(4, 512) == 2048
    assert default_kv_tokens(16, 8192) == DEFAULT_KV_TOKENS
    assert default_kv_tokens(2, 131072) == 131072


@pytest.mark.parametrize("changes, k, message", [
    ({"max_len": 1024}, 0, "--max-len 1024 is past the model's context of 512 tokens"),
    ({"kv_tokens": 256}, 0, "a KV cache of 256 tokens (--kv-tokens) cannot hold one full context of 512 tokens"),
    ({"kv_tokens": 514}, 3, "raise --kv-tokens to at least 516"),
])
def test_settings_that_cannot_hold_a_context_are_named(tiny_llama_dir, changes, k, message):
    assert message in context_problem(_cfg(**changes), _role(tiny_llama_dir, k))


def test_settings_that_fit_pass(tiny_llama_dir):
    assert context_problem(WorkerConfig(), _role(tiny_llama_dir)) is None
    assert context_problem(_cfg(max_len=256, kv_tokens=256), _role(tiny_llama_dir)) is None
    assert context_problem(_cfg(max_len=256, kv_tokens=260), _role(tiny_llama_dir, 3)) is None


def test_a_target_asked_for_more_than_its_context_stops_naming_it(default_models):
    cmd = [sys.executable, "-m", "ssd.cli", "target", "--model", str(default_models["target"]), "--max-len", "9000",
           "--control-address", f"127.0.0.1:{free_port()}", "--data-address", f"tcp://127.0.0.1:{free_port()}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--max-len 9000 is past the model's context of 8192 tokens" in proc.stderr
    assert "Traceback" not in proc.stderr
