"""API keys for the router's client APIs (gRPC metadata `authorization: Bearer <key>` and HTTP bearer).

Keys live in a file, one per line (blank lines and `#` comments ignored): a mounted Kubernetes Secret is such a
file. The file is re-read when its modification time changes (checked at most every `reload_s` seconds), so a
rotated Secret takes effect without a restart; a reload that finds no key keeps the previous keys and logs an
error. A presented key is compared with every configured key with `hmac.compare_digest`, without stopping at
a match, so the time taken does not depend on which key matched or how much of a key was right.
"""
from __future__ import annotations

import hmac
import logging
import threading
import time
from pathlib import Path

log = logging.getLogger("ssd.auth")


class ApiKeyError(ValueError):
    """The key file cannot be used; the message says why."""


def read_keys(path: Path) -> list[bytes]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ApiKeyError(f"cannot read the API key file {path}: {e.strerror or e}") from e
    keys = [line.strip().encode() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise ApiKeyError(f"the API key file {path} holds no key (one key per line)")
    if any(len(k) < 16 for k in keys):
        raise ApiKeyError(f"the API key file {path} holds a key shorter than 16 characters")
    return keys


def bearer(header: str | None) -> str | None:
    """The key in an `authorization` value "Bearer <key>" (case-insensitive scheme), else None."""
    if not header:
        return None
    scheme, _, key = header.strip().partition(" ")
    return key.strip() if scheme.lower() == "bearer" and key.strip() else None


class ApiKeys:
    def __init__(self, path: Path, reload_s: float = 2.0):
        self.path, self.reload_s = Path(path), reload_s
        self._keys = read_keys(self.path)
        self._mtime = self._stat()
        self._checked = time.monotonic()
        self._lock = threading.Lock()

    def _stat(self) -> float:
        try:
            return self.path.stat().st_mtime
        except OSError:
            return -1.0

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.reload_s:
            return
        with self._lock:
            self._checked = now
            mtime = self._stat()
            if mtime == self._mtime:
                return
            self._mtime = mtime
            try:
                self._keys = read_keys(self.path)
                log.info("reloaded %d API keys from %s", len(self._keys), self.path)
            except ApiKeyError as e:
                log.error("%s; keeping the previous keys", e)

    def valid(self, authorization: str | None) -> bool:
        """Whether an `authorization` header/metadata value carries a configured key."""
        self._maybe_reload()
        key = bearer(authorization)
        candidate = (key or "").encode()
        ok = False
        for k in self._keys:
            ok |= hmac.compare_digest(candidate, k)
        return ok and key is not None

    def __len__(self) -> int:
        return len(self._keys)
