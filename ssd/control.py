"""The gRPC control plane of a worker process, and the client calls the router makes to it.

A worker (target or draft) runs one `ControlServer` beside its data plane. It serves `ssd.v1.Worker`
(Describe, Drain), the standard `grpc.health.v1.Health` service (NOT_SERVING while loading or draining, both
overall "" and for "ssd.v1.Worker") and server reflection. The servicer only converts: the worker supplies
its state through two callables, and exceptions they raise are mapped to statuses in one interceptor.

Imports no torch: the router uses `describe` and `wait_serving`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from concurrent import futures
from importlib import metadata
from typing import TypedDict, Union

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ssd.pb import worker_pb2, worker_pb2_grpc

log = logging.getLogger(__name__)

WORKER_SERVICE = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name  # "ssd.v1.Worker"
SERVICE_NAMES = (WORKER_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME)


class WorkerInfoDict(TypedDict, total=False):
    """`WorkerInfo` as a dict. `role` and `state` may be short names ("target", "serving"); `pid` and
    `version` default to this process's id and the ssd package version."""

    role: Union[str, int]
    model_id: str
    tokenizer_hash: str
    vocab_size: int
    max_len: int
    kv_capacity_tokens: int
    kv_capacity_bytes: int
    num_slots: int
    k: int
    fanout: list[int]
    data_address: str
    protocol_version: int
    state: Union[str, int]
    active_sequences: int
    pid: int
    version: str
    prefix_cache_queried_tokens: int
    prefix_cache_hit_tokens: int
    preemptions: int


def package_version() -> str:
    try:
        return metadata.version("ssd")
    except metadata.PackageNotFoundError:
        return "unknown"


def _enum(enum_type, prefix: str, value: Union[str, int]) -> int:
    """"target", "TARGET", "WORKER_ROLE_TARGET" or 1 -> 1; ValueError on an unknown name or number."""
    if isinstance(value, str):
        name = value.upper()
        return enum_type.Value(name if name.startswith(prefix) else prefix + name)
    enum_type.Name(int(value))
    return int(value)


def worker_info_pb(info: Union[WorkerInfoDict, Mapping, worker_pb2.WorkerInfo]) -> worker_pb2.WorkerInfo:
    """Build the `WorkerInfo` message from a dict (or a message), filling pid and version when unset."""
    if isinstance(info, worker_pb2.WorkerInfo):
        msg = worker_pb2.WorkerInfo()
        msg.CopyFrom(info)
    else:
        # A bad dict is a bug in the worker, not in the request: TypeError, so INTERNAL, never INVALID_ARGUMENT.
        fields = dict(info)
        unknown = sorted(set(fields) - set(worker_pb2.WorkerInfo.DESCRIPTOR.fields_by_name))
        if unknown:
            raise TypeError(f"unknown WorkerInfo fields {unknown}")
        try:
            if "role" in fields:
                fields["role"] = _enum(worker_pb2.WorkerRole, "WORKER_ROLE_", fields["role"])
            if "state" in fields:
                fields["state"] = _enum(worker_pb2.WorkerState, "WORKER_STATE_", fields["state"])
            msg = worker_pb2.WorkerInfo(**fields)
        except ValueError as exc:  # unknown enum name, negative count, ...
            raise TypeError(f"bad WorkerInfo: {exc}") from exc
    msg.pid = msg.pid or os.getpid()
    msg.version = msg.version or package_version()
    return msg


