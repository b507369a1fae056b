"""Python SDK for the router's gRPC `ssd.v1.Generation` API: a blocking `Client` and an asyncio `AsyncClient`.

Contract (one surface; AsyncClient's methods are awaited and its stream is `async for`):
- `generate(prompt, **options) -> Result`; `stream(prompt, **options)` yields a `Delta` per committed piece,
  then exactly one `Result`. Also `abort(request_id) -> bool`, `model_info()`, `server_info()`, `close()`,
  `with` / `async with`. Options are the GenerateRequest fields (see `build_request`) plus `timeout`: the
  call's gRPC deadline in seconds (default: the client's), spanning all of its retries.
- UNAVAILABLE is retried (exponential backoff with jitter) without ever duplicating output: the unary RPCs
  are retried as they are; a Generate stream is retried as a *resumption* (`resume_from` = the tokens already
  received, with the request_id the SDK gave the request), so a router that dies mid-stream costs nothing:
  the next router (another address given, or another pod behind the same Service) continues the journaled
  request and the concatenated stream equals an uninterrupted one. Routers without request state refuse a
  resumption after the first token; the SDK then raises UnavailableError saying so. Anything else raises at
  once. `max_retries` bounds consecutive failures (a retry that made progress resets it); `max_resumes`
  bounds how often one stream is resumed after it had output.
- `address` may list several routers ("host1:port,host2:port" or a list): a failure moves to the next one.
- Every failure is an `SSDError` subclass, mapped from grpc.RpcError in `to_error` alone; a malformed request
  is refused before sending with `InvalidRequestError` naming the field, as the router would.
- `api_key` is sent as metadata `authorization: Bearer <key>`; `root_certificates` (or `tls=True`) means TLS.
- Imports only grpc and the generated stubs, never torch.

    with Client("127.0.0.1:50051", api_key="...") as c:
        for item in c.stream("Why is the sky blue?", chat=True, max_tokens=64):
            if isinstance(item, Delta):
                print(item.text, end="", flush=True)
        result = c.generate("def fib(n):", max_tokens=32, stop=["\\n\\n"], timeout=30)
        print(result.text, result.finish_reason, result.stats.tokens_per_round)
"""
from __future__ import annotations

import asyncio
import itertools
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator, Iterator

import grpc

from ssd.pb import generation_pb2 as pb
from ssd.pb import generation_pb2_grpc as pb_grpc

FINISH_NAMES = {v.number: v.name.removeprefix("FINISH_REASON_").lower()
                for v in pb.DESCRIPTOR.enum_types_by_name["FinishReason"].values}


class SSDError(Exception):
    """A failed call: `code` is the gRPC status name ("UNAVAILABLE", ...), `details` the server's message."""

    def __init__(self, code: str, details: str):
        super().__init__(f"{code}: {details}")
        self.code, self.details = code, details


class InvalidRequestError(SSDError):
    """INVALID_ARGUMENT: the request is malformed; `details` names the field."""


class UnavailableError(SSDError):
    """UNAVAILABLE: the router is starting or unreachable, or lost a worker mid-request."""


class DeadlineExceededError(SSDError):
    """DEADLINE_EXCEEDED: the call's timeout passed."""


class AuthenticationError(SSDError):
    """UNAUTHENTICATED: the API key is missing or unknown."""


class ResourceExhaustedError(SSDError):
    """RESOURCE_EXHAUSTED: the router is full or a limit was reached."""


_ERRORS = {grpc.StatusCode.INVALID_ARGUMENT: InvalidRequestError, grpc.StatusCode.UNAVAILABLE: UnavailableError,
           grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
           grpc.StatusCode.UNAUTHENTICATED: AuthenticationError,
           grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError}


def to_error(e: grpc.RpcError) -> SSDError:
    """The one place a gRPC failure becomes a typed SSDError."""
    code = e.code() if callable(getattr(e, "code", None)) else grpc.StatusCode.UNKNOWN
    details = e.details() if callable(getattr(e, "details", None)) else str(e)
    return _ERRORS.get(code, SSDError)(code.name, details or "")


@dataclass(slots=True)
class Delta:
    """Tokens committed since the previous delta, and the text they add."""
    token_ids: list[int]
    text: str


