"""`ssd generate` against a running router (a subprocess, as a user runs it): --mode, --k and --stop reach the
request; the "is `ssd up` running?" hint comes only when the router is unreachable, and TLS to a router without
it says so (the secured router's cases are in test_security.py)."""
import re
import subprocess
import sys

from ssd.cli.launcher import free_port

PROMPT = "Name three colours of the rainbow."


def generate(address: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ssd.cli", "generate", "--address", address, *args, PROMPT],
                          capture_output=True, text=True, timeout=120)


def acceptance_positions(stderr: str) -> int:
    found = re.search(r"acceptance per position \[([^\]]*)\]", stderr)
    assert found, stderr
    return len([a for a in found.group(1).split(",") if a.strip()])


def test_mode_and_k_reach_the_request(stack):
    out = generate(stack.grpc_address, "--mode", "sd", "--k", "2", "--max-tokens", "16", "--ignore-eos")
    assert out.returncode == 0, out.stderr
    assert "[sd] 16 tokens" in out.stderr, out.stderr
    assert acceptance_positions(out.stderr) == 2, "the request's K is 2, not the draft's 3"
    out = generate(stack.grpc_address, "--mode", "ar", "--max-tokens", "8", "--ignore-eos")
    assert out.returncode == 0, out.stderr
    assert "[ar] 8 tokens" in out.stderr and "acceptance per position []" in out.stderr, out.stderr


def test_stop_strings_truncate_the_text(stack):
    full = generate(stack.grpc_address, "--mode", "ar", "--max-tokens", "24", "--ignore-eos")
    assert full.returncode == 0, full.stderr
    text = full.stdout.rstrip("\n")
    words = text.split()
    assert len(words) > 4, text
    stop = words[3]
    out = generate(stack.grpc_address, "--mode", "ar", "--max-tokens", "24", "--ignore-eos",
                   "--stop", "never-in-the-text", "--stop", stop)
    assert out.returncode == 0, out.stderr
    assert "(stop_string)" in out.stderr, out.stderr
    assert out.stdout.rstrip("\n") == text[:text.index(stop)]


def test_unreachable_router_gets_the_hint_an_invalid_argument_does_not(stack):
    address = f"127.0.0.1:{free_port()}"
    out = generate(address, "--max-tokens", "4")
    assert out.returncode == 1
    assert "UNAVAILABLE" in out.stderr and f"is `ssd up` running at {address}?" in out.stderr, out.stderr
    out = generate(stack.grpc_address, "--max-tokens", "4", "--temperature", "-1")
    assert out.returncode == 2
    assert "INVALID_ARGUMENT" in out.stderr and "temperature" in out.stderr, out.stderr
    assert "running" not in out.stderr, out.stderr


def test_tls_to_a_router_without_it_says_so(stack):
    out = generate(stack.grpc_address, "--max-tokens", "4", "--tls")
    assert out.returncode == 1 and out.stdout == "", out.stderr
    assert f"the router at {stack.grpc_address} does not serve TLS: drop --tls / --tls-ca-file" in out.stderr, out.stderr
