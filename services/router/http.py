"""The router's OpenAI-compatible HTTP API (aiohttp) over the shared `Frontend`; no torch here.

`POST /v1/completions` and `/v1/chat/completions` take OpenAI's fields plus `top_k`, `min_p`, `ignore_eos`,
`stop_token_ids` and `speculation: {mode, k}`; one prompt, one choice (`n` = 1); OpenAI's defaults (completions:
`max_tokens` 16; `temperature` 1.0). Responses add `ssd`: the request's speculation stats and its precise
finish reason (OpenAI's `finish_reason` is "length" for LENGTH, else "stop"). `stream` sends Server-Sent
Events: chunks, the last one with `finish_reason`, a usage chunk if `stream_options.include_usage`, then
`data: [DONE]`; an engine error mid-stream is a `data: {"error": ...}` event. A client that disconnects cancels
its handler, which aborts the request in the engine. `GET /v1/models`, `/health` (503 until the workers are
ready), `/metrics` (404 without a renderer). Errors, all mapped in one middleware, have OpenAI's shape
`{"error": {message, type, param, code}}`: 400 bad JSON or field (`param` names it), 401 no valid API key
(when keys are configured), 404 unknown model or path,
405, 413 over 1 MiB, 503 not ready or failed in the engine. `HttpServer.start()` serves from its own asyncio
loop in a daemon thread and returns the bound port; `stop()` gives running requests about two seconds.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from ssd.params import FinishReason
from services.router.frontend import Final, Frontend

log = logging.getLogger("ssd.router")

MAX_BODY = 1 << 20
COMPLETION_MAX_TOKENS_DEFAULT = 16   # OpenAI's default for /v1/completions
UNSUPPORTED = ("logprobs", "top_logprobs", "echo", "suffix", "best_of", "logit_bias", "presence_penalty",
               "frequency_penalty", "tools", "tool_choice", "functions", "response_format")


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def _param(message: str) -> str | None:
    """The field a validation message starts with ("top_p: ...", "messages[2]: ...", "temperature must ...")."""
    m = re.match(r"[A-Za-z_][\w.\[\]]*", message)
    return m.group(0) if m else None


@web.middleware
async def _errors(request: web.Request, handler):
    try:
        return await handler(request)
    except ApiError as e:
        return web.json_response(error_body(e.message, e.param, e.kind), status=e.status)
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


# ---- request fields -------------------------------------------------------------------------------
NUMBER, INT, BOOL, STR, LIST, OBJECT, STOP = (int, float), (int,), (bool,), (str,), (list,), (dict,), (str, list)
WHAT = {NUMBER: "a number", INT: "an integer", BOOL: "a boolean", STR: "a string", LIST: "a list",
        OBJECT: "an object", STOP: "a string or a list of strings"}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _get(obj: dict, key: str, types: tuple, default=None, param: str | None = None):
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ValueError(f"{param or key}: must be {WHAT[types]}, got {shown}")
    return value


@dataclass(slots=True)
class Parsed:
    build: dict           # Frontend.build keyword arguments
    stream: bool
    include_usage: bool


def parse(body: dict, chat: bool) -> Parsed:
    """An OpenAI request body -> Frontend.build arguments; raises ValueError("field: ...")."""
    for name in UNSUPPORTED:
        value = body.get(name)
        if value not in (None, False, 0, "", [], {}) and not (name == "best_of" and value == 1) \
                and not (name == "response_format" and value == {"type": "text"}):
            raise ValueError(f"{name}: not supported by this server")
    if _get(body, "n", INT, 1) != 1:
        raise ValueError("n: only n=1 is supported")
    if chat:
        prompt = {"messages": _messages(_get(body, "messages", LIST))}
        max_tokens = _get(body, "max_completion_tokens", INT)
        max_tokens = _get(body, "max_tokens", INT) if max_tokens is None else max_tokens
    else:
        prompt = _prompt(body.get("prompt"))
        max_tokens = _get(body, "max_tokens", INT, COMPLETION_MAX_TOKENS_DEFAULT)
    spec = _get(body, "speculation", OBJECT, {})
    top_k = _get(body, "top_k", INT, 0)
    opts = _get(body, "stream_options", OBJECT, {})
    build = dict(prompt, temperature=_get(body, "temperature", NUMBER, 1.0), top_k=0 if top_k == -1 else top_k,
                 top_p=_get(body, "top_p", NUMBER, 1.0), min_p=_get(body, "min_p", NUMBER, 0.0),
                 seed=_get(body, "seed", INT), max_tokens=max_tokens, stop=_get(body, "stop", STOP, ()),
                 stop_token_ids=_get(body, "stop_token_ids", LIST, ()),
                 ignore_eos=_get(body, "ignore_eos", BOOL, False),
                 mode=_get(spec, "mode", STR, "", "speculation.mode"), k=_get(spec, "k", INT, 0, "speculation.k"))
    return Parsed(build, _get(body, "stream", BOOL, False),
                  _get(opts, "include_usage", BOOL, False, "stream_options.include_usage"))


def _prompt(p) -> dict:
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one is one prompt
    if isinstance(p, str):
        return {"text": p}
    if isinstance(p, list) and all(_is_int(t) for t in p):
        return {"token_ids": p}
    if isinstance(p, list) and all(isinstance(x, (str, list)) for x in p):
        raise ValueError("prompt: batched prompts are not supported")
    raise ValueError("prompt: is required, as a string or a list of token ids")


def _messages(messages: list | None) -> list:
    """Text content parts are joined into one string; the rest is for Frontend.build to judge."""
    if messages is None:
        raise ValueError("messages: is required, as a list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}]: needs a string role and a content")
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ValueError(f"messages[{i}].content: only text parts are supported")
            content = "".join(p["text"] for p in content)
        out.append({"role": m["role"], "content": content})
    return out


# ---- responses ------------------------------------------------------------------------------------
def _finish(f: Final) -> str:
    return "length" if f.reason is FinishReason.LENGTH else "stop"


def _usage(f: Final) -> dict:
    return {"prompt_tokens": f.prompt_tokens, "completion_tokens": f.completion_tokens,
            "total_tokens": f.prompt_tokens + f.completion_tokens}


def _ssd(f: Final) -> dict:
    st = f.stats
    return {"finish_reason": f.reason.value, "mode": f.mode, "rounds": st.rounds,
            "tokens_per_round": round(st.tokens_per_round, 4),
            "acceptance_per_position": [round(a, 4) for a in st.acceptance_per_position],
            "cache_hits": st.cache.get("hit", 0), "cache_misses": sum(v for k, v in st.cache.items() if k != "hit"),
            "ttft_s": round(f.ttft_s, 6), "total_s": round(f.total_s, 6)}


@dataclass(slots=True)
class Reply:
    """The response objects of one request, whole or as stream chunks."""
    chat: bool
    id: str
    model: str
    created: int

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, text: str, f: Final) -> dict:
        choice = {"index": 0, "finish_reason": _finish(f), "logprobs": None}
        choice.update({"message": {"role": "assistant", "content": text}} if self.chat else {"text": text})
        return {**self._head(False), "choices": [choice], "usage": _usage(f), "ssd": _ssd(f)}

    def chunk(self, text: str = "", f: Final | None = None, role: bool = False) -> dict:
        choice = {"index": 0, "finish_reason": _finish(f) if f else None, "logprobs": None}
        if self.chat:
            choice["delta"] = {"role": "assistant", "content": ""} if role else {"content": text} if text else {}
        else:
            choice["text"] = text
        out = {**self._head(True), "choices": [choice]}
        return {**out, "ssd": _ssd(f)} if f else out

    def usage_chunk(self, f: Final) -> dict:
        return {**self._head(True), "choices": [], "usage": _usage(f)}


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
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if self.api_keys is not None and request.path.startswith("/v1/") and \
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

    async def _body(self, request: web.Request) -> dict:
        raw = await request.read()  # over client_max_size: HTTPRequestEntityTooLarge (413)
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise ApiError(400, f"the body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        model = _get(body, "model", STR, self.model_name)
        if model != self.model_name:
            raise ApiError(404, f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                           "model")
        if not self._ready():
            raise ApiError(503, "the router is waiting for its workers; retry shortly", kind="server_error")
        if self.frontend.draining:
            raise ApiError(503, "the router is draining (shutting down); retry on another", kind="server_error")
        return body

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        p = parse(await self._body(request), chat)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        g = self.frontend.build(**p.build, request_id=rid)
        reply = Reply(chat, rid, self.model_name, int(time.time()))
        items = self.frontend.astream(g)
        async with contextlib.aclosing(items):   # leaving early (or being cancelled) aborts the request
            item = await anext(items)            # submit's ValueError surfaces here, before any header is sent
            if isinstance(item, Final) and item.error is not None:
                raise ApiError(503, item.error, kind="server_error")
            if p.stream:
                return await self._sse(request, reply, item, items, p.include_usage)
            text = []
            while not isinstance(item, Final):
                text.append(item.text)
                item = await anext(items)
            if item.error is not None:
                raise ApiError(503, item.error, kind="server_error")
            return web.json_response(reply.whole("".join(text) + item.text, item))

    async def _sse(self, request: web.Request, reply: Reply, item, items, include_usage: bool):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        try:
            if reply.chat:
                await resp.write(_event(reply.chunk(role=True)))
            while not isinstance(item, Final):
                if item.text:
                    await resp.write(_event(reply.chunk(item.text)))
                item = await anext(items)
            if item.error is not None:
                await resp.write(_event(error_body(item.error, kind="server_error")))
            else:
                await resp.write(_event(reply.chunk(item.text, item)))
                if include_usage:
                    await resp.write(_event(reply.usage_chunk(item)))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:  # the client left; closing `items` aborts the request
            log.info("client left during stream %s", reply.id)
        return resp

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "ssd",
             "max_model_len": self.core.max_len}]})

    async def health(self, request: web.Request) -> web.Response:
        if self._ready():
            return web.json_response({"status": "ok"})
        return web.json_response({"status": "unavailable", "reason": "waiting for the workers"}, status=503)

    async def metrics(self, request: web.Request) -> web.Response:
        if self.metrics_render is None:
            raise ApiError(404, "metrics are not enabled on this server")
        body, content_type = self.metrics_render()
        return web.Response(body=body, headers={"Content-Type": content_type})
