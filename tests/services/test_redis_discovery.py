"""Workers registered in a real Redis are found by the router; an unreachable Redis is a clear start-up error."""
import subprocess
import sys
import time

import pytest

from ssd.cli.launcher import Stack, StackConfig, free_port
from ssd.client import Client
from tests.redis_server import RedisServer, needs_redis

pytestmark = needs_redis


@pytest.fixture
def redis_url(tmp_path):
    server = RedisServer(tmp_path).start()
    yield server.url
    server.stop()


def test_router_discovers_registered_workers(default_models, redis_url, tmp_path, chat_prompts, ar_reference):
    cfg = StackConfig(mode="ssd", redis_url=redis_url, log_dir=tmp_path / "logs", threads=1, target_cpus="0",
                      draft_cpus="1")
    with Stack(cfg) as stack, Client(stack.grpc_address, timeout=300) as client:
        deadline = time.monotonic() + 60  # serving needs one target; the draft may register a moment later
        while len(client.server_info().drafts) < 1 and time.monotonic() < deadline:
            time.sleep(0.3)
        info = client.server_info()
        assert info.targets == stack.target_data and info.drafts == stack.draft_data
        result = client.generate(chat_prompts[0], max_tokens=16, ignore_eos=True, mode="sd")
        assert result.token_ids == ar_reference[0][:16] and result.stats.cache_misses == 0
    assert "discovered draft" in (tmp_path / "logs" / "router.log").read_text()


def test_unreachable_redis_at_start_is_a_clear_error(default_models):
    port = free_port()
    out = subprocess.run([sys.executable, "-m", "ssd.cli", "router", "--discovery", "redis", "--redis-url",
                          f"redis://127.0.0.1:{port}/0", "--grpc-address", "127.0.0.1:0", "--http-address", ""],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert f"cannot reach Redis at redis://127.0.0.1:{port}" in out.stderr
