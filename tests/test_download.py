"""`ssd models download` against a local fake Hugging Face Hub (http.server on 127.0.0.1, HF_ENDPOINT set to it).

The fake hub serves the endpoints huggingface_hub 2.x uses: GET /api/models/{repo}/revision/{rev} (repo info with
the commit sha), GET /api/models/{repo}/tree/{rev} (file listing) and HEAD/GET /{repo}/resolve/{rev}/{file} (with
X-Repo-Commit, ETag and Content-Length). Every request path is recorded so the tests can assert what was fetched.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ssd.models import download as dl

SHA = "0123456789abcdef0123456789abcdef01234567"
DECOYS = {"pytorch_model.bin": b"not used", "model.gguf": b"not used", "onnx/model.onnx": b"not used",
          "original/consolidated.00.pth": b"not used", "README.md": b"# tiny"}
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".onnx", ".pth")


def _tokenizer_files(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, 128)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    (folder / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))


def _repo_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory) -> dict[str, bytes]:
    """A random tiny Llama saved in 3+ safetensors shards with an index, its tokenizer, and decoy files."""
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("hub-tiny-llama")
    LlamaForCausalLM(cfg).save_pretrained(folder, max_shard_size="100KB", safe_serialization=True)
    _tokenizer_files(folder)
    files = _repo_files(folder)
    assert "model.safetensors.index.json" in files and sum(n.endswith(".safetensors") for n in files) >= 2
    return files | DECOYS


class FakeHub:
    def __init__(self):
        self.repos: dict[str, dict[str, bytes]] = {}
        self.errors: dict[str, tuple[int, dict[str, str]]] = {}  # repo -> (status, headers) for every request
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Authorization)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_HEAD(self):
                self._serve(body=False)

            def do_GET(self):
                self._serve(body=True)

            def _send(self, status, headers, payload=b"", body=True):
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if body:
                    self.wfile.write(payload)

            def _serve(self, body):
                path = self.path.split("?")[0]
                hub.requests.append((self.command, path, self.headers.get("Authorization")))
                m = (re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/(revision|tree)/([^/]+))?", path)
                     or re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path))
                if not m:
                    return self._send(404, {"X-Error-Message": "no such endpoint"}, b"{}", body)
                repo = m.group(1)
                if repo in hub.errors:
                    status, headers = hub.errors[repo]
                    return self._send(status, headers, b'{"error": "refused"}', body)
                files = hub.repos.get(repo)
                if files is None:
                    return self._send(404, {"X-Error-Code": "RepoNotFound"}, b'{"error": "not found"}', body)
                if path.startswith("/api/") and m.group(2) in ("revision", None):
                    info = {"id": repo, "sha": SHA, "siblings": [{"rfilename": n} for n in files]}
                    return self._send(200, {"Content-Type": "application/json"}, json.dumps(info).encode(), body)
                if path.startswith("/api/"):
                    tree = [{"type": "file", "path": n, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                            for n, b in files.items()]
                    return self._send(200, {"Content-Type": "application/json"}, json.dumps(tree).encode(), body)
                name = m.group(3)
                if name not in files:
                    return self._send(404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": SHA}, b"", body)
                data = files[name]
                self._send(200, {"X-Repo-Commit": SHA, "ETag": f'"{hashlib.sha1(data).hexdigest()}"'}, data, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def fetched(self) -> set[str]:
        return {p.split("/resolve/", 1)[1].split("/", 1)[1] for _, p, _ in self.requests if "/resolve/" in p}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hub(monkeypatch, tmp_path):
    h = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    yield h
    h.close()


def _run(*argv) -> int:
    return dl.main(list(argv))


def test_downloads_complete_folder_that_loads(hub, tiny_repo, tmp_path, capsys):
    from ssd.models.loader import load_model
    hub.repos["HuggingFaceTB/Tiny-Llama"] = tiny_repo
    assert _run("HuggingFaceTB/Tiny-Llama", "--models-dir", str(tmp_path)) == 0, capsys.readouterr().err
    folder = tmp_path / "tiny-llama"
    wanted = {n for n in tiny_repo if n not in DECOYS}
    assert {p.name for p in folder.iterdir() if p.is_file()} == wanted
    for n in wanted:
        assert (folder / n).read_bytes() == tiny_repo[n], n
    assert not hub.fetched() & set(DECOYS), "decoy files (.bin/.gguf/onnx/sub-folders) must never be requested"
    model = load_model(folder)
    assert model.cfg.num_layers == 2 and model.cfg.vocab_size == 128
    assert "ready at" in capsys.readouterr().out
    # A rerun finds every file complete and downloads nothing again.
    before = len([r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]])
    assert _run("HuggingFaceTB/Tiny-Llama", "--models-dir", str(tmp_path)) == 0
    after = len([r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]])
    assert after - before <= 1  # at most config.json, fetched again for the architecture check


def test_name_token_and_revision_are_passed(hub, tiny_repo, tmp_path, monkeypatch):
    hub.repos["org/M"] = tiny_repo
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    assert _run("org/M", "--models-dir", str(tmp_path), "--name", "mine", "--revision", "v1") == 0
    assert (tmp_path / "mine" / "config.json").is_file()
    assert all(auth == "Bearer hf_from_env" for _, _, auth in hub.requests)
    assert ("GET", "/api/models/org/M/revision/v1", "Bearer hf_from_env") in hub.requests
    hub.requests.clear()
    assert _run("org/M", "--models-dir", str(tmp_path), "--name", "mine", "--token", "hf_flag") == 0
    assert hub.requests and all(auth == "Bearer hf_flag" for _, _, auth in hub.requests)


@pytest.mark.parametrize("cfg_patch, found", [
    ({"architectures": ["MistralForCausalLM"], "model_type": "mistral"}, "MistralForCausalLM"),
    ({"architectures": ["LlamaForCausalLM"], "hidden_act": "gelu"}, "gelu"),
])
def test_unsupported_architecture_refused_before_weights(hub, tiny_repo, tmp_path, capsys, cfg_patch, found):
    cfg = json.loads(tiny_repo["config.json"]) | cfg_patch
    hub.repos["org/Other"] = tiny_repo | {"config.json": json.dumps(cfg).encode()}
    assert _run("org/Other", "--models-dir", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "not a supported model" in err and found in err
    assert "LlamaForCausalLM" in err and "Qwen3ForCausalLM" in err
    assert hub.fetched() == {"config.json"}, "only config.json may be requested before the check"
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize("value", ["1", "true"])
def test_offline_fails_at_once(hub, tiny_repo, tmp_path, capsys, monkeypatch, value):
    hub.repos["org/M"] = tiny_repo
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    t0 = time.monotonic()
    assert _run("org/M", "--models-dir", str(tmp_path)) == 2
    assert time.monotonic() - t0 < 2
    err = capsys.readouterr().err
    assert "cannot be reached" in err and "HF_HUB_OFFLINE=0" in err
    assert hub.requests == []


def test_unreachable_hub(hub, tmp_path, capsys, monkeypatch):
    hub.close()  # nothing listens on that port any more
    t0 = time.monotonic()
    assert _run("org/M", "--models-dir", str(tmp_path)) == 2
    assert time.monotonic() - t0 < 5
    err = capsys.readouterr().err
    assert "cannot be reached" in err and hub.url in err
    hub.close = lambda: None


@pytest.mark.parametrize("status, headers, token, expect", [
    (404, {"X-Error-Code": "RepoNotFound"}, None, "not found"),
    (401, {"X-Error-Code": "RepoNotFound"}, None, "--token or set HF_TOKEN"),
    (401, {"X-Error-Code": "GatedRepo", "X-Error-Message": "Access to model org/M is restricted."}, None,
     "gated repo"),
    (403, {"X-Error-Code": "GatedRepo", "X-Error-Message": "Access to model org/M is restricted."}, "hf_x",
     "licence"),
    (401, {"X-Error-Message": "Invalid credentials in Authorization header"}, "hf_bad", "rejected the token"),
])
def test_hub_refusals_give_clear_message(hub, tiny_repo, tmp_path, capsys, status, headers, token, expect):
    hub.repos["org/M"] = tiny_repo
    hub.errors["org/M"] = (status, headers)
    extra = ["--token", token] if token else []
    assert _run("org/M", "--models-dir", str(tmp_path), *extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "org/M" in err and expect in err, err
    assert "Traceback" not in err


def test_unknown_repo(hub, tmp_path, capsys):
    assert _run("nobody/none", "--models-dir", str(tmp_path)) == 2
    assert "repo nobody/none not found" in capsys.readouterr().err


def test_repo_without_safetensors_refused(hub, tiny_repo, tmp_path, capsys):
    only_bin = {n: b for n, b in tiny_repo.items() if not n.endswith(".safetensors") and "index" not in n}
    hub.repos["org/Bin"] = only_bin
    assert _run("org/Bin", "--models-dir", str(tmp_path)) == 2
    assert "no *.safetensors" in capsys.readouterr().err


def test_folder_name_rules():
    assert dl.folder_name("Qwen/Qwen3-0.6B") == "qwen3-0.6b"
    assert dl.folder_name("Qwen/Qwen3-0.6B", "q") == "q"
    for bad in ("..", "a/b", ""):
        with pytest.raises(dl.DownloadError):
            dl.folder_name("x/y", bad)


def test_module_entry_point_offline(tmp_path):
    import os
    import subprocess
    import sys
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    r = subprocess.run([sys.executable, "-m", "ssd.models.download", "Qwen/Qwen3-0.6B", "--models-dir",
                        str(tmp_path)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "HF_HUB_OFFLINE=0" in r.stderr, r.stderr
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_broken_tokenizer_refused(hub, tiny_repo, tmp_path, capsys):
    hub.repos["org/Tok"] = tiny_repo | {"tokenizer.json": b"{not json"}
    assert _run("org/Tok", "--models-dir", str(tmp_path)) == 2
    assert "tokenizer does not load" in capsys.readouterr().err
