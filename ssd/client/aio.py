"""`AsyncClient`: the asyncio SDK client over grpc.aio, with the same methods as `Client`, awaited (its stream
is `async for`)."""
from __future__ import annotations

import asyncio
import itertools
from typing import AsyncIterator

import grpc

from ssd.client.base import ClientBase, Resumption
from ssd.client.request import build_request
from ssd.client.results import Delta, Result, Results
from ssd.pb import generation_pb2 as pb


class AsyncClient(ClientBase):
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
        """`async for` yields a Delta per streamed piece, then the final Result (with n > 1: Deltas of every choice,
        each with its `index`, then one Result per choice in index order)."""
        return self._stream(build_request(prompt, **options), timeout)

    async def _stream(self, request: pb.GenerateRequest, timeout: float | None) -> AsyncIterator[Delta | Result]:
        deadline, request = self._deadline(timeout), self._prepare(request)
        result = Results(max(1, request.n))
        retry = Resumption(self, request, result, deadline)
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
        for r in result.finished():
            yield r

    async def generate(self, prompt=None, **options) -> Result | list[Result]:
        """The finished Result; with `n` given, the list of its n Results (index order)."""
        results = [item async for item in self.stream(prompt, **options) if isinstance(item, Result)]
        return results if options.get("n") is not None else results[0]

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
