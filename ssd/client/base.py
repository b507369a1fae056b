"""What `Client` and `AsyncClient` share: their configuration, one channel and stub per router address with
failover between them (`ClientBase`), the retry policy (exponential backoff with jitter, within the call's
deadline), and a stream's resumption bookkeeping (`Resumption`)."""
from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass

import grpc

from ssd.client.errors import SSDError, UnavailableError, to_error
from ssd.client.results import Results
from ssd.pb import generation_pb2 as pb
from ssd.pb import generation_pb2_grpc as pb_grpc


class ClientBase:
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

    def _resume_error(self, e: grpc.RpcError, broken: SSDError | None, result: Results):
        """After a failed resumption: the error to raise, or None to go on retrying."""
        err = to_error(e)
        if broken is not None and err.code in ("FAILED_PRECONDITION", "NOT_FOUND"):
            return UnavailableError("UNAVAILABLE", f"{broken.details}; the stream broke after "
                                                   f"{len(result.token_ids)} tokens and cannot be resumed: "
                                                   f"{err.details}")
        return None


@dataclass(slots=True)
class Resumption:
    """Retry bookkeeping of one stream: consecutive failures, resumptions, and the failure that broke it. A stream
    of several choices (n or best_of > 1) is not resumable: it is retried only before its first response."""
    client: ClientBase
    request: pb.GenerateRequest
    result: Results
    deadline: float | None
    broken: SSDError | None = None
    attempt: int = 0
    resumes: int = 0

    def after(self, e: grpc.RpcError, progressed: bool) -> float:
        """Seconds to wait before resuming after `e` (the request now asks to resume), or raises."""
        c = self.client
        if self.request.n > 1 or self.request.best_of > 1:
            if progressed:
                err = to_error(e)
                raise UnavailableError(err.code, f"{err.details}; the stream of a request of several choices "
                                                 f"broke and cannot be resumed") from e
            delay = c._backoff(e, self.attempt, self.deadline)
            self.attempt += 1
            return delay
        if (err := c._resume_error(e, self.broken, self.result)) is not None:
            raise err from e
        if progressed:
            self.attempt, self.resumes = 0, self.resumes + 1
        delay = c._backoff(e, self.attempt if self.resumes <= c.max_resumes else c.max_retries, self.deadline)
        self.attempt += 1
        self.broken = to_error(e)
        self.request.resume_from = len(self.result.token_ids)
        return delay
