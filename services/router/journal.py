"""Request state in Redis: what lets several routers serve one stream, and a client resume on another router.

Consistency model (docs/architecture.md, "Request state"):

- `begin` writes a request's record (its prompt token ids, sampling parameters, stop strings, a fingerprint of
  the client's request) before the request reaches the engine.
- `append` writes committed tokens *before* the router sends them to the client (write-ahead). The journal
  therefore always holds at least every token a client has received; a crash can lose only tokens that no
  client has seen, and those are recomputed (identically at temperature 0; from the same distribution above).
- `claim` hands a request to another router: it bumps the record's epoch, so the previous owner's next
  `append` fails (fencing) and that router ends its copy of the stream. Two routers never both extend one
  journal, even during a network partition.
- `finish` records the finish reason; a finished record stays `ttl_s` seconds so a client that lost the
  final response can still fetch the rest of its stream.
- Records expire `ttl_s` seconds after their last write. Redis persistence (AOF) decides whether a Redis
  restart keeps them; without it, a restart loses running requests' records (resuming them then fails with
  NOT_FOUND) but nothing else.

Redis calls are retried for `retry_s` seconds (a restart or a brief outage is ridden out); after that the
call raises `JournalUnavailable` and the router fails the request with UNAVAILABLE, which the SDK retries.
Keys: `{namespace}:req:{request_id}` (a hash), `{namespace}:req:{request_id}:tok` (token ids, packed
little-endian uint32, appended with APPEND) and, for a request that asked for logprobs,
`{namespace}:req:{request_id}:lp` (one JSON line per token: [token, logprob, [[id, logprob], ...]], appended
with the tokens, so a resumed stream replays them with their logprobs). Torch-free.
"""
from __future__ import annotations

import hashlib
import json
import logging
import struct
import time
from dataclasses import dataclass, field

from ssd.params import TokenLogprob

log = logging.getLogger("ssd.journal")


class JournalError(RuntimeError):
    """A journal operation cannot be done; the message says why."""


class JournalUnavailable(JournalError):
    """Redis did not answer within the retry window."""


class Fenced(JournalError):
    """Another router has claimed the request: this router must stop extending it."""


@dataclass(slots=True)
class Record:
    request_id: str
    prompt: list[int]
    params: dict             # SamplingParams fields, plus stop strings, mode and k
    fingerprint: str         # of the client's request, to refuse a resume that asks for something else
    tokens: list[int]        # committed tokens, in order
    state: str               # running | finished
    finish: str              # the finish reason's value once finished
    epoch: int
    logprobs: list[TokenLogprob] = field(default_factory=list)   # one per token, when the request asked for them


