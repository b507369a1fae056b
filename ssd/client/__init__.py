"""Python SDK for the router's gRPC `ssd.v1.Generation` API: a blocking `Client` and an asyncio `AsyncClient`.

Contract (one surface; AsyncClient's methods are awaited and its stream is `async for`):
- `generate(prompt, **options) -> Result`; `stream(prompt, **options)` yields a `Delta` per committed piece,
  then exactly one `Result`. Also `abort(request_id) -> bool`, `model_info()`, `server_info()`, `close()`,
  `with` / `async with`. Options are the GenerateRequest fields (see `build_request`) plus `timeout`: the
  call's gRPC deadline in seconds (default: the client's), spanning all of its retries.
- Several choices: `n=` (and `best_of=`) makes `generate` return a list of n Results (index order) and `stream`
  yield every choice's Deltas interleaved, each with its `index`, then one Result per choice. Such a stream is
  retried only before its first response (it cannot be resumed).
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
- Imports only grpc and the generated stubs, never torch (tests/test_client.py checks).

Modules: `errors` (SSDError and its subclasses, `to_error`), `results` (`Delta`, `Result`), `request`
(`build_request`: options -> GenerateRequest), `base` (channels, failover and the retry policy both clients
share), `sync` (`Client`), `aio` (`AsyncClient`).

    with Client("127.0.0.1:50051", api_key="...") as c:
        for item in c.stream("Why is the sky blue?", chat=True, max_tokens=64):
            if isinstance(item, Delta):
                print(item.text, end="", flush=True)
        result = c.generate("def fib(n):", max_tokens=32, stop=["\\n\\n"], timeout=30)
        print(result.text, result.finish_reason, result.stats.tokens_per_round)
"""
from ssd.client.aio import AsyncClient
from ssd.client.errors import (AuthenticationError, DeadlineExceededError, InvalidRequestError,
                               ResourceExhaustedError, SSDError, UnavailableError, to_error)
from ssd.client.request import build_request
from ssd.client.results import FINISH_NAMES, Delta, Result
from ssd.client.sync import Client

__all__ = ["AsyncClient", "AuthenticationError", "Client", "DeadlineExceededError", "Delta", "FINISH_NAMES",
           "InvalidRequestError", "ResourceExhaustedError", "Result", "SSDError", "UnavailableError",
           "build_request", "to_error"]
