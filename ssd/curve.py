"""Data-plane authentication and encryption: ZeroMQ CURVE keys for routers and workers.

Two key pairs make a deployment: every worker (targets and drafts) serves with the *worker* pair, every router
connects with the *router* pair. A worker accepts a connection only if the client's public key is among its
authorised keys (a ZAP handler checks it during the handshake: an unknown or missing key never gets a message
through); a router talks to a worker only if the worker proves it holds the secret of the worker public key the
router was given. Keys are ZeroMQ certificate files (`zmq.auth`): `NAME.key` holds the public key and may be
shared, `NAME.key_secret` holds both and stays with its owner. `ssd keys generate --out DIR` writes them.
Off by default: without keys the sockets are plain (the loopback default of `ssd up`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

log = logging.getLogger(__name__)

DEFAULT_NAMES = ("router", "worker")


class KeyFileError(ValueError):
    """A key file that is missing or not a ZeroMQ certificate; the text names the file."""


def generate(out: Path, names=DEFAULT_NAMES) -> list[Path]:
    """Write `NAME.key` and `NAME.key_secret` for each name into `out` (the secret file readable by its owner
    only); refuses to overwrite an existing pair."""
    if not zmq.has("curve"):
        raise RuntimeError("this libzmq was built without CURVE support")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in names:
        if (out / f"{name}.key").exists() or (out / f"{name}.key_secret").exists():
            raise FileExistsError(f"{out / name}.key(_secret) exists; remove it or choose another --out")
        public, secret = (Path(p) for p in zmq.auth.create_certificates(out, name))
        secret.chmod(0o600)
        written += [public, secret]
    return written


def load_keypair(path: Path) -> tuple[bytes, bytes]:
    """(public, secret) z85 keys from a `.key_secret` certificate."""
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise KeyFileError(f"{path}: cannot read a CURVE key pair ({e})") from None
    if secret is None:
        raise KeyFileError(f"{path}: holds no secret key (give the NAME.key_secret file)")
    return public, secret


def load_public_keys(path: Path) -> frozenset[bytes]:
    """The z85 public keys in a certificate file, or in every `*.key` file of a folder."""
    files = sorted(path.glob("*.key")) if path.is_dir() else [path]
    keys = set()
    for f in files:
        try:
            keys.add(zmq.auth.load_certificate(f)[0])
        except (OSError, ValueError) as e:
            raise KeyFileError(f"{f}: cannot read a CURVE public key ({e})") from None
    if not keys:
        raise KeyFileError(f"{path}: no public keys (*.key files) found")
    return frozenset(keys)


@dataclass(frozen=True, slots=True)
class ClientKeys:
    """A router's side: its own pair and the public key its workers serve with."""
    public: bytes
    secret: bytes
    server: bytes

    @classmethod
    def load(cls, secret_file: Path, server_key_file: Path) -> ClientKeys:
        (server,) = load_public_keys(server_key_file)
        return cls(*load_keypair(secret_file), server)

    def apply(self, sock: zmq.Socket) -> None:
        """Call before connect."""
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = self.public, self.secret, self.server


@dataclass(frozen=True, slots=True)
class ServerKeys:
    """A worker's side: its pair and the public keys of the clients (routers) it accepts."""
    public: bytes
    secret: bytes
    authorized: frozenset[bytes]

    @classmethod
    def load(cls, secret_file: Path, authorized: Path) -> ServerKeys:
        return cls(*load_keypair(secret_file), load_public_keys(authorized))

    def apply(self, sock: zmq.Socket) -> None:
        """Call before bind, with `authenticator` running on the socket's context."""
        sock.curve_server = True
        sock.curve_publickey, sock.curve_secretkey = self.public, self.secret

    def authenticator(self, ctx: zmq.Context, name: str) -> ThreadAuthenticator:
        """A started ZAP handler on `ctx` that admits only the authorised client keys."""
        auth = ThreadAuthenticator(ctx, log=logging.getLogger("zmq.auth"))
        auth.start()
        auth.configure_curve_callback("*", _Allow(self.authorized, name))
        return auth


class _Allow:
    """The ZAP credentials provider: a key in the set is allowed; a refused key is logged once."""

    def __init__(self, keys: frozenset[bytes], name: str):
        self.keys, self.name, self.refused = keys, name, set()

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.keys:
            return True
        if key not in self.refused and len(self.refused) < 1024:
            self.refused.add(key)
            log.warning("%s: refused a data-plane connection from an unknown CURVE key %s", self.name,
                        key.decode(errors="replace"))
        return False


def server_keys(secret_key_file: Path | None, authorized_keys: Path | None) -> ServerKeys | None:
    """A worker's CURVE settings from its two options (None when both are unset)."""
    if secret_key_file is None and authorized_keys is None:
        return None
    if secret_key_file is None or authorized_keys is None:
        raise KeyFileError("CURVE needs both --curve-secret-key-file and --curve-authorized-keys")
    return ServerKeys.load(secret_key_file, authorized_keys)


def client_keys(secret_key_file: Path | None, server_key_file: Path | None) -> ClientKeys | None:
    """A router's CURVE settings from its two options (None when both are unset)."""
    if secret_key_file is None and server_key_file is None:
        return None
    if secret_key_file is None or server_key_file is None:
        raise KeyFileError("CURVE needs both --curve-secret-key-file and --curve-worker-key")
    return ClientKeys.load(secret_key_file, server_key_file)