_APPEND = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
redis.call('APPEND', KEYS[2], ARGV[2])
redis.call('APPEND', KEYS[3], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('EXPIRE', KEYS[3], ARGV[3])
return redis.call('STRLEN', KEYS[2])
"""

_FINISH = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
redis.call('HSET', KEYS[1], 'state', 'finished', 'finish', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('EXPIRE', KEYS[3], ARGV[3])
return 1
"""

_CLAIM = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'owner', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
redis.call('EXPIRE', KEYS[3], ARGV[2])
local rec = redis.call('HGETALL', KEYS[1])
local tok = redis.call('GET', KEYS[2])
if not tok then tok = '' end
local lp = redis.call('GET', KEYS[3])
if not lp then lp = '' end
return {rec, tok, lp}
"""

# begin: refuse to overwrite a record that is still running (a resume must use claim).
_BEGIN = """
if redis.call('HGET', KEYS[1], 'state') == 'running' then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('HSET', KEYS[1], 'prompt', ARGV[1], 'params', ARGV[2], 'fingerprint', ARGV[3], 'owner', ARGV[4],
           'epoch', '1', 'state', 'running', 'finish', '')
redis.call('SET', KEYS[2], '')
redis.call('SET', KEYS[3], '')
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[5])
redis.call('EXPIRE', KEYS[3], ARGV[5])
return 1
"""


def pack(tokens: list[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}I", *tokens)


def unpack(raw: bytes) -> list[int]:
    if len(raw) % 4:
        raise JournalError(f"corrupt token journal ({len(raw)} bytes is not a whole number of tokens)")
    return list(struct.unpack(f"<{len(raw) // 4}I", raw))


def pack_logprobs(logprobs: list[TokenLogprob] | None) -> bytes:
    return b"".join(json.dumps([lp.token, lp.logprob, [list(t) for t in lp.top]]).encode() + b"\n"
                    for lp in logprobs or ())


def unpack_logprobs(raw: bytes) -> list[TokenLogprob]:
    try:
        rows = [json.loads(line) for line in raw.split(b"\n") if line]
        return [TokenLogprob(int(t), float(v), tuple((int(a), float(b)) for a, b in top)) for t, v, top in rows]
    except (ValueError, TypeError) as e:
        raise JournalError(f"corrupt logprob journal: {e}") from e


def fingerprint(request_bytes: bytes) -> str:
    return hashlib.sha256(request_bytes).hexdigest()


class RequestJournal:
    def __init__(self, url: str, owner: str, namespace: str = "ssd", ttl_s: int = 3600, retry_s: float = 5.0,
                 timeout_s: float = 1.0):
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        from ssd.discovery import _redact

        self.url, self.owner, self.namespace = _redact(url), owner, namespace
        self.ttl_s, self.retry_s = int(ttl_s), retry_s
        self._redis = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                           retry=Retry(NoBackoff(), 0))
        self._error = redis.RedisError
        self._scripts = {name: self._redis.register_script(src)
                         for name, src in (("append", _APPEND), ("finish", _FINISH), ("claim", _CLAIM),
                                           ("begin", _BEGIN))}

    def keys(self, rid: str) -> list[str]:
        return [f"{self.namespace}:req:{rid}", f"{self.namespace}:req:{rid}:tok", f"{self.namespace}:req:{rid}:lp"]

    def _call(self, what: str, fn):
        """Runs fn, retrying Redis errors until retry_s has passed; then JournalUnavailable."""
        deadline = time.monotonic() + self.retry_s
        delay = 0.05
        while True:
            try:
                return fn()
            except self._error as e:
                if time.monotonic() + delay > deadline:
                    raise JournalUnavailable(f"request state store (Redis at {self.url}) unreachable during {what}: "
                                             f"{e}") from e
                log.warning("Redis at %s: %s failed (%s); retrying", self.url, what, e)
                time.sleep(delay)
                delay = min(0.5, delay * 2)

    def check(self) -> None:
        """Raises JournalError with a clear message when Redis cannot be reached (no retry window)."""
        try:
            self._redis.ping()
        except self._error as e:
            raise JournalError(f"cannot reach the request-state Redis at {self.url}: {e}") from e

    def begin(self, rid: str, prompt: list[int], params: dict, fp: str) -> int:
        """Journals a new request; returns its epoch (1). A record of the same id that is still running is an
        error (ValueError: the client must resume it or choose another id)."""
        ok = self._call("begin", lambda: self._scripts["begin"](
            keys=self.keys(rid), args=[pack(prompt), json.dumps(params), fp, self.owner, self.ttl_s]))
        if not ok:
            raise ValueError(f"request_id: {rid!r} is already running (resume it with resume_from, or use a new id)")
        return 1

    def append(self, rid: str, epoch: int, tokens: list[int], logprobs: list[TokenLogprob] | None = None) -> int:
        """Journals committed tokens (and their logprobs, one per token, when the request asked); returns how many
        tokens the journal now holds. Fenced if another router claimed the request."""
        n = self._call("append", lambda: self._scripts["append"](
            keys=self.keys(rid), args=[str(epoch), pack(tokens), self.ttl_s, pack_logprobs(logprobs)]))
        if n < 0:
            raise Fenced(f"request {rid!r} was resumed on another router")
        return n // 4

    def finish(self, rid: str, epoch: int, reason: str) -> None:
        ok = self._call("finish", lambda: self._scripts["finish"](
            keys=self.keys(rid), args=[str(epoch), reason, self.ttl_s]))
        if ok < 0:
            raise Fenced(f"request {rid!r} was resumed on another router")

    def claim(self, rid: str) -> Record | None:
        """Takes the request over (None when there is no record): the returned epoch fences the previous owner."""
        got = self._call("claim", lambda: self._scripts["claim"](keys=self.keys(rid), args=[self.owner, self.ttl_s]))
        if not got:
            return None
        flat, tok, lps = got
        rec = {flat[i].decode(): flat[i + 1] for i in range(0, len(flat), 2)}
        try:
            return Record(rid, unpack(rec["prompt"]), json.loads(rec["params"]), rec["fingerprint"].decode(),
                          unpack(tok), rec["state"].decode(), rec["finish"].decode(), int(rec["epoch"]),
                          unpack_logprobs(lps))
        except (KeyError, ValueError) as e:
            raise JournalError(f"corrupt journal record for request {rid!r}: {e}") from e

    def close(self) -> None:
        self._redis.close()
