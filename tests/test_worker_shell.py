"""The worker shell (ssd/worker/) is role-agnostic: it imports no target or draft code (read with `ast`)."""
import ast
from pathlib import Path

SHELL = Path(__file__).resolve().parents[1] / "ssd" / "worker"
ROLE_CODE = ("ssd.engine.target", "ssd.engine.draft", "services")


def imported(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.update([node.module, *(f"{node.module}.{a.name}" for a in node.names)])
    return out


def test_the_shell_imports_no_role_code():
    files = sorted(SHELL.glob("*.py"))
    assert {f.name for f in files} >= {"__init__.py", "service.py", "io.py", "metrics.py"}
    bad = [f"{f.name} imports {name}" for f in files for name in sorted(imported(f)) if name.startswith(ROLE_CODE)]
    assert not bad, "\n".join(bad)