@dataclass(slots=True)
class Result:
    """A finished completion. finish_reason: stop, length, eos, abort, error, stop_string or time_limit."""
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    stats: pb.SpeculationStats = field(default_factory=pb.SpeculationStats)
    time_to_first_token_s: float = 0.0
    total_time_s: float = 0.0
    deltas: list[Delta] = field(default_factory=list)
    request_id: str = ""

    @property
    def usage(self) -> pb.Usage:
        return pb.Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens)

    def add(self, resp: pb.GenerateResponse) -> Delta | None:
        """Folds one streamed response in; returns its Delta when it carries output."""
        self.request_id = resp.request_id or self.request_id
        if resp.finish_reason:
            self.finish_reason = FINISH_NAMES.get(resp.finish_reason, str(resp.finish_reason))
            self.prompt_tokens, self.completion_tokens = resp.usage.prompt_tokens, resp.usage.completion_tokens
            self.stats = resp.stats
            self.time_to_first_token_s, self.total_time_s = resp.time_to_first_token_s, resp.total_time_s
        if not (resp.token_ids or resp.text):
            return None
        delta = Delta(list(resp.token_ids), resp.text)
        self.deltas.append(delta)
        self.token_ids += delta.token_ids
        self.text += delta.text
        return delta

    def finished(self) -> Result:
        if not self.finish_reason:
            raise SSDError("INTERNAL", "the stream ended without its final response")
        return self


def _fill(msg, prefix: str, **values):
    """Sets fields on a protobuf message; a value protobuf refuses becomes an InvalidRequestError naming it."""
    for name, value in values.items():
        if value is None:
            continue
        try:
            if isinstance(value, list):
                getattr(msg, name).extend(value)
            else:
                setattr(msg, name, value)
        except (TypeError, ValueError) as e:
            raise InvalidRequestError("INVALID_ARGUMENT", f"{prefix}{name}: {e}") from None
    return msg


def _add_messages(req: pb.GenerateRequest, messages: list) -> None:
    req.chat.SetInParent()
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise InvalidRequestError("INVALID_ARGUMENT", f"messages[{i}]: needs string 'role' and 'content'")
        req.chat.messages.add(role=m["role"], content=m["content"])


