"""Service settings: flag > environment > --config file > default; bad settings are named."""
import json
import subprocess
import sys

import pytest

from services.draft.service import DraftConfig
from services.router.service import RouterConfig
from ssd.service_config import load_config


def test_precedence_flag_env_file_default(tmp_path):
    cfg_file = tmp_path / "draft.toml"
    cfg_file.write_text('k = 5\nmax_seqs = 3\nfanout = [2, 2, 1, 1, 1, 1]\nlog_level = "DEBUG"\n')
    env = {"SSD_DRAFT_MAX_SEQS": "7", "SSD_DRAFT_LOG_LEVEL": "WARNING"}
    cfg = load_config(DraftConfig, ["--config", str(cfg_file), "--log-level", "ERROR"], "draft", env=env)
    assert cfg.k == 5                      # file
    assert cfg.max_seqs == 7               # env beats file
    assert cfg.log_level == "ERROR"        # flag beats env
    assert cfg.fanout == (2, 2, 1, 1, 1, 1)
    assert cfg.max_len == 0                # default: the model's own context


def test_lists_and_json_files(tmp_path):
    f = tmp_path / "router.json"
    f.write_text(json.dumps({"drafts": ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"], "mode": "sd"}))
    cfg = load_config(RouterConfig, ["--config", str(f)], "router", env={})
    assert cfg.drafts == ("tcp://127.0.0.1:1", "tcp://127.0.0.1:2") and cfg.mode == "sd"
    cfg = load_config(RouterConfig, ["--drafts", "tcp://127.0.0.1:9"], "router", env={})
    assert cfg.drafts == ("tcp://127.0.0.1:9",)


def test_unknown_file_key_and_bad_value_are_named(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("maxseqs = 3\n")
    with pytest.raises(ValueError, match="unknown setting 'maxseqs'"):
        load_config(DraftConfig, ["--config", str(f)], "draft", env={})
    with pytest.raises(ValueError, match="setting k"):
        load_config(DraftConfig, ["--k", "three"], "draft", env={})


def test_router_without_workers_fails_with_a_clear_message(default_models):
    out = subprocess.run([sys.executable, "-m", "ssd.cli", "router", "--ready-timeout", "2", "--grpc-address",
                          "127.0.0.1:0", "--http-address", "", "--target", "tcp://127.0.0.1:1",
                          "--drafts", "tcp://127.0.0.1:2"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "no Ready from target at tcp://127.0.0.1:1, draft at tcp://127.0.0.1:2" in out.stderr
    assert "is the worker running" in out.stderr
