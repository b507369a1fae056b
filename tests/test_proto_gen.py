import re
import shutil
import subprocess
import sys
from pathlib import Path

from ssd import proto_gen

REPO = Path(__file__).resolve().parents[1]


def test_regeneration_changes_nothing():
    run = subprocess.run([sys.executable, "-m", "ssd.proto_gen", "--check"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


def test_stubs_import_within_the_package():
    for name, text in proto_gen.generate().items():
        assert not re.search(r"ssd\.v1( import |\.\w+_pb2)|^import \w+_pb2", text, flags=re.M), name
    assert "from ssd.pb import worker_pb2" in (proto_gen.OUT_DIR / "worker_pb2_grpc.py").read_text()


def test_a_stub_edited_by_hand_is_detected(tmp_path, capsys):
    out = tmp_path / "pb"
    shutil.copytree(proto_gen.OUT_DIR, out, ignore=shutil.ignore_patterns("__pycache__"))
    stub = out / "worker_pb2.py"
    data = bytearray(stub.read_bytes())
    data[-2] = ord("X") if data[-2] != ord("X") else ord("Y")
    stub.write_bytes(bytes(data))

    assert proto_gen.main(["--check", "--out", str(out)]) == 1
    assert "changed: worker_pb2.py" in capsys.readouterr().err


def test_missing_and_stray_files_are_detected_and_write_repairs_them(tmp_path, capsys):
    out = tmp_path / "pb"
    shutil.copytree(proto_gen.OUT_DIR, out, ignore=shutil.ignore_patterns("__pycache__"))
    (out / "worker_pb2.pyi").unlink()
    (out / "old_pb2.py").write_text("# left over from a deleted proto\n")

    assert proto_gen.main(["--check", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "missing: worker_pb2.pyi" in err and "unexpected: old_pb2.py" in err

    assert proto_gen.write(out) == ["old_pb2.py", "worker_pb2.pyi"]
    assert proto_gen.diff(out) == []
