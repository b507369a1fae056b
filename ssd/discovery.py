"""Where the router learns which workers exist: static addresses, a Redis registry, or Kubernetes EndpointSlices.

A `Discovery` reports `Worker(role, address)` values: role "target" or "draft", address the worker's ZeroMQ
data-plane endpoint (`tcp://host:port`). `start()` reads the source once and raises `DiscoveryError` (naming the
source) if it cannot; after that, background threads follow the source. `changes()` never blocks: it drains the
`Change`s collected since the last call, in order, so a worker is "added" once when it appears and "removed" once
when it goes. `current()` is the set as of the latest change. A source that becomes unreachable mid-run keeps the
last known set (with a logged warning) and is followed again once it answers. Whether a worker is compatible is
not judged here: the router checks that on the worker's Ready handshake.

Imports no torch; `redis` and `kubernetes` are imported only by the source that uses them.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger(__name__)

ROLES = ("target", "draft")


class DiscoveryError(RuntimeError):
    """The discovery source could not be read at start."""


@dataclass(frozen=True, order=True)
class Worker:
    role: str
    address: str

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"worker role must be one of {ROLES}, got {self.role!r}")


@dataclass(frozen=True)
class Change:
    kind: Literal["added", "removed"]
    worker: Worker


class Discovery:
    """The interface, and the bookkeeping every source shares: sources call `_replace` with what they see."""

    def __init__(self):
        self._lock = threading.Lock()
        self._current: set[Worker] = set()
        self._pending: list[Change] = []

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def changes(self) -> list[Change]:
        with self._lock:
            drained, self._pending = self._pending, []
        return drained

    def current(self) -> set[Worker]:
        with self._lock:
            return set(self._current)

    def _replace(self, role: str, workers: set[Worker]) -> None:
        """Make `workers` the whole known set for `role`, queueing a change for each difference."""
        with self._lock:
            old = {w for w in self._current if w.role == role}
            self._pending += [Change("removed", w) for w in sorted(old - workers)]
            self._pending += [Change("added", w) for w in sorted(workers - old)]
            self._current = (self._current - old) | workers

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()


class StaticDiscovery(Discovery):
    """Fixed addresses (the local default): all reported as added once, never removed."""

    def __init__(self, targets: list[str], drafts: list[str]):
        super().__init__()
        self._workers = {"target": {Worker("target", a) for a in targets},
                         "draft": {Worker("draft", a) for a in drafts}}

    def start(self) -> None:
        for role, workers in self._workers.items():
            self._replace(role, workers)


def _redact(url: str) -> str:
    return re.sub(r"//([^/@:]*):[^/@]*@", r"//\1:***@", url)


class RedisRegistry(Discovery):
    """Workers `register` a key `{namespace}:worker:{role}:{address}` that lives while their heartbeat refreshes it;
    the discovery side polls the keys (`SCAN`) every `poll_interval` seconds."""

    def __init__(self, url: str, namespace: str = "ssd", poll_interval: float = 0.5, timeout: float = 1.0):
        super().__init__()
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", namespace):
            raise ValueError(f"Redis namespace must match [A-Za-z0-9_.-]+, got {namespace!r}")
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.url, self.namespace, self.poll_interval = _redact(url), namespace, poll_interval
        self._redis = redis.Redis.from_url(url, decode_responses=True, socket_timeout=timeout,
                                           socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 1))
        self._error = redis.RedisError
        self._ttl: dict[Worker, float] = {}
        self._held_until: dict[Worker, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def key(self, worker: Worker) -> str:
        return f"{self.namespace}:worker:{worker.role}:{worker.address}"

    def register(self, role: str, address: str, ttl: float = 5.0) -> Registration:
        return Registration(self, Worker(role, address), ttl)

    def start(self) -> None:
        try:
            self._apply(self._scan())
        except self._error as e:
            raise DiscoveryError(f"cannot reach Redis at {self.url}: {e}") from e
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="ssd-discovery-redis", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _scan(self) -> dict[Worker, float]:
        """Registered workers, each with its TTL in seconds (the key's value)."""
        prefix = f"{self.namespace}:worker:"
        keys = list(self._redis.scan_iter(match=prefix + "*", count=1000))
        seen = {}
        for key, value in zip(keys, self._redis.mget(keys) if keys else []):
            role, _, address = key[len(prefix):].partition(":")
            if value is not None and role in ROLES and address:  # else: expired since the SCAN, or not ours
                seen[Worker(role, address)] = int(value) / 1000 if value.isdigit() else 0.0
        return seen

    def _run(self) -> None:
        down = False
        while not self._stop.wait(self.poll_interval):
            try:
                seen = self._scan()
            except self._error as e:
                if not down:
                    log.warning("Redis at %s unreachable (%s); keeping the last known %d workers",
                                self.url, e, len(self.current()))
                down = True
                continue
            if down:
                # A restarted Redis comes back empty, and live workers re-create their keys within one heartbeat:
                # keep each worker known before the outage for one TTL, so a restart does not remove and re-add it.
                log.info("Redis at %s is reachable again", self.url)
                down, now = False, time.monotonic()
                self._held_until = {w: now + self._ttl.get(w, 0.0) for w in self.current()}
            self._apply(seen)

    def _apply(self, seen: dict[Worker, float]) -> None:
        now = time.monotonic()
        self._held_until = {w: t for w, t in self._held_until.items() if w not in seen and now < t}
        workers = set(seen) | set(self._held_until)
        self._ttl = {w: self._ttl.get(w, 0.0) for w in self._held_until} | seen
        for role in ROLES:
            self._replace(role, {w for w in workers if w.role == role})


class Registration:
    """One worker's entry in a `RedisRegistry`: SET with a TTL now and every ttl/3 by a heartbeat thread (so it
    is re-created after a Redis restart), deleted by `close()`. A worker that dies stops refreshing it, and the
    key expires after `ttl` seconds."""

    def __init__(self, registry: RedisRegistry, worker: Worker, ttl: float):
        if ttl <= 0:
            raise ValueError(f"registration ttl must be positive, got {ttl}")
        self.worker, self.ttl = worker, ttl
        self._registry, self._key = registry, registry.key(worker)
        self._stop = threading.Event()
        try:
            self._beat()
        except registry._error as e:
            raise DiscoveryError(f"cannot register {worker.role} {worker.address} in Redis at {registry.url}: "
                                 f"{e}") from e
        self._thread = threading.Thread(target=self._run, name=f"ssd-heartbeat-{worker.role}", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        ttl_ms = max(1, int(self.ttl * 1000))
        self._registry._redis.set(self._key, str(ttl_ms), px=ttl_ms)

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(self.ttl / 3):
            try:
                self._beat()
            except self._registry._error as e:
                if not failing:
                    log.warning("heartbeat of %s to Redis at %s failed (%s); retrying every %.2fs",
                                self._key, self._registry.url, e, self.ttl / 3)
                failing = True
                continue
            if failing:
                log.info("re-registered %s in Redis at %s", self._key, self._registry.url)
                failing = False

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        try:
            self._registry._redis.delete(self._key)
        except self._registry._error as e:
            log.warning("could not delete %s (%s); it expires within %.1fs", self._key, e, self.ttl)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class KubernetesDiscovery(Discovery):
    """Ready endpoints of the EndpointSlices (discovery.k8s.io/v1) labelled `kubernetes.io/service-name=<service>`,
    each reported as `tcp://<ip>:<data_port>`. One thread per service lists, then watches from the list's
    resourceVersion; a dropped watch resumes from the last resourceVersion seen, and 410 Gone relists."""

    def __init__(self, namespace: str, target_service: str, draft_service: str, data_port: int, api_client=None,
                 watch_timeout: int = 300, retry_delay: float = 1.0, draft_port: int | None = None):
        super().__init__()
        for port in (data_port, draft_port or data_port):
            if not 0 < port < 65536:
                raise ValueError(f"data ports must be TCP ports, got {port}")
        self.namespace, self.data_port = namespace, data_port
        self.ports = {"target": data_port, "draft": draft_port or data_port}
        self.services = {"target": target_service, "draft": draft_service}
        self.watch_timeout, self.retry_delay = watch_timeout, retry_delay
        self._api_client = api_client
        self._slices: dict[str, dict[str, set[str]]] = {role: {} for role in ROLES}
        self._rv: dict[str, str | None] = {role: None for role in ROLES}
        self._responses: dict[str, object] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        from kubernetes import client, config

        if self._api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException as e:
                raise DiscoveryError(f"KubernetesDiscovery found no in-cluster configuration ({e}); run it in a pod "
                                     "with a service account, or pass api_client=") from e
            self._api_client = client.ApiClient()
        self._api = client.DiscoveryV1Api(self._api_client)
        self._stop.clear()
        for role, service in self.services.items():
            try:
                self._list(role)
            except Exception as e:
                raise DiscoveryError(f"cannot list EndpointSlices of service {service!r} in namespace "
                                     f"{self.namespace!r} at {self._api_client.configuration.host}: {e}") from e
        for role in ROLES:
            thread = threading.Thread(target=self._follow, args=(role,), name=f"ssd-discovery-k8s-{role}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for response in list(self._responses.values()):
            try:
                response.shutdown()  # unblocks a thread waiting in a watch read
            except Exception as e:
                log.debug("shutting down a watch response: %s", e)
        for thread in self._threads:
            thread.join()
        self._threads = []

    def _request(self, role: str, **kwargs):
        return self._api.list_namespaced_endpoint_slice(
            self.namespace, label_selector=f"kubernetes.io/service-name={self.services[role]}",
            _preload_content=False, **kwargs)

    def _list(self, role: str) -> None:
        body = json.loads(self._request(role, _request_timeout=30).data)
        self._slices[role] = {item["metadata"]["name"]: self._addresses(item, self.ports[role])
                              for item in body.get("items") or []}
        self._rv[role] = body["metadata"]["resourceVersion"]
        self._publish(role)

    def _watch(self, role: str) -> bool:
        """Follow one watch request until it ends; whether it carried any event."""
        from kubernetes.client.exceptions import ApiException
        from kubernetes.watch.watch import iter_resp_lines

        response = self._request(role, watch=True, resource_version=self._rv[role], allow_watch_bookmarks=True,
                                 timeout_seconds=self.watch_timeout, _request_timeout=(30, self.watch_timeout + 30))
        self._responses[role] = response
        try:
            if self._stop.is_set():
                return False  # stop() ran before this response was registered for it to shut down
            events = 0
            for line in iter_resp_lines(response):
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj, events = event["type"], event["object"], events + 1
                if kind == "ERROR":
                    raise ApiException(status=obj.get("code"), reason=f"{obj.get('reason')}: {obj.get('message')}")
                name = obj["metadata"].get("name")
                if kind in ("ADDED", "MODIFIED"):
                    self._slices[role][name] = self._addresses(obj, self.ports[role])
                elif kind == "DELETED":
                    self._slices[role].pop(name, None)
                self._rv[role] = obj["metadata"]["resourceVersion"]
                if kind != "BOOKMARK":
                    self._publish(role)
            return events > 0
        finally:
            self._responses.pop(role, None)
            response.release_conn()

    def _follow(self, role: str) -> None:
        from kubernetes.client.exceptions import ApiException

        while not self._stop.is_set():
            try:
                if self._rv[role] is None:
                    self._list(role)
                if not self._watch(role):  # the server ended the watch (its timeout): watch again from there,
                    self._stop.wait(self.retry_delay)  # but not in a tight loop if it ends them at once
                continue
            except ApiException as e:
                if e.status == 410:
                    log.info("watch of %s endpoints expired (410 Gone); relisting", self.services[role])
                    self._rv[role] = None
                    continue
                error = e
            except Exception as e:  # connection dropped, timeout, malformed event
                error = e
            if self._stop.is_set():
                break
            log.warning("watch of %s endpoints failed (%s); resuming from resourceVersion %s in %.1fs",
                        self.services[role], error, self._rv[role], self.retry_delay)
            self._stop.wait(self.retry_delay)

    def _addresses(self, endpoint_slice: dict, port: int) -> set[str]:
        addresses = set()
        for endpoint in endpoint_slice.get("endpoints") or []:
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue  # ready unset means unknown, which Kubernetes says to treat as ready
            for ip in endpoint.get("addresses") or []:
                host = f"[{ip}]" if ":" in ip else ip
                addresses.add(f"tcp://{host}:{port}")
        return addresses

    def _publish(self, role: str) -> None:
        self._replace(role, {Worker(role, a) for addresses in self._slices[role].values() for a in addresses})
