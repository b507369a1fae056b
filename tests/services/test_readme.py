"""The README's Python examples run as written (against a real stack)."""
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_examples_run(stack, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README has Python examples"
    for code in blocks:
        exec(compile(code.replace("127.0.0.1:50051", stack.grpc_address), "README.md", "exec"), {})
    assert capsys.readouterr().out.strip()
