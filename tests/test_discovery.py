"""Discovery sources against real backends on 127.0.0.1: a `redis-server` the tests start and stop, and a small
HTTP server speaking the Kubernetes EndpointSlice list and watch calls."""

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from ssd.discovery import Change, DiscoveryError, KubernetesDiscovery, RedisRegistry, StaticDiscovery, Worker
from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[1]


def wait_for(predicate, timeout=3.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.02)


def collect(discovery, until, timeout=3.0):
    """Drain `changes()` until `until(changes so far)` holds."""
    seen = []

    def done():
        seen.extend(discovery.changes())
        return until(seen)

    wait_for(done, timeout)
    return seen


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def added(*workers):
    return [Change("added", w) for w in workers]


def removed(*workers):
    return [Change("removed", w) for w in workers]


def test_static_reports_every_worker_added_once():
    d = StaticDiscovery(targets=["tcp://127.0.0.1:5601"], drafts=["tcp://127.0.0.1:5701", "tcp://127.0.0.1:5702"])
    d.start()
    t, d1, d2 = Worker("target", "tcp://127.0.0.1:5601"), Worker("draft", "tcp://127.0.0.1:5701"), \
        Worker("draft", "tcp://127.0.0.1:5702")
    assert sorted(d.changes(), key=lambda c: c.worker) == added(d1, d2, t)
    assert d.changes() == [] and d.current() == {t, d1, d2}
    d.start()
    assert d.changes() == []


def test_worker_rejects_unknown_role():
    with pytest.raises(ValueError, match="role"):
        Worker("verifier", "tcp://127.0.0.1:1")


def test_importing_discovery_loads_no_torch():
    code = "import sys, ssd.discovery; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


# --- Redis -----------------------------------------------------------------------------------------------------