class _ErrorInterceptor(grpc.ServerInterceptor):
    """The one place where exceptions escaping an ssd.v1 handler become statuses with a message:
    ValueError -> INVALID_ARGUMENT, anything else -> INTERNAL (logged with its traceback)."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith("/ssd.v1."):
            return handler
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap(handler.unary_unary), handler.request_deserializer, handler.response_serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(handler.unary_stream), handler.request_deserializer,
                handler.response_serializer)
        return handler  # client-streaming methods: none in ssd.v1 yet

    @staticmethod
    def _abort(context, method: str, exc: Exception):
        if context.code() not in (None, grpc.StatusCode.OK):
            raise exc  # the handler already aborted with its own status
        if isinstance(exc, ValueError):  # abort() raises, ending the call
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc) or type(exc).__name__)
        log.exception("%s failed", method)
        context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")

    def _wrap(self, behavior):
        def unary_unary(request, context):
            try:
                return behavior(request, context)
            except Exception as exc:  # noqa: BLE001 - mapped to a status, never swallowed
                self._abort(context, behavior.__name__, exc)

        return unary_unary

    def _wrap_stream(self, behavior):
        def unary_stream(request, context):
            try:
                yield from behavior(request, context)
            except Exception as exc:  # noqa: BLE001
                self._abort(context, behavior.__name__, exc)

        return unary_stream


class _WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, info: Callable[[], object], on_drain: Callable[[int], int],
                 set_serving: Callable[[bool], None]):
        self._info, self._on_drain, self._set_serving = info, on_drain, set_serving

    def Describe(self, request, context):
        return worker_info_pb(self._info())

    def Drain(self, request, context):
        active = self._on_drain(request.grace_seconds)
        self._set_serving(False)
        return worker_pb2.DrainResponse(active_sequences=active)


class ControlServer:
    """The control plane of one worker: `start()` binds `address` ("host:port"; port 0 picks a free one)
    and serves Worker, Health and reflection on a pool of 4 threads. Health is NOT_SERVING until
    `set_serving(True)`; `Drain` calls `on_drain(grace_seconds)` (returning the active sequences) and
    turns it NOT_SERVING again."""

    def __init__(self, address: str, info: Callable[[], Union[WorkerInfoDict, worker_pb2.WorkerInfo]] | None,
                 on_drain: Callable[[int], int] | None, extra: list[tuple[Callable, object, str]] = (),
                 max_workers: int = 4, interceptors: tuple[grpc.ServerInterceptor, ...] = (),
                 credentials: grpc.ServerCredentials | None = None):
        """`extra`: more services as (add_XServicer_to_server, servicer, full service name); the router
        serves Generation this way (with info=None: no Worker service). `interceptors` run before the error
        mapping (the router's API-key check); `credentials`: serve TLS instead of plaintext."""
        self.address, self._credentials = address, credentials
        self.port: int | None = None
        self._services = [name for *_, name in extra] + ([WORKER_SERVICE] if info is not None else [])
        self._health = health.HealthServicer()
        self.set_serving(False)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="ssd-grpc"),
            interceptors=[*interceptors, _ErrorInterceptor()],
            options=[("grpc.so_reuseport", 0)],  # a port already taken fails loudly instead of being shared
        )
        if info is not None:
            worker_pb2_grpc.add_WorkerServicer_to_server(_WorkerServicer(info, on_drain, self.set_serving),
                                                          self._server)
        for add, servicer, _ in extra:
            add(servicer, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection((*self._services, health.SERVICE_NAME, reflection.SERVICE_NAME),
                                            self._server)

    def start(self) -> int:
        """Bind and start serving; return the bound port."""
        port = (self._server.add_secure_port(self.address, self._credentials) if self._credentials is not None
                else self._server.add_insecure_port(self.address))
        if not port:  # older grpcio returns 0 instead of raising
            raise RuntimeError(f"control plane could not bind {self.address}")
        self._server.start()
        self.port = port
        log.info("control plane on %s (port %d)", self.address, port)
        return port

    def set_serving(self, serving: bool) -> None:
        """Report SERVING or NOT_SERVING, overall and for ssd.v1.Worker."""
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for service in ("", *self._services):
            self._health.set(service, status)

    def stop(self, grace: float | None = None) -> None:
        """Report NOT_SERVING, then stop; in-flight calls get `grace` seconds (None: cancelled at once)."""
        self._health.enter_graceful_shutdown()
        self._server.stop(grace).wait()

    def __enter__(self) -> ControlServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop(0)


_RECONNECT = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
              ("grpc.max_reconnect_backoff_ms", 500)]


def describe(address: str, timeout: float = 5.0) -> worker_pb2.WorkerInfo:
    """Call Worker.Describe on `address` ("host:port"); raises grpc.RpcError on failure."""
    with grpc.insecure_channel(address) as channel:
        return worker_pb2_grpc.WorkerStub(channel).Describe(worker_pb2.DescribeRequest(), timeout=timeout)


def wait_serving(address: str, timeout: float, service: str = "", poll: float = 0.1) -> bool:
    """Poll grpc.health.v1 on `address` until it reports SERVING (True) or `timeout` seconds pass (False).
    A worker that is not up yet, loading, or not yet serving the health service counts as not serving."""
    deadline = time.monotonic() + timeout
    request = health_pb2.HealthCheckRequest(service=service)
    with grpc.insecure_channel(address, options=_RECONNECT) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                reply = stub.Check(request, timeout=remaining, wait_for_ready=True)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    return False
            time.sleep(max(0.0, min(poll, deadline - time.monotonic())))
    return False
