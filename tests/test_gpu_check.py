"""bench/gpu_check.sh picks an interpreter with torch, says so where there is no GPU, and fails where it has no
torch; its Python side parses and its smoke path runs on the CPU."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_check.sh"


def _run(env_python: str | None, cwd=ROOT):
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    if env_python is not None:
        env["PYTHON"] = env_python
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA exit")
def test_gpu_check_with_torch_but_no_cuda_exits_zero_and_says_so():
    out = _run(sys.executable)
    assert out.returncode == 0, out.stderr
    assert "no CUDA device" in out.stdout and torch.__version__ in out.stdout


def test_gpu_check_with_an_interpreter_without_torch_fails(tmp_path):
    fake = tmp_path / "python-without-torch"
    fake.write_text("#!/bin/sh\n"   # the same interpreter with torch hidden from it
                    f"if [ \"$1\" = -c ]; then exec {sys.executable} -c \"import sys; sys.modules['torch'] = None\n$2\"; fi\n"
                    f"exec {sys.executable} \"$@\"\n")
    fake.chmod(0o755)
    out = _run(str(fake))
    assert out.returncode == 1
    assert "cannot import torch" in out.stderr


def test_gpu_check_python_parses():
    ast.parse((ROOT / "bench" / "gpu_check.py").read_text())


def test_gpu_check_smoke_runs_on_cpu(tmp_path):
    """The whole script on tiny configs on the CPU (no graphs): the two-process SSD equals AR."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--smoke", "--device", "cpu",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "== gpu_check ==" in out.stdout
    assert (tmp_path / "gpu_check_smoke.json").is_file()