@pytest.fixture
def redis_server(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


def test_redis_registration_appears_and_close_removes_it(redis_server):
    registry = RedisRegistry(redis_server.url, namespace="t1", poll_interval=0.1)
    registry.start()
    try:
        assert registry.changes() == []
        worker = Worker("draft", "tcp://127.0.0.1:5701")
        registration = registry.register("draft", worker.address, ttl=5.0)
        assert collect(registry, lambda c: c, timeout=1.0) == added(worker)
        registration.close()
        assert collect(registry, lambda c: c, timeout=1.0) == removed(worker)
        assert registry.current() == set()
    finally:
        registry.stop()


def test_redis_registration_whose_heartbeat_stops_expires_after_its_ttl(redis_server):
    """A worker process killed outright never deletes its key: it goes when the TTL runs out."""
    code = ("import sys, time\nfrom ssd.discovery import RedisRegistry\n"
            "RedisRegistry(sys.argv[1], namespace='t2').register('target', 'tcp://127.0.0.1:5601', ttl=1.0)\n"
            "print('registered', flush=True)\ntime.sleep(60)\n")
    worker = subprocess.Popen([sys.executable, "-c", code, redis_server.url], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    registry = RedisRegistry(redis_server.url, namespace="t2", poll_interval=0.1)
    try:
        assert worker.stdout.readline().strip() == "registered"
        registry.start()
        assert registry.current() == {Worker("target", "tcp://127.0.0.1:5601")}
        time.sleep(1.2)  # the heartbeat keeps it alive past one TTL
        assert registry.changes() == added(Worker("target", "tcp://127.0.0.1:5601"))
        worker.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        assert collect(registry, lambda c: c, timeout=3.0) == removed(Worker("target", "tcp://127.0.0.1:5601"))
        assert 0.5 < time.monotonic() - killed < 2.5  # after the TTL (1 s from the last heartbeat), not at once
    finally:
        worker.kill()
        worker.wait()
        registry.stop()


def test_redis_unreachable_at_start_raises_naming_the_url():
    pytest.importorskip("redis", reason="the redis package is not installed (pip install redis)")
    port = free_port()
    registry = RedisRegistry(f"redis://:hunter2@127.0.0.1:{port}/0", timeout=0.5)
    with pytest.raises(DiscoveryError, match=re.escape(f"127.0.0.1:{port}")) as info:
        registry.start()
    assert "hunter2" not in str(info.value)
    with pytest.raises(DiscoveryError, match="cannot register"):
        registry.register("target", "tcp://127.0.0.1:5601")


def test_redis_restart_mid_run_keeps_workers_and_heartbeats_recreate_them(redis_server):
    import redis

    registry = RedisRegistry(redis_server.url, namespace="t3", poll_interval=0.1, timeout=0.3)
    registry.start()
    target = Worker("target", "tcp://127.0.0.1:5601")
    registration = registry.register("target", target.address, ttl=1.5)
    try:
        assert collect(registry, lambda c: c, timeout=1.0) == added(target)
        redis_server.stop()
        time.sleep(0.5)  # several polls fail meanwhile
        assert registry.changes() == [] and registry.current() == {target}
        redis_server.start()  # a new, empty server on the same port
        client = redis.Redis(port=redis_server.port, decode_responses=True)
        wait_for(lambda: client.exists(registry.key(target)), timeout=2.0)
        draft = Worker("draft", "tcp://127.0.0.1:5701")
        with registry.register("draft", draft.address, ttl=1.5):
            assert collect(registry, lambda c: c, timeout=1.0) == added(draft)
        assert collect(registry, lambda c: c, timeout=1.0) == removed(draft)
        time.sleep(0.3)
        assert registry.changes() == [] and registry.current() == {target}  # no remove/re-add flap of the target
        client.close()
    finally:
        registration.close()
        registry.stop()


# --- Kubernetes ------------------------------------------------------------------------------------------------

SLICES_PATH = re.compile(r"/apis/discovery\.k8s\.io/v1/namespaces/([^/]+)/endpointslices")


def service_of(endpoint_slice):
    return endpoint_slice["metadata"]["labels"]["kubernetes.io/service-name"]


class FakeApiServer:
    """EndpointSlices of one namespace, with a log of watch events; `drop_watches()` cuts open watch streams
    mid-chunk, `expire()` answers watches from older resourceVersions with 410 Gone."""

    def __init__(self, namespace="ssd"):
        self.namespace, self.rv, self.cond = namespace, 100, threading.Condition()
        self.objects, self.events, self.watch_rvs, self.lists = {}, [], [], 0
        self.gone_below, self.gone_as_event, self.generation, self.closed = 0, False, 0, False
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                url = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                match = SLICES_PATH.fullmatch(url.path)
                if not match or match[1] != fake.namespace:
                    return self.reply(404, {"kind": "Status", "code": 404})
                service = query.get("labelSelector", "").removeprefix("kubernetes.io/service-name=")
                if query.get("watch") == "true":
                    return fake.serve_watch(self, service, int(query["resourceVersion"]))
                with fake.cond:
                    fake.lists += 1
                    items = [o for o in fake.objects.values() if service_of(o) == service]
                    self.reply(200, {"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                                     "metadata": {"resourceVersion": str(fake.rv)}, "items": items})

            def reply(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def chunk(self, data: bytes):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.host = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def serve_watch(self, handler, service, since):
        with self.cond:
            self.watch_rvs.append(since)
            generation = self.generation
        gone = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410,
                "message": f"too old resource version: {since}"}
        if since < self.gone_below and not self.gone_as_event:
            return handler.reply(410, gone)
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        if since < self.gone_below:
            handler.chunk(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
            return handler.chunk(b"")
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.closed or self.generation != generation or self.events[-1:]
                                   and self.events[-1][0] > since, timeout=1.0)
                if self.closed or self.generation != generation:
                    handler.close_connection = True  # cut mid-stream: no terminating chunk
                    return
                batch = [(kind, obj) for rv, kind, obj in self.events if rv > since and service_of(obj) == service]
                since = self.events[-1][0] if self.events else since
            for kind, obj in batch:
                handler.chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

    def put(self, name, service, endpoints, record=True):
        """Create or replace a slice; `endpoints` is [(ip, ready)], ready None leaves the condition unset."""
        with self.cond:
            self.rv += 1
            kind = "MODIFIED" if name in self.objects else "ADDED"
            obj = {"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1", "addressType": "IPv4",
                   "metadata": {"name": name, "namespace": self.namespace, "resourceVersion": str(self.rv),
                                "labels": {"kubernetes.io/service-name": service}},
                   "endpoints": [{"addresses": [ip], "conditions": {} if ready is None else {"ready": ready}}
                                 for ip, ready in endpoints],
                   "ports": [{"name": "data", "port": 5601, "protocol": "TCP"}]}
            self.objects[name] = obj
            if record:
                self.events.append((self.rv, kind, obj))
            self.cond.notify_all()
            return self.rv

    def delete(self, name):
        with self.cond:
            self.rv += 1
            obj = json.loads(json.dumps(self.objects.pop(name)))
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self.events.append((self.rv, "DELETED", obj))
            self.cond.notify_all()

    def drop_watches(self):
        with self.cond:
            self.generation += 1
            self.cond.notify_all()

    def close(self):
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def k8s():
    kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes package is not installed")
    server = FakeApiServer()
    config = kubernetes.client.Configuration()
    config.host = server.host
    api_client = kubernetes.client.ApiClient(config)
    server.put("target-abc", "ssd-target", [("10.0.0.1", True), ("10.0.0.2", False)])
    server.put("draft-xyz", "ssd-draft", [("10.0.1.1", None)])
    discovery = KubernetesDiscovery("ssd", "ssd-target", "ssd-draft", data_port=5601, api_client=api_client,
                                    retry_delay=0.05)
    discovery.start()
    yield server, discovery
    discovery.stop()
    server.close()
    api_client.close()


def tcp(role, ip):
    return Worker(role, f"tcp://{ip}:5601")


def test_k8s_initial_list_reports_ready_endpoints(k8s):
    _, discovery = k8s
    assert sorted(discovery.changes(), key=lambda c: c.worker) == added(tcp("draft", "10.0.1.1"),
                                                                        tcp("target", "10.0.0.1"))


def test_k8s_watch_events_add_and_remove_workers(k8s):
    server, discovery = k8s
    discovery.changes()
    server.put("target-abc", "ssd-target", [("10.0.0.1", True), ("10.0.0.2", True)])
    assert collect(discovery, lambda c: c) == added(tcp("target", "10.0.0.2"))
    server.put("target-abc", "ssd-target", [("10.0.0.1", False), ("10.0.0.2", True)])
    assert collect(discovery, lambda c: c) == removed(tcp("target", "10.0.0.1"))
    server.delete("draft-xyz")
    assert collect(discovery, lambda c: c) == removed(tcp("draft", "10.0.1.1"))
    assert discovery.current() == {tcp("target", "10.0.0.2")}


def test_k8s_watch_closed_mid_stream_resumes_from_last_resource_version(k8s):
    server, discovery = k8s
    discovery.changes()
    last = server.put("draft-xyz", "ssd-draft", [("10.0.1.1", True), ("10.0.1.2", True)])
    assert collect(discovery, lambda c: c) == added(tcp("draft", "10.0.1.2"))
    watches = len(server.watch_rvs)
    server.drop_watches()
    wait_for(lambda: len(server.watch_rvs) >= watches + 2)  # both services' watches reconnected
    assert last in server.watch_rvs[watches:]
    assert server.lists == 2  # resumed, not relisted
    server.put("draft-xyz", "ssd-draft", [("10.0.1.2", True)])
    assert collect(discovery, lambda c: c) == removed(tcp("draft", "10.0.1.1"))


@pytest.mark.parametrize("as_event", [False, True], ids=["http-410", "error-event-410"])
def test_k8s_gone_watch_relists(k8s, as_event):
    server, discovery = k8s
    discovery.changes()
    server.put("target-abc", "ssd-target", [("10.0.0.3", True)], record=False)  # compacted away: only a list sees it
    server.gone_below, server.gone_as_event = server.rv + 1, as_event
    server.drop_watches()
    changes = collect(discovery, lambda c: len(c) >= 2)
    gone, new = tcp("target", "10.0.0.1"), tcp("target", "10.0.0.3")
    assert sorted(changes, key=lambda c: c.kind) == added(new) + removed(gone)
    assert server.lists >= 3
    wait_for(lambda: server.rv in server.watch_rvs)  # watching again, from the relist's resourceVersion
