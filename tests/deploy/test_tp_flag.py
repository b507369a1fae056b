"""--tp-size: a setting the chart passes; sizes that cannot run are refused at start, before anything loads."""
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from services.draft.service import DraftConfig, draft_role
from services.target.service import TargetConfig, target_role
from ssd.service_config import load_config
from ssd.worker.service import run_worker


def test_tp_size_is_a_setting_with_default_one():
    assert load_config(TargetConfig, [], "target", env={}).tp_size == 1
    assert load_config(TargetConfig, ["--tp-size", "2"], "target", env={}).tp_size == 2
    assert load_config(TargetConfig, [], "target", env={"SSD_TARGET_TP_SIZE": "4"}).tp_size == 4


@pytest.mark.parametrize("size, message", [(0, "--tp-size must be at least 1, got 0"),
                                           (4, "tensor parallel size 4 exceeds num_key_value_heads = 2")])
def test_run_worker_refuses_sizes_that_cannot_run_before_loading(tiny_llama_dir, caplog, size, message):
    with caplog.at_level(logging.ERROR):
        cfg = TargetConfig(tp_size=size)
        code = run_worker(cfg, target_role(cfg, tiny_llama_dir))
    assert code == 2
    assert message in caplog.text


def test_tp_is_for_the_target_only(tiny_llama_dir, caplog):
    with caplog.at_level(logging.ERROR):
        cfg = DraftConfig(tp_size=2)
        code = run_worker(cfg, draft_role(cfg, tiny_llama_dir))
    assert code == 2
    assert "is for the target" in caplog.text


def test_ssd_target_with_tp_size_zero_exits_2_with_the_message():
    proc = subprocess.run([sys.executable, "-m", "ssd.cli", "target", "--tp-size", "0",
                           "--model", "/nonexistent/model", "--control-address", "127.0.0.1:0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--tp-size must be at least 1, got 0" in proc.stderr
