"""The `ssd` command line: prepare is idempotent, generate streams text and reports tokens/s."""
import subprocess
import sys

import pytest


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


def test_version_prints_the_installed_version():
    import tomllib
    from importlib.metadata import version
    from pathlib import Path

    import ssd

    out = run_cli("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"ssd {version('ssd')}"
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert ssd.__version__ == pyproject["project"]["version"]


def up_command_lines(monkeypatch, argv: list[str]) -> dict[str, list[str]]:
    """The command line `ssd up ARGV` would start each service with (role -> argv), starting none."""
    from ssd.cli import build_parser
    from ssd.cli.launcher import Stack
    from ssd.cli.up import stack_config

    cfg = stack_config(build_parser().parse_args(["up", *argv]))
    spawned = {}
    monkeypatch.setattr(Stack, "_spawn", lambda self, name, role, index, args: spawned.setdefault(role, args))
    stack = Stack(cfg)
    try:
        stack.start_target(0)
        stack.start_draft(0)
        spawned["router"] = stack._router_args(0, 1.0)
    finally:
        stack.stop()
    return spawned


def test_up_flags_reach_the_service_command_lines(default_models, monkeypatch):
    spawned = up_command_lines(monkeypatch, [
        "--model", str(default_models["target"]), "--draft", str(default_models["draft"]), "--device", "cpu",
        "--dtype", "bfloat16", "--max-batch", "2", "--host", "0.0.0.0", "--port", "0", "--http-port", "0"])

    def flag(role, name):
        argv = spawned[role]
        return argv[argv.index(name) + 1] if name in argv else None

    for role in ("target", "draft"):
        assert flag(role, "--device") == "cpu" and flag(role, "--dtype") == "bfloat16", spawned[role]
        assert flag(role, "--max-seqs") == "2"
        assert flag(role, "--data-address").startswith("tcp://127.0.0.1:"), "workers stay on loopback"
    assert flag("target", "--model") == str(default_models["target"])
    assert flag("draft", "--model") == str(default_models["draft"])
    assert flag("router", "--max-batch") == "2"
    assert flag("router", "--grpc-address") == "0.0.0.0:0" and flag("router", "--http-address") == "0.0.0.0:0"
    assert "--device" not in spawned["router"]


def test_up_pin_gives_the_target_its_own_cpu(monkeypatch):
    """--pin: the target on CPU 0 alone, the drafts and the router on CPU 1 (a router on the target's core slowed
    every verify of an SSD round); without it nothing is pinned."""
    for pinned in (True, False):
        spawned = up_command_lines(monkeypatch, ["--port", "0", "--http-port", "0", *(["--pin"] if pinned else [])])
        cpus = {role: argv[argv.index("--cpus") + 1] if "--cpus" in argv else None for role, argv in spawned.items()}
        assert cpus == ({"target": "0", "draft": "1", "router": "1"} if pinned else
                        {"target": None, "draft": None, "router": None})


def test_up_defaults_leave_the_services_defaults():
    from ssd.cli import build_parser
    from ssd.cli.up import stack_config

    cfg = stack_config(build_parser().parse_args(["up"]))
    assert (cfg.device, cfg.dtype, cfg.host, cfg.max_batch) == ("", "", "127.0.0.1", 16)
    assert cfg.target_model is None and cfg.draft_model is None


@pytest.mark.parametrize("argv, flag", [
    (["--device", "tpu"], "--device"), (["--dtype", "int8"], "--dtype"), (["--max-batch", "0"], "--max-batch"),
    (["--model", "/nonexistent/model"], "--model"), (["--draft", "/nonexistent/draft"], "--draft"),
    (["--host", " "], "--host")])
def test_up_rejects_bad_values_naming_the_flag(argv, flag, capsys):
    from ssd.cli import main

    assert main(["up", *argv]) == 2
    err = capsys.readouterr().err
    assert flag in err, err


def test_generate_parser_repeats_stop_and_leaves_mode_and_k_to_the_router():
    from ssd.cli import build_parser

    args = build_parser().parse_args(["generate", "--stop", "a", "--stop", "\n\n", "hi"])
    assert args.stop == ["a", "\n\n"]
    assert args.mode is None and args.k is None


@pytest.mark.parametrize("flag", [["--model", "m"], ["--draft", "d"], ["--backup", "ngram"], ["--threads", "2"]])
def test_remote_generate_refuses_local_only_flags(flag, capsys):
    from ssd.cli import main

    assert main(["generate", "--address", "127.0.0.1:1", *flag, "hi"]) == 2
    err = capsys.readouterr().err
    assert flag[0] in err and "--local" in err and "ssd up" in err, err
    assert "running" not in err


def test_local_generate_refuses_router_only_flags(capsys):
    from ssd.cli import main

    assert main(["generate", "--local", "--stop", "x", "--api-key", "k", "hi"]) == 2
    err = capsys.readouterr().err
    assert "--stop" in err and "--api-key" in err, err


class _RecordingClient:
    """Stands in for ssd.client.Client: records how the CLI built it and the request options, then fails."""
    made: list = []

    def __init__(self, address, timeout=None, **kwargs):
        self.made.append({"address": address, "timeout": timeout, **kwargs})

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def stream(self, prompt, **options):
        from ssd.client import AuthenticationError

        self.made[-1]["options"] = options
        raise AuthenticationError("UNAUTHENTICATED", "unknown API key")


def test_remote_generate_passes_key_tls_and_options_to_the_client(tmp_path, monkeypatch, capsys):
    import ssd.client
    from ssd.cli import main

    _RecordingClient.made = []
    monkeypatch.setattr(ssd.client, "Client", _RecordingClient)
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("SSD_API_KEY", "sk-from-env")
    assert main(["generate", "--address", "h:1", "--tls-ca-file", str(ca), "--mode", "sd", "--k", "2",
                 "--stop", "x", "--stop", "y", "--temperature", "0.5", "--timeout", "9", "hi"]) == 1
    made = _RecordingClient.made[-1]
    assert made["api_key"] == "sk-from-env" and made["root_certificates"] == ca.read_bytes()
    assert made["address"] == "h:1" and made["timeout"] == 9.0
    assert made["options"]["mode"] == "sd" and made["options"]["k"] == 2 and made["options"]["stop"] == ["x", "y"]
    assert made["options"]["temperature"] == 0.5
    err = capsys.readouterr().err
    assert "UNAUTHENTICATED: unknown API key" in err and "running" not in err, err

    assert main(["generate", "--address", "h:1", "--api-key", "sk-flag", "--tls", "hi"]) == 1
    made = _RecordingClient.made[-1]
    assert made["api_key"] == "sk-flag" and made["tls"] is True and made["root_certificates"] is None
    assert made["options"]["mode"] == "" and made["options"]["k"] == 0


def test_remote_generate_reports_an_unreadable_ca_file(tmp_path, capsys):
    from ssd.cli import main

    assert main(["generate", "--tls-ca-file", str(tmp_path / "missing.pem"), "hi"]) == 2
    assert "--tls-ca-file" in capsys.readouterr().err


def test_models_download_is_wired_and_offline_by_default_says_how_to_allow_it(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    out = subprocess.run([sys.executable, "-m", "ssd.cli", "models", "download", "Qwen/Qwen3-0.6B", "--models-dir",
                          str(tmp_path)], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2
    assert "offline mode is on" in out.stderr and "HF_HUB_OFFLINE=0 ssd models download Qwen/Qwen3-0.6B" in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_bench_serve_is_wired_and_bench_alone_keeps_its_flags():
    serve = run_cli("bench", "serve", "--help")
    assert serve.returncode == 0 and "--request-rate" in serve.stdout and "--goodput" in serve.stdout
    bench = run_cli("bench", "--help")
    assert bench.returncode == 0 and "--ks" in bench.stdout and "serve" in bench.stdout


@pytest.mark.parametrize("flag,value,says", [
    ("--passes", "-1", "argument --passes: must be at least 0, got -1"),
    ("--new-tokens", "0", "argument --new-tokens: must be at least 1, got 0"),
    ("--prompts", "x", "argument --prompts: 'x' is not an integer"),
    ("--batches", "1,0,4", "argument --batches: must be at least 1, got 0"),
    ("--batches", "1,,4", "argument --batches: '' is not an integer"),
    ("--k", "0", "argument --k: must be at least 1, got 0"),
    ("--ks", "2,-3", "argument --ks: must be at least 1, got -3"),
])
def test_bench_refuses_counts_it_cannot_run_before_starting_anything(flag, value, says, capsys):
    from ssd.cli.app import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["bench", flag, value])
    assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_bench_reads_its_lists_and_defaults():
    from ssd.cli.app import build_parser

    args = build_parser().parse_args(["bench", "--batches", "1, 2,16", "--ks", "1,3", "--passes", "0"])
    assert (args.batches, args.ks, args.passes, args.k) == ((1, 2, 16), (1, 3), 0, 3)
    args = build_parser().parse_args(["bench"])
    assert (args.batches, args.ks, args.new_tokens, args.prompts) == ((1, 2, 4, 8), (), 256, 16)
