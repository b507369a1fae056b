import socket
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from ssd.control import ControlServer, describe, wait_serving
from ssd.pb import worker_pb2, worker_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

INFO = dict(role="draft", model_id="tiny-llama", tokenizer_hash="ab" * 32, vocab_size=128, max_len=512,
            kv_capacity_tokens=4096, kv_capacity_bytes=1 << 20, num_slots=8, k=4, fanout=[3, 2, 1, 1, 1],
            data_address="tcp://127.0.0.1:5601", protocol_version=1, state="serving", active_sequences=2,
            version="0.1.0")


class FakeWorker:
    def __init__(self):
        self.info_error = None
        self.drains = []

    def info(self):
        if self.info_error is not None:
            raise self.info_error
        return INFO

    def on_drain(self, grace_seconds):
        if grace_seconds > 3600:
            raise ValueError(f"grace_seconds {grace_seconds} is over an hour")
        self.drains.append(grace_seconds)
        return 2


@pytest.fixture
def worker():
    fake = FakeWorker()
    server = ControlServer("127.0.0.1:0", fake.info, fake.on_drain)
    port = server.start()
    fake.address = f"127.0.0.1:{port}"
    channel = grpc.insecure_channel(fake.address)
    fake.server, fake.stub = server, worker_pb2_grpc.WorkerStub(channel)
    yield fake
    channel.close()
    server.stop(0)


def health_status(address, service=""):
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def test_describe_returns_the_workers_fields(worker):
    info = describe(worker.address)
    assert info.role == worker_pb2.WORKER_ROLE_DRAFT
    assert info.state == worker_pb2.WORKER_STATE_SERVING
    assert (info.model_id, info.tokenizer_hash, info.vocab_size, info.max_len) == ("tiny-llama", "ab" * 32, 128, 512)
    assert (info.kv_capacity_tokens, info.kv_capacity_bytes, info.num_slots, info.k) == (4096, 1 << 20, 8, 4)
    assert list(info.fanout) == [3, 2, 1, 1, 1]
    assert (info.data_address, info.protocol_version, info.active_sequences) == ("tcp://127.0.0.1:5601", 1, 2)
    assert info.version == "0.1.0"
    assert info.pid > 0  # filled in by the server when the worker leaves it out


def test_health_is_not_serving_until_set_and_after_drain(worker):
    for service in ("", "ssd.v1.Worker"):
        assert health_status(worker.address, service) == NOT_SERVING
    worker.server.set_serving(True)
    for service in ("", "ssd.v1.Worker"):
        assert health_status(worker.address, service) == SERVING
    assert wait_serving(worker.address, timeout=5)

    reply = worker.stub.Drain(worker_pb2.DrainRequest(grace_seconds=30), timeout=5)
    assert reply.active_sequences == 2 and worker.drains == [30]
    for service in ("", "ssd.v1.Worker"):
        assert health_status(worker.address, service) == NOT_SERVING


def test_reflection_lists_worker_health_and_reflection(worker):
    with grpc.insecure_channel(worker.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (reply,) = list(stub.ServerReflectionInfo(iter([request]), timeout=5))
    names = {s.name for s in reply.list_services_response.service}
    assert names == {"ssd.v1.Worker", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}


def test_value_error_from_a_callback_is_invalid_argument_with_its_message(worker):
    with pytest.raises(grpc.RpcError) as err:
        worker.stub.Drain(worker_pb2.DrainRequest(grace_seconds=7200), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "grace_seconds 7200 is over an hour"
    assert health_status(worker.address) == NOT_SERVING and worker.drains == []


def test_other_callback_errors_are_internal(worker):
    worker.info_error = RuntimeError("KV cache not allocated")
    with pytest.raises(grpc.RpcError) as err:
        describe(worker.address)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert "KV cache not allocated" in err.value.details()


def test_a_malformed_info_dict_is_internal_not_invalid_argument():
    with ControlServer("127.0.0.1:0", lambda: {**INFO, "role": "oracle"}, lambda grace: 0) as server:
        with pytest.raises(grpc.RpcError) as err:
            describe(f"127.0.0.1:{server.port}")
    assert err.value.code() == grpc.StatusCode.INTERNAL and "ORACLE" in err.value.details()


def test_wait_serving_gives_up_quickly_when_nobody_listens():
    with socket.socket() as s:  # a port that was free a moment ago, now closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    assert wait_serving(f"127.0.0.1:{port}", timeout=0.5) is False
    assert time.monotonic() - start < 2.0


def test_control_plane_imports_no_torch():
    code = "import sys, ssd.control, ssd.pb.worker_pb2_grpc; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
