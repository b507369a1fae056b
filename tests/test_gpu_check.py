"""bench/gpu_check.sh is safe where there is no GPU, and its Python side parses."""
import ast
import subprocess
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA exit")
def test_gpu_check_exits_zero_quickly_without_cuda():
    t0 = time.monotonic()
    out = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "no CUDA device" in out.stdout
    assert time.monotonic() - t0 < 60


def test_gpu_check_python_parses():
    ast.parse((ROOT / "bench" / "gpu_check.py").read_text())


def test_gpu_check_smoke_runs_on_cpu(tmp_path):
    """The whole script on tiny configs on the CPU (no graphs): the two-process SSD equals AR."""
    out = subprocess.run(["python", str(ROOT / "bench" / "gpu_check.py"), "--smoke", "--device", "cpu",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "== gpu_check ==" in out.stdout
    assert (tmp_path / "gpu_check_smoke.json").is_file()
