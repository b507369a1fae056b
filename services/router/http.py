"""The router's OpenAI-compatible HTTP API (aiohttp) over the shared `Frontend`; no torch here.

`POST /v1/completions` and `/v1/chat/completions` take OpenAI's fields plus `top_k`, `min_p`, `ignore_eos`,
`stop_token_ids` and `speculation: {mode, k}`; one prompt, `n` choices (of `best_of` candidates on completions,
`services/router/choices.py`), the prompt echoed and its logprobs (`echo`, `prompt_logprobs`: `openai_prompt.py`).
Every other field is refused with a 400 naming it unless given at the value that changes nothing
(`openai_params.py`). `max_tokens` defaults to the rest of the context (the router's
`--max-tokens-default` if set), `temperature` to 1.0. Responses add `ssd`: the request's speculation stats and its
precise finish reason (OpenAI's `finish_reason` is "length" for LENGTH, else "stop"). `stream` sends Server-Sent
Events: chunks (one choice each, interleaved as the choices' tokens arrive), each choice's last one with its
`finish_reason`, a usage chunk if `stream_options.include_usage`, then `data: [DONE]` (a choice that may be a tool
call is held until its first character shows it is text; a call goes out as tool_call deltas, `CallStream`); an
engine error mid-stream is a `data: {"error": ...}` event. A client that disconnects cancels its handler, which aborts the request in the
engine. `GET /v1/models` and `/v1/models/{id}`; vLLM's `POST /tokenize`, `/detokenize` and `GET /version`;
`/health` (503 until the workers are ready), `/metrics` (404 without a renderer). Errors, all mapped in one
middleware, have OpenAI's shape `{"error": {message, type, param, code}}`: 400 bad JSON or field (`param` names
it), 401 no valid API key (when keys are configured: `/v1/*`, `/tokenize`, `/detokenize`), 404 unknown model
(`code` model_not_found) or path, 405, 413 over 1 MiB, 503 not ready or failed in the engine.
`HttpServer.start()` serves from its own asyncio loop in a daemon thread and returns the bound port; `stop()`
gives running requests about two seconds.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.metadata
import json
import logging
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable

from aiohttp import web

from services.router import choices
from services.router.frontend import Final, Frontend
from services.router.openai_params import STR, get, parse, parse_tokenize
from services.router.openai_prompt import prompt_reply
from services.router.openai_replies import CallStream, Reply

log = logging.getLogger("ssd.router")

try:
    VERSION = importlib.metadata.version("ssd")
except importlib.metadata.PackageNotFoundError:   # run from a source tree that was never installed
    VERSION = "0+unknown"

MAX_BODY = 1 << 20
PROTECTED = ("/v1/", "/tokenize", "/detokenize")   # need an API key where keys are configured


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code


def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error",
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _param(message: str) -> str | None:
    """The field a validation message starts with ("top_p: ...", "messages[2]: ...", "temperature must ...")."""
    m = re.match(r"[A-Za-z_][\w.\[\]]*", message)
    return m.group(0) if m else None


@web.middleware
async def _errors(request: web.Request, handler):
    try:
        return await handler(request)
    except ApiError as e:
        return web.json_response(error_body(e.message, e.param, e.kind, e.code), status=e.status)
    except ValueError as e:  # Frontend.build / RoundCore.submit: "field: what is wrong"
        return web.json_response(error_body(str(e), _param(str(e))), status=400)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        message = {404: f"no such endpoint: {request.path}",
                   405: f"{request.method} is not allowed on {request.path}"}.get(e.status, e.text or e.reason)
        return web.json_response(error_body(message), status=e.status)
    except Exception:
        log.exception("HTTP %s %s failed", request.method, request.path)
        return web.json_response(error_body("internal server error", kind="server_error"), status=500)


def _event(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class HttpServer:
    def __init__(self, frontend: Frontend, model_name: str, metrics_render: Callable[[], tuple[bytes, str]] | None,
                 host: str = "127.0.0.1", port: int = 8000, api_keys=None, tls: tuple | None = None):
        """`api_keys` (services.router.auth.ApiKeys): /v1/* needs `Authorization: Bearer <key>` (401 otherwise;
        /health and /metrics stay open for probes and scrapers). `tls`: (certificate chain file, key file) to serve
        HTTPS."""
        self.frontend, self.core, self.model_name = frontend, frontend.core, model_name
        self.api_keys, self.tls = api_keys, tls
        self.metrics_render, self.host, self.port = metrics_render, host, port
        self.created = int(time.time())
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[_errors, self._auth])
        app.router.add_post("/v1/completions", functools.partial(self._generate, chat=False))
        app.router.add_post("/v1/chat/completions", functools.partial(self._generate, chat=True))
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model_id:.+}", self.model)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_get("/version", self.version)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if self.api_keys is not None and request.path.startswith(PROTECTED) and \
                not self.api_keys.valid(request.headers.get("Authorization")):
            raise ApiError(401, "a valid API key is needed: send the header `Authorization: Bearer <key>`",
                           kind="authentication_error")
        return await handler(request)

    # ---- lifecycle --------------------------------------------------------------------------------
    def start(self) -> int:
        sock = socket.create_server((self.host, self.port))
        loop = self._loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
        loop.run_until_complete(self._runner.setup())
        ssl_context = None
        if self.tls is not None:
            import ssl

            ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ssl_context.load_cert_chain(str(self.tls[0]), str(self.tls[1]))
        loop.run_until_complete(web.SockSite(self._runner, sock, ssl_context=ssl_context).start())
        self._thread = threading.Thread(target=loop.run_forever, name="router-http", daemon=True)
        self._thread.start()
        self.port = sock.getsockname()[1]
        return self.port

    def stop(self) -> None:
        if self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()
        self._thread = None

    # ---- endpoints --------------------------------------------------------------------------------
    def _ready(self) -> bool:
        target = self.core.pool.target
        return self.core.max_len > 0 and target is not None and target.ready is not None

    def _unknown_model(self, model: str) -> ApiError:
        return ApiError(404, f"the model {model!r} does not exist; this server serves {self.model_name!r}", "model",
                        code="model_not_found")

    async def _body(self, request: web.Request, ready: bool = True) -> dict:
        raw = await request.read()  # over client_max_size: HTTPRequestEntityTooLarge (413)
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise ApiError(400, f"the body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        model = get(body, "model", STR, self.model_name)
        if model != self.model_name:
            raise self._unknown_model(model)
        if not ready:
            return body
        if not self._ready():
            raise ApiError(503, "the router is waiting for its workers; retry shortly", kind="server_error")
        if self.frontend.draining:
            raise ApiError(503, "the router is draining (shutting down); retry on another", kind="server_error")
        return body

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        body = await self._body(request)
        p = parse(body, chat)
        pr = prompt_reply(body, chat, p.build["logprobs"], p.stream, self.frontend.tok)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        g = self.frontend.build(**p.build, request_id=rid, prompt_logprobs=pr.ask)
        if p.user is not None:
            log.debug("request %s from user %r", rid, p.user)
        reply = Reply(chat, rid, self.model_name, int(time.time()),
                      self.frontend.tok if g.params.logprobs is not None else None, tools=p.tools is not None)
        pr.start(p.build, g.prompt, reply.offsets, g.n)
        items = choices.astream(self.frontend, g)
        async with contextlib.aclosing(items):   # leaving early (or being cancelled) aborts the request
            index, item = await anext(items)     # submit's ValueError surfaces here, before any header is sent
            if isinstance(item, Final) and item.error is not None:
                raise ApiError(503, item.error, kind="server_error")
            if p.stream:
                return await self._sse(request, reply, g.n, (index, item), items, p.include_usage,
                                       functools.partial(pr.chunk, ids=g.prompt), pr.pending)
            texts, logprobs, finals = [[] for _ in range(g.n)], [[] for _ in range(g.n)], [None] * g.n
            prompt_rows = {}
            while True:
                if isinstance(item, Final) and item.error is not None:
                    raise ApiError(503, item.error, kind="server_error")
                texts[index].append(item.text)
                if isinstance(item, Final):
                    finals[index] = item
                    if all(f is not None for f in finals):
                        break
                else:
                    logprobs[index] += item.logprobs or ()
                    if item.prompt_logprobs is not None:
                        prompt_rows[index] = item.prompt_logprobs
                index, item = await anext(items)
            whole = reply.whole([("".join(t), f, lp) for t, f, lp in zip(texts, finals, logprobs)])
            return web.json_response(pr.whole(whole, g.prompt, prompt_rows))

    async def _sse(self, request: web.Request, reply: Reply, n: int, first, items, include_usage: bool,
                   prompt=lambda chunk, lps: chunk, pending=lambda index: False):
        """`prompt(chunk, lps)` adds what the prompt adds to a chunk (echo), `pending(index)` whether choice
        `index` still owes it (its next chunk goes out even if empty)."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        try:
            if reply.chat:
                for i in range(n):
                    await resp.write(_event(reply.chunk(role=True, index=i)))
            (index, item), finals = first, {}
            calls = [CallStream(reply, i) for i in range(n)] if reply.tools else None
            while True:
                if isinstance(item, Final) and item.error is not None:
                    await resp.write(_event(error_body(item.error, kind="server_error")))
                    break
                if isinstance(item, Final):
                    for chunk in (calls[index].final(item) if calls
                                  else [prompt(reply.chunk(item.text, item, index=index), None)]):
                        await resp.write(_event(chunk))
                    finals[index] = item
                    if len(finals) == n:
                        if include_usage:
                            await resp.write(_event(reply.usage_chunk([finals[i] for i in range(n)])))
                        break
                elif calls:
                    for chunk in calls[index].delta(item.text, item.logprobs or []):
                        await resp.write(_event(chunk))
                elif item.text or item.logprobs or pending(index):
                    await resp.write(_event(prompt(reply.chunk(item.text, logprobs=item.logprobs or (), index=index),
                                                   item.prompt_logprobs)))
                index, item = await anext(items)
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:  # the client left; closing `items` aborts the request
            log.info("client left during stream %s", reply.id)
        return resp

    def _card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "ssd",
                "root": self.model_name, "parent": None, "max_model_len": self.core.max_len}

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._card()]})

    async def model(self, request: web.Request) -> web.Response:
        if request.match_info["model_id"] != self.model_name:
            raise self._unknown_model(request.match_info["model_id"])
        return web.json_response(self._card())

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's /tokenize: {prompt} or {messages} -> {count, max_model_len, tokens, token_strs}."""
        t = parse_tokenize(await self._body(request, ready=False))
        ids = self.frontend.tokenize(text=t.text, messages=t.messages, add_special_tokens=t.add_special_tokens,
                                     add_generation_prompt=t.add_generation_prompt)
        strs = [self.frontend.tok.id_to_token(i) for i in ids] if t.return_token_strs else None
        return web.json_response({"count": len(ids), "max_model_len": self.core.max_len, "tokens": ids,
                                  "token_strs": strs})

    async def detokenize(self, request: web.Request) -> web.Response:
        """vLLM's /detokenize: {tokens} -> {prompt}."""
        body = await self._body(request, ready=False)
        for name, value in body.items():
            if name not in ("model", "tokens") and value is not None:
                raise ValueError(f"{name}: unknown field")
        if body.get("tokens") is None:
            raise ValueError("tokens: is required, as a list of token ids")
        return web.json_response({"prompt": self.frontend.detokenize(body["tokens"])})

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    async def health(self, request: web.Request) -> web.Response:
        if self._ready():
            return web.json_response({"status": "ok"})
        return web.json_response({"status": "unavailable", "reason": "waiting for the workers"}, status=503)

    async def metrics(self, request: web.Request) -> web.Response:
        if self.metrics_render is None:
            raise ApiError(404, "metrics are not enabled on this server")
        body, content_type = self.metrics_render()
        return web.Response(body=body, headers={"Content-Type": content_type})
