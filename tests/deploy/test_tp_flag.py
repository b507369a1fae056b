"""--tp-size: accepted as a setting (the chart passes it), refused at start until tensor parallelism exists."""
import logging
import subprocess
import sys
from pathlib import Path

from services.target.service import TargetConfig
from ssd.service_config import load_config
from ssd.worker_service import run_worker

MESSAGE = "tensor parallelism (--tp-size 2) is not available yet in this build"


def test_tp_size_is_a_setting_with_default_one():
    assert load_config(TargetConfig, [], "target", env={}).tp_size == 1
    assert load_config(TargetConfig, ["--tp-size", "2"], "target", env={}).tp_size == 2
    assert load_config(TargetConfig, [], "target", env={"SSD_TARGET_TP_SIZE": "4"}).tp_size == 4


def test_run_worker_refuses_tp_before_loading_anything(caplog):
    cfg = TargetConfig(tp_size=2)
    with caplog.at_level(logging.ERROR):
        code = run_worker(cfg, "target", Path("/nonexistent/model"), build=None, handler_cls=None)
    assert code == 2
    assert MESSAGE in caplog.text


def test_ssd_target_with_tp_exits_2_with_the_message():
    proc = subprocess.run([sys.executable, "-m", "ssd.cli", "target", "--tp-size", "2",
                           "--model", "/nonexistent/model", "--control-address", "127.0.0.1:0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert MESSAGE in proc.stderr
