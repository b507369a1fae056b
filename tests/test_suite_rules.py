"""The suite's own rules (tests/conftest.py): its models folder is not the user's, and under CI=true a skip fails
unless CUDA is what is missing."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

SKIPPING = '''
import pytest

def test_needs_a_service():
    pytest.skip("redis-server is not installed")

@pytest.mark.skipif(True, reason="needs a CUDA device")
def test_needs_cuda():
    pass

def test_plain():
    pass
'''


def _run(tmp_path, ci: str | None):
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_rules.py").write_text(SKIPPING)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["SSD_TEST_MODELS_DIR"] = str(tmp_path / "models")
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "--rootdir",
                           str(tmp_path), str(tmp_path / "test_rules.py")], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=120)


def test_under_ci_a_skip_for_a_missing_service_fails_and_one_for_cuda_stays_a_skip(tmp_path):
    out = _run(tmp_path, "true")
    assert out.returncode == 1, out.stdout
    assert "FAILED test_rules.py::test_needs_a_service" in out.stdout
    assert "redis-server is not installed" in out.stdout
    assert "1 failed, 1 passed, 1 skipped" in out.stdout


def test_outside_ci_both_skip(tmp_path):
    out = _run(tmp_path, None)
    assert out.returncode == 0, out.stdout
    assert "1 passed, 2 skipped" in out.stdout


def test_the_suite_models_folder_is_not_the_users():
    folder = Path(os.environ["SSD_MODELS_DIR"]).resolve()
    assert folder != (Path.home() / ".cache" / "ssd" / "models").resolve()
    if not os.environ.get("SSD_TEST_MODELS_DIR"):
        assert folder.name.startswith("ssd-test-models-")
