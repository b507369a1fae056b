"""Load a script of bench/ as a module, for the tests of its pure parts."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    """bench/<name>.py, executed as module `name` (its `if __name__ == "__main__"` part does not run)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