def build_request(prompt: str | list[int] | list[dict] | None = None, *, chat: bool = False,
                  messages: list[dict] | None = None, max_tokens: int = 0, temperature: float = 0.0,
                  top_k: int = 0, top_p: float = 0.0, min_p: float = 0.0, seed: int | None = None,
                  ignore_eos: bool = False, stop_token_ids=(), stop: str | list[str] = (), request_id: str = "",
                  mode: str = "", k: int = 0, speculation_off: bool = False) -> pb.GenerateRequest:
    """The GenerateRequest for a prompt and options. The prompt is raw text (one user chat message when
    chat=True), token ids, or chat messages ({"role", "content"} dicts), which `messages=` may give instead."""
    req = _fill(pb.GenerateRequest(), "", max_tokens=max_tokens, ignore_eos=ignore_eos, request_id=request_id,
                stop_token_ids=list(stop_token_ids), stop=[stop] if isinstance(stop, str) else list(stop))
    _fill(req.sampling, "sampling.", temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    _fill(req.speculation, "speculation.", mode=mode, k=k, off=speculation_off)
    if messages is not None and prompt is not None:
        raise InvalidRequestError("INVALID_ARGUMENT", "prompt: give a prompt or messages, not both")
    if messages is not None:
        _add_messages(req, list(messages))
    elif isinstance(prompt, str):
        if chat:
            req.chat.messages.add(role="user", content=prompt)
        else:
            req.text = prompt
    elif isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
        _add_messages(req, list(prompt))
    elif isinstance(prompt, (list, tuple)):
        req.token_ids.SetInParent()
        _fill(req.token_ids, "prompt.token_ids.", ids=list(prompt))
    else:
        raise InvalidRequestError("INVALID_ARGUMENT", "prompt: expected text, token ids or chat messages, "
                                                      f"got {type(prompt).__name__}")
    return req


class _Base:
    """Configuration, channels and retry policy shared by Client and AsyncClient."""
    _grpc = grpc

    def __init__(self, address: str | list[str] = "127.0.0.1:50051", timeout: float | None = None, *,
                 api_key: str | None = None, root_certificates: bytes | None = None, tls: bool = False,
                 max_retries: int = 3, max_resumes: int = 8, backoff_base: float = 0.1, backoff_cap: float = 2.0,
                 channel_options: tuple = ()):
        addresses = [a.strip() for a in (address.split(",") if isinstance(address, str) else address) if a.strip()]
        if not addresses:
            raise ValueError("address: give at least one router address (host:port)")
        self.addresses, self.timeout = addresses, timeout
        self.address = addresses[0]
        self.max_retries, self.max_resumes = max_retries, max_resumes
        self.backoff_base, self.backoff_cap = backoff_base, backoff_cap
        self._metadata = (("authorization", f"Bearer {api_key}"),) if api_key else None
        options = list(channel_options)
        self._channels = []
        for a in addresses:
            if tls or root_certificates is not None:
                creds = grpc.ssl_channel_credentials(root_certificates=root_certificates)
                self._channels.append(self._grpc.secure_channel(a, creds, options))
            else:
                self._channels.append(self._grpc.insecure_channel(a, options))
        self._stubs = [pb_grpc.GenerationStub(c) for c in self._channels]
        self._current = 0

    @property
    def _stub(self) -> pb_grpc.GenerationStub:
        return self._stubs[self._current]

    def _failover(self) -> None:
        """The next router address (round robin) after an UNAVAILABLE."""
        self._current = (self._current + 1) % len(self._stubs)
        self.address = self.addresses[self._current]

    def _deadline(self, timeout: float | None) -> float | None:
        timeout = self.timeout if timeout is None else timeout
        return None if timeout is None else time.monotonic() + timeout

    @staticmethod
    def _remaining(deadline: float | None) -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def _backoff(self, e: grpc.RpcError, attempt: int, deadline: float | None) -> float:
        """Seconds to wait before retrying after `e`; raises it as an SSDError when a retry is not safe or due."""
        err = to_error(e)
        if isinstance(err, UnavailableError) and attempt < self.max_retries:
            ceiling = min(self.backoff_cap, self.backoff_base * 2 ** attempt)
            delay = ceiling / 2 + random.uniform(0, ceiling / 2)
            if deadline is None or time.monotonic() + delay < deadline:
                self._failover()
                return delay
        raise err from e

    @staticmethod
    def _prepare(request: pb.GenerateRequest) -> pb.GenerateRequest:
        """The request with an id of the SDK's choosing when it has none (a resumption names its stream)."""
        if not request.request_id:
            request.request_id = uuid.uuid4().hex
        return request

    def _resume_error(self, e: grpc.RpcError, broken: SSDError | None, result: Result):
        """After a failed resumption: the error to raise, or None to go on retrying."""
        err = to_error(e)
        if broken is not None and err.code in ("FAILED_PRECONDITION", "NOT_FOUND"):
            return UnavailableError("UNAVAILABLE", f"{broken.details}; the stream broke after "
                                                   f"{len(result.token_ids)} tokens and cannot be resumed: "
                                                   f"{err.details}")
        return None


@dataclass(slots=True)
class _Resumption:
    """Retry bookkeeping of one stream: consecutive failures, resumptions, and the failure that broke it."""
    client: _Base
    request: pb.GenerateRequest
    result: Result
    deadline: float | None
    broken: SSDError | None = None
    attempt: int = 0
    resumes: int = 0

    def after(self, e: grpc.RpcError, progressed: bool) -> float:
        """Seconds to wait before resuming after `e` (the request now asks to resume), or raises."""
        c = self.client
        if (err := c._resume_error(e, self.broken, self.result)) is not None:
            raise err from e
        if progressed:
            self.attempt, self.resumes = 0, self.resumes + 1
        delay = c._backoff(e, self.attempt if self.resumes <= c.max_resumes else c.max_retries, self.deadline)
        self.attempt += 1
        self.broken = to_error(e)
        self.request.resume_from = len(self.result.token_ids)
        return delay


class Client(_Base):
    """Blocking client; one channel, safe to share between threads."""

    def _unary(self, method, request, timeout: float | None):
        deadline = self._deadline(timeout)
        for attempt in itertools.count():
            try:
                return method(self._stub)(request, timeout=self._remaining(deadline), metadata=self._metadata)
            except grpc.RpcError as e:
                delay = self._backoff(e, attempt, deadline)
            time.sleep(delay)

    def stream(self, prompt=None, *, timeout: float | None = None, **options) -> Iterator[Delta | Result]:
        """Yields a Delta per streamed piece, then the final Result. A bad request raises here, before sending."""
        return self._stream(build_request(prompt, **options), timeout)

    def _stream(self, request: pb.GenerateRequest, timeout: float | None) -> Iterator[Delta | Result]:
        deadline, request = self._deadline(timeout), self._prepare(request)
        result = Result()
        retry = _Resumption(self, request, result, deadline)
        while True:
            progressed = False
            call = self._stub.Generate(request, timeout=self._remaining(deadline), metadata=self._metadata)
            try:
                for resp in call:
                    progressed = True
                    if (delta := result.add(resp)) is not None:
                        yield delta
                break
            except grpc.RpcError as e:
                delay = retry.after(e, progressed)
            finally:
                call.cancel()
            time.sleep(delay)
        yield result.finished()

    def generate(self, prompt=None, **options) -> Result:
        item = None
        for item in self.stream(prompt, **options):
            pass
        return item

    def abort(self, request_id: str, *, timeout: float | None = None) -> bool:
        """True when the request was still running (or queued) and is now aborted."""
        return self._unary(lambda stub: stub.Abort, pb.AbortRequest(request_id=request_id), timeout).found

    def model_info(self, *, timeout: float | None = None) -> pb.ModelInfo:
        return self._unary(lambda stub: stub.GetModelInfo, pb.ModelInfoRequest(), timeout)

    def server_info(self, *, timeout: float | None = None) -> pb.ServerInfo:
        return self._unary(lambda stub: stub.GetServerInfo, pb.ServerInfoRequest(), timeout)

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient(_Base):
    """asyncio client over grpc.aio; create and use it inside one running event loop."""
    _grpc = grpc.aio

    async def _unary(self, method, request, timeout: float | None):
        deadline = self._deadline(timeout)
        for attempt in itertools.count():
            try:
                return await method(self._stub)(request, timeout=self._remaining(deadline), metadata=self._metadata)
            except grpc.RpcError as e:
                delay = self._backoff(e, attempt, deadline)
            await asyncio.sleep(delay)

    def stream(self, prompt=None, *, timeout: float | None = None, **options) -> AsyncIterator[Delta | Result]:
        """`async for` yields a Delta per streamed piece, then the final Result."""
        return self._stream(build_request(prompt, **options), timeout)

    async def _stream(self, request: pb.GenerateRequest, timeout: float | None) -> AsyncIterator[Delta | Result]:
        deadline, request = self._deadline(timeout), self._prepare(request)
        result = Result()
        retry = _Resumption(self, request, result, deadline)
        while True:
            progressed = False
            call = self._stub.Generate(request, timeout=self._remaining(deadline), metadata=self._metadata)
            try:
                async for resp in call:
                    progressed = True
                    if (delta := result.add(resp)) is not None:
                        yield delta
                break
            except grpc.RpcError as e:
                delay = retry.after(e, progressed)
            finally:
                call.cancel()
            await asyncio.sleep(delay)
        yield result.finished()

    async def generate(self, prompt=None, **options) -> Result:
        item = None
        async for item in self.stream(prompt, **options):
            pass
        return item

    async def abort(self, request_id: str, *, timeout: float | None = None) -> bool:
        return (await self._unary(lambda stub: stub.Abort, pb.AbortRequest(request_id=request_id), timeout)).found

    async def model_info(self, *, timeout: float | None = None) -> pb.ModelInfo:
        return await self._unary(lambda stub: stub.GetModelInfo, pb.ModelInfoRequest(), timeout)

    async def server_info(self, *, timeout: float | None = None) -> pb.ServerInfo:
        return await self._unary(lambda stub: stub.GetServerInfo, pb.ServerInfoRequest(), timeout)

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
