"""The `ssd` command line: prepare is idempotent, generate streams text and reports tokens/s."""
import subprocess
import sys


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "ssd.cli", *args], capture_output=True, text=True, timeout=300)


def test_prepare_when_done_is_quick_and_prints_paths(default_models):
    out = run_cli("models", "prepare")
    assert out.returncode == 0, out.stderr
    assert f"target: {default_models['target']}" in out.stdout


def test_generate_ar_prints_answer_and_rate(default_models):
    out = run_cli("generate", "--local", "--mode", "ar", "--max-tokens", "12", "What is the capital of France?")
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout
    assert "tok/s" in out.stderr and "[ar]" in out.stderr


def test_generate_rejects_bad_sampling_args(default_models):
    out = run_cli("generate", "--local", "--temperature", "-1", "hi")
    assert out.returncode == 2
    assert "temperature" in out.stderr
