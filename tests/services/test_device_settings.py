"""--device, --dtype and --cuda-graphs of the target and draft services: bad values stop the service at once with
a message naming them; a bfloat16 stack serves requests (its KV cache takes half the bytes per token)."""
import subprocess
import sys

import pytest
import torch

from ssd.client import Client
from ssd.control import describe
from ssd.launcher import Stack, StackConfig
from ssd.models.parallel import free_port
from ssd.worker_service import WorkerConfig, device_problem


@pytest.mark.parametrize("changes,message", [
    ({"dtype": "float64"}, "--dtype must be one of float32, bfloat16, float16"),
    ({"cuda_graphs": "sometimes"}, "--cuda-graphs must be auto, on or off"),
    ({"device": "banana"}, "--device must be cpu, cuda or cuda:N"),
    ({"device": "meta"}, "--device must be cpu, cuda or cuda:N"),
    ({"cuda_graphs": "on"}, "--cuda-graphs on needs --device cuda"),
])
def test_bad_settings_are_named(changes, message):
    cfg = WorkerConfig()
    for name, value in changes.items():
        setattr(cfg, name, value)
    assert message in device_problem(cfg)


def test_good_settings_pass():
    for dtype in ("float32", "bfloat16", "float16"):
        cfg = WorkerConfig()
        cfg.dtype = dtype
        assert device_problem(cfg) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where there is no CUDA device")
@pytest.mark.parametrize("role", ["target", "draft"])
def test_cuda_without_a_device_stops_the_service_naming_it(default_models, role):
    cmd = [sys.executable, "-m", "ssd.cli", role, "--device", "cuda", "--control-address", f"127.0.0.1:{free_port()}",
           "--data-address", f"tcp://127.0.0.1:{free_port()}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--device cuda: no CUDA device" in proc.stderr and "Traceback" not in proc.stderr


def test_a_bfloat16_stack_serves_and_halves_the_kv_bytes(default_models, chat_prompts, tmp_path):
    cfg = StackConfig(mode="ssd", target_cpus="0", draft_cpus="1", threads=1, log_dir=tmp_path, max_batch=2,
                      draft_model=default_models["layer_draft"],
                      extra={"target": ["--dtype", "bfloat16"], "draft": ["--dtype", "bfloat16"]})
    with Stack(cfg) as stack:
        info = describe(stack.target_control[0])
        with Client(stack.grpc_address, timeout=300) as client:
            for mode in ("ssd", "ar"):
                out = client.generate(chat_prompts[0], max_tokens=12, ignore_eos=True, mode=mode)
                assert len(out.token_ids) == 12, mode
    from ssd.config import ModelConfig
    m = ModelConfig.from_folder(default_models["target"])
    per_token = 2 * m.num_layers * m.num_kv_heads * m.head_dim * 2   # K and V, two bytes each
    assert info.kv_capacity_bytes == (info.kv_capacity_tokens + 1) * per_token   # + the cache's pad row
