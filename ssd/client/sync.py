"""`Client`: the blocking SDK client (one channel per router address, safe to share between threads)."""
from __future__ import annotations

import itertools
import time
from typing import Iterator

import grpc

from ssd.client.base import ClientBase, Resumption
from ssd.client.request import build_request
from ssd.client.results import Delta, Result, Results
from ssd.pb import generation_pb2 as pb


class Client(ClientBase):
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
        """Yields a Delta per streamed piece, then the final Result (with n > 1: Deltas of every choice, each with
        its `index`, then one Result per choice in index order). A bad request raises here, before sending."""
        return self._stream(build_request(prompt, **options), timeout)

    def _stream(self, request: pb.GenerateRequest, timeout: float | None) -> Iterator[Delta | Result]:
        deadline, request = self._deadline(timeout), self._prepare(request)
        result = Results(max(1, request.n))
        retry = Resumption(self, request, result, deadline)
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
        yield from result.finished()

    def generate(self, prompt=None, **options) -> Result | list[Result]:
        """The finished Result; with `n` given, the list of its n Results (index order)."""
        results = [item for item in self.stream(prompt, **options) if isinstance(item, Result)]
        return results if options.get("n") is not None else results[0]

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
