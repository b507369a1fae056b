"""No pickle anywhere: the data plane is msgpack with typed decoding, and nothing else may unpickle either.

Code, not prose, is checked: imports and calls of pickle and its relatives, and torch.save / torch.load (whose
file format is pickle; tensors travel as safetensors, results as JSON).
"""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PICKLE = re.compile(r"^\s*(import|from)\s+(c?pickle|_pickle|dill|cloudpickle|shelve|marshal|joblib)\b"
                    r"|\b(c?pickle|dill|cloudpickle|shelve|marshal|joblib)\.\w+\("
                    r"|\btorch\.(load|save)\(|allow_pickle\s*=\s*True|read_pickle|to_pickle")


def test_no_pickle_in_the_tree():
    hits = []
    for folder in ("ssd", "services", "bench", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == Path(__file__).resolve():
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if PICKLE.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not hits, "pickle-like serialisation found:\n" + "\n".join(hits)
