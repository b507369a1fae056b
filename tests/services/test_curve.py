"""Data-plane authentication: a CURVE worker admits only authorised router keys; nothing else reaches its inbox."""
import time

import pytest
import zmq

from ssd import wire
from ssd.cli import main
from ssd.curve import ClientKeys, KeyFileError, ServerKeys, client_keys, load_keypair, server_keys
from ssd.worker.io import WorkerEndpoint
from services.router.peers import Peer

READY = wire.Ready("target", "m", "h", 100, 64, 3, [])


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    out = tmp_path_factory.mktemp("keys")
    assert main(["keys", "generate", "--out", str(out), "--names", "router,worker,intruder"]) == 0
    return out


@pytest.fixture
def worker(keys):
    endpoint = WorkerEndpoint("tcp://127.0.0.1:0", lambda: READY, "target",
                              ServerKeys.load(keys / "worker.key_secret", keys / "router.key"))
    endpoint.start()
    yield endpoint
    endpoint.stop()


def _dealer(ctx, endpoint, public=None, secret=None, server=None):
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if public is not None:
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, server
    sock.connect(endpoint)
    return sock


def _answer(sock, timeout_ms=1500):
    return wire.decode(sock.recv_multipart()) if sock.poll(timeout_ms) else None


def test_keys_generate_writes_pairs_and_refuses_to_overwrite(keys, capsys):
    assert sorted(p.name for p in keys.iterdir()) == sorted(
        f"{n}.{s}" for n in ("router", "worker", "intruder") for s in ("key", "key_secret"))
    assert (keys / "router.key_secret").stat().st_mode & 0o077 == 0
    assert "secret-key" not in (keys / "router.key").read_text()
    assert main(["keys", "generate", "--out", str(keys)]) == 2
    assert "exists" in capsys.readouterr().err


def test_key_settings_are_both_or_neither(keys):
    assert server_keys(None, None) is None and client_keys(None, None) is None
    with pytest.raises(KeyFileError, match="both"):
        server_keys(keys / "worker.key_secret", None)
    with pytest.raises(KeyFileError, match="no secret key"):
        load_keypair(keys / "worker.key")
    with pytest.raises(KeyFileError, match="missing.key"):
        ServerKeys.load(keys / "worker.key_secret", keys / "missing.key")


def test_plain_and_unknown_key_peers_are_refused_and_reach_nothing(keys, worker):
    ctx = zmq.Context()
    server = load_keypair(keys / "worker.key_secret")[0]
    plain = _dealer(ctx, worker.endpoint)
    intruder = _dealer(ctx, worker.endpoint, *load_keypair(keys / "intruder.key_secret"), server)
    wrong_server = _dealer(ctx, worker.endpoint, *load_keypair(keys / "router.key_secret"),
                           load_keypair(keys / "intruder.key_secret")[0])  # the right client, a fake server key
    try:
        for sock in (plain, intruder, wrong_server):
            sock.send_multipart(wire.encode(wire.Hello("router", "x")))
            sock.send_multipart(wire.encode(wire.Free([1, 2, 3])))
            sock.send_multipart([b"\x20", b"not msgpack"])
        time.sleep(1.5)
        assert [_answer(sock, 0) for sock in (plain, intruder, wrong_server)] == [None, None, None]
        assert worker.inbox.empty()
    finally:
        for sock in (plain, intruder, wrong_server):
            sock.close(0)
        ctx.term()


def test_authorised_router_peer_handshakes_and_its_messages_arrive(keys, worker):
    ctx = zmq.Context()
    peer = Peer(ctx, worker.endpoint, "target", ClientKeys.load(keys / "router.key_secret", keys / "worker.key"))
    try:
        deadline = time.monotonic() + 10
        while not peer.alive and time.monotonic() < deadline:
            peer.receive()
            peer.tick(time.monotonic())
            time.sleep(0.02)
        assert peer.alive and peer.ready == READY
        assert peer.send(wire.Free([7]))
        _, msg = worker.inbox.get(timeout=5)
        assert msg == wire.Free([7])
    finally:
        peer.close()
        ctx.term()


def test_a_plain_worker_still_serves_plain_routers():
    endpoint = WorkerEndpoint("tcp://127.0.0.1:0", lambda: READY, "target")
    endpoint.start()
    ctx = zmq.Context()
    sock = _dealer(ctx, endpoint.endpoint)
    try:
        sock.send_multipart(wire.encode(wire.Hello("router", "x")))
        assert _answer(sock, 5000) == READY
    finally:
        sock.close(0)
        ctx.term()
        endpoint.stop()


def test_authorised_stack_generates_like_ar(keys, default_models, chat_prompts, ar_reference, tmp_path):
    """Router, target and draft with CURVE on every data-plane socket: same greedy output as AR."""
    from ssd.cli.launcher import Stack, StackConfig
    from ssd.client import Client

    worker = ["--curve-secret-key-file", str(keys / "worker.key_secret"),
              "--curve-authorized-keys", str(keys / "router.key")]
    router = ["--curve-secret-key-file", str(keys / "router.key_secret"),
              "--curve-worker-key", str(keys / "worker.key")]
    cfg = StackConfig(mode="ssd", log_dir=tmp_path, max_batch=4, target_cpus="0", draft_cpus="1", threads=1,
                      extra={"target": worker, "draft": worker, "router": router})
    with Stack(cfg) as stack, Client(stack.grpc_address, timeout=300) as client:
        outs = [client.generate(p, max_tokens=32, ignore_eos=True, mode="ssd").token_ids for p in chat_prompts[:2]]
    assert outs == ar_reference[:2]


@pytest.mark.parametrize("role, flags", [
    ("target", ["--curve-secret-key-file", "{keys}/missing.key_secret", "--curve-authorized-keys", "{keys}/router.key",
                "--control-address", "127.0.0.1:0", "--data-address", "tcp://127.0.0.1:0"]),
    ("router", ["--curve-secret-key-file", "{keys}/router.key_secret", "--curve-worker-key", "{keys}/missing.key",
                "--http-address", "", "--grpc-address", "127.0.0.1:0"]),
])
def test_a_bad_key_file_stops_the_service_at_once_naming_it(keys, default_models, role, flags):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "ssd.cli", role, *(f.format(keys=keys) for f in flags)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "missing.key" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
