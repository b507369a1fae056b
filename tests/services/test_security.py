"""API keys and TLS on a real router (gRPC, HTTP and `ssd generate`), and graceful drain on SIGTERM."""
import datetime
import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time

import pytest

from services.router.auth import ApiKeyError, ApiKeys, bearer, read_keys
from ssd.cli.launcher import Stack, StackConfig
from ssd.client import AuthenticationError, Client, Delta, UnavailableError

KEY = "sk-test-0123456789abcdef"


def self_signed(folder):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(__import__("ipaddress").ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    (folder / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    return folder / "tls.crt", folder / "tls.key"


def test_key_file_parsing_reload_and_bearer(tmp_path):
    f = tmp_path / "keys"
    f.write_text("# rotated weekly\n\n" + KEY + "\n")
    keys = ApiKeys(f, reload_s=0.0)
    assert len(keys) == 1 and keys.valid(f"Bearer {KEY}") and keys.valid(f"bearer  {KEY} ")
    assert not keys.valid(None) and not keys.valid(KEY) and not keys.valid(f"Bearer {KEY[:-1]}")
    assert not keys.valid("Bearer ") and not keys.valid(f"Basic {KEY}") and bearer("Bearer") is None
    time.sleep(0.01)
    f.write_text("sk-rotated-key-000000000\n")
    __import__("os").utime(f, (time.time() + 5, time.time() + 5))
    assert keys.valid("Bearer sk-rotated-key-000000000") and not keys.valid(f"Bearer {KEY}")
    f.write_text("# emptied by mistake\n")
    __import__("os").utime(f, (time.time() + 10, time.time() + 10))
    assert keys.valid("Bearer sk-rotated-key-000000000")  # a broken reload keeps the previous keys
    for text, message in (("", "holds no key"), ("short\n", "shorter than 16")):
        f.write_text(text)
        with pytest.raises(ApiKeyError, match=message):
            read_keys(f)
    with pytest.raises(ApiKeyError, match="cannot read"):
        read_keys(tmp_path / "missing")


@pytest.fixture(scope="module")
def secured(default_models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("secrets")
    (folder / "keys").write_text(KEY + "\n")
    cert, key = self_signed(folder)
    cfg = StackConfig(mode="ssd", log_dir=folder / "logs", target_cpus="0", draft_cpus="1", threads=1,
                      extra={"router": ["--api-keys-file", str(folder / "keys"), "--tls-cert-file", str(cert),
                                        "--tls-key-file", str(key), "--drain-timeout", "60"]})
    stack = Stack(cfg)
    # The launcher waits for health over plaintext gRPC; with TLS, wait for the HTTP port instead.
    for i in range(len(stack.target_data)):
        stack.start_target(i)
    for i in range(len(stack.draft_data)):
        stack.start_draft(i)
    stack.start_router(0)
    stack.cert = cert.read_bytes()
    ctx = ssl.create_default_context(cadata=stack.cert.decode())
    deadline = time.monotonic() + 180
    while True:
        try:
            conn = http.client.HTTPSConnection(stack.http_address, context=ctx, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline and stack.procs["router"].poll() is None, "the secured router did not start"
        time.sleep(0.5)
    stack.ssl = ctx
    yield stack
    stack.stop()


def test_grpc_needs_a_valid_key_over_tls(secured, chat_prompts, ar_reference):
    with Client(secured.grpc_address, root_certificates=secured.cert, timeout=120) as c, \
            pytest.raises(AuthenticationError, match="API key"):
        c.generate(chat_prompts[0], max_tokens=4)
    with Client(secured.grpc_address, root_certificates=secured.cert, api_key="sk-wrong-000000000000",
                timeout=120) as c, pytest.raises(AuthenticationError):
        c.model_info()
    with Client(secured.grpc_address, root_certificates=secured.cert, api_key=KEY, timeout=120) as c:
        r = c.generate(chat_prompts[0], max_tokens=16, ignore_eos=True)
    assert r.token_ids == ar_reference[0][:16]
    with Client(secured.grpc_address, api_key=KEY, timeout=10, max_retries=0) as c, \
            pytest.raises(UnavailableError):  # plaintext to a TLS port never gets through
        c.model_info()


def test_http_needs_a_bearer_key_except_for_health(secured):
    def call(method, path, headers=None, body=None):
        conn = http.client.HTTPSConnection(secured.http_address, context=secured.ssl, timeout=60)
        conn.request(method, path, body=json.dumps(body) if body else None,
                     headers={"content-type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")

    status, body = call("GET", "/v1/models")
    assert status == 401 and body["error"]["type"] == "authentication_error" and "API key" in body["error"]["message"]
    assert call("GET", "/v1/models", {"Authorization": "Bearer nope-nope-nope-nope"})[0] == 401
    assert call("GET", "/health")[0] == 200
    status, body = call("POST", "/v1/completions", {"Authorization": f"Bearer {KEY}"},
                        {"prompt": "The sky is", "max_tokens": 4, "temperature": 0})
    assert status == 200 and body["usage"]["completion_tokens"] == 4


def ssd_generate(address: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`ssd generate` as a user runs it (no $SSD_API_KEY unless `env` sets it)."""
    base = {k: v for k, v in os.environ.items() if k != "SSD_API_KEY"}
    return subprocess.run([sys.executable, "-m", "ssd.cli", "generate", "--address", address, "--max-tokens", "8",
                           "--ignore-eos", *args, "Name three colours of the rainbow."],
                          capture_output=True, text=True, timeout=180, env={**base, **(env or {})})


def test_ssd_generate_with_the_key_and_the_certificate(secured, tmp_path):
    (tmp_path / "tls.crt").write_bytes(secured.cert)
    ca = str(tmp_path / "tls.crt")
    with Client(secured.grpc_address, root_certificates=secured.cert, api_key=KEY, timeout=120) as c:
        expected = c.generate("Name three colours of the rainbow.", chat=True, max_tokens=8, ignore_eos=True).text
    out = ssd_generate(secured.grpc_address, "--api-key", KEY, "--tls-ca-file", ca)
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip("\n") == expected and "8 tokens (length)" in out.stderr, out.stderr
    out = ssd_generate(secured.grpc_address, "--tls-ca-file", ca, env={"SSD_API_KEY": KEY})
    assert out.returncode == 0 and out.stdout.rstrip("\n") == expected, out.stderr


def test_ssd_generate_says_what_is_missing(secured, tmp_path):
    (tmp_path / "tls.crt").write_bytes(secured.cert)
    ca = str(tmp_path / "tls.crt")
    cases = [  # (flags, what stderr must say), each refused before any token
        (["--tls-ca-file", ca], ["UNAUTHENTICATED", "needs an API key: pass --api-key KEY or set $SSD_API_KEY"]),
        (["--tls-ca-file", ca, "--api-key", "sk-wrong-000000000000"],
         ["UNAUTHENTICATED", "refused the key given by --api-key or $SSD_API_KEY"]),
        (["--api-key", KEY], ["UNAVAILABLE", "closed the connection at once: if it serves TLS, pass --tls-ca-file"]),
        (["--api-key", KEY, "--tls"], ["UNAVAILABLE", "is not trusted", "--tls-ca-file FILE"]),
    ]
    for flags, messages in cases:
        out = ssd_generate(secured.grpc_address, *flags)
        assert out.returncode == 1 and out.stdout == "", (flags, out.stderr)
        for m in messages:
            assert m in out.stderr, (flags, out.stderr)
        assert "is `ssd up` running" not in out.stderr, (flags, out.stderr)
    out = ssd_generate(secured.grpc_address, "--api-key", KEY, "--tls-ca-file", str(tmp_path / "missing.crt"))
    assert out.returncode == 2 and "error: --tls-ca-file:" in out.stderr and "missing.crt" in out.stderr, out.stderr


def test_sigterm_drains_running_streams_and_refuses_new_ones(secured, chat_prompts, ar_reference):
    out, errors = {}, []
    started = threading.Event()

    def run():
        try:
            with Client(secured.grpc_address, root_certificates=secured.cert, api_key=KEY, timeout=300) as c:
                tokens = []
                for item in c.stream(chat_prompts[1], max_tokens=32, ignore_eos=True):
                    if isinstance(item, Delta):
                        tokens += item.token_ids
                        started.set()
                out["tokens"] = tokens
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
            started.set()

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(120)
    secured.kill("router", signal.SIGTERM)
    time.sleep(0.5)
    with Client(secured.grpc_address, root_certificates=secured.cert, api_key=KEY, timeout=10, max_retries=0) as c, \
            pytest.raises(UnavailableError):
        c.generate(chat_prompts[2], max_tokens=4)
    t.join(timeout=300)
    assert not errors and out["tokens"] == ar_reference[1]  # the running stream finished within the grace period
    assert secured.procs["router"].wait(timeout=30) == 0
    assert "draining: 1 requests" in (secured.cfg.log_dir / "router.log").read_text()
