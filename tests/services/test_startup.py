"""Start-up checks: a draft whose tokenizer differs from the target's is refused with a clear message."""
import json
import shutil

import pytest

from ssd.cli.launcher import Stack, StackConfig


def test_draft_with_other_tokenizer_is_refused(default_models, tmp_path):
    odd = tmp_path / "odd-draft"
    shutil.copytree(default_models["draft"], odd)
    tok = json.loads((odd / "tokenizer.json").read_text())
    tok["added_tokens"].append({"id": 49152, "content": "<|odd|>", "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": True})
    (odd / "tokenizer.json").write_text(json.dumps(tok))
    stack = Stack(StackConfig(mode="ssd", draft_model=odd, log_dir=tmp_path / "logs"))
    with pytest.raises(RuntimeError, match="did not become ready"):
        stack.start(timeout=120)
    assert stack.procs["router"].returncode == 2
    log = (tmp_path / "logs" / "router.log").read_text()
    assert "a draft must share the target's tokenizer" in log
    assert "odd-draft" in log
