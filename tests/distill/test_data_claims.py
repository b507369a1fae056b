"""Teacher data from several processes into one folder: each shard is claimed before it is answered, a shard
claimed by a live process is left to it, a claim whose process died is taken over, and no claim outlives its
shard (made or failed). The shard itself is faked: what is tested is which shards a run makes."""
import os
import subprocess
import sys

import pytest

import ssd.distill.data as data
from ssd.distill.data import DataConfig, claim_shard, generate, load_shards, shard_path
from tests.distill.shard_fakes import shard_tensors


@pytest.fixture
def fake_target(monkeypatch):
    made = []

    def fake_shard(model, tok, items, cfg):
        made.append(items[0][0] // cfg.shard_size)
        return shard_tensors(len(items))

    monkeypatch.setattr(data, "generate_shard", fake_shard)
    monkeypatch.setattr("ssd.models.loader.load_model", lambda *a, **k: None)
    monkeypatch.setattr(data.Tokenizer, "from_folder", staticmethod(lambda folder: None))
    return made


@pytest.fixture
def other_process():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_shard_claimed_by_a_live_process_is_left_to_it(fake_target, other_process, tmp_path):
    shard_path(tmp_path, 1).with_suffix(".claim").write_text(str(other_process.pid))
    generate("unused", tmp_path, DataConfig(prompts=8, shard_size=2), log=lambda *a: None)
    assert fake_target == [0, 2, 3]
    assert [p.name for p in sorted(tmp_path.iterdir())] == [
        "shard-00000.safetensors", "shard-00001.claim", "shard-00002.safetensors", "shard-00003.safetensors"]


def test_a_dead_process_claim_is_taken_over(fake_target, other_process, tmp_path):
    claim = shard_path(tmp_path, 1).with_suffix(".claim")
    claim.write_text(str(other_process.pid))
    other_process.kill()
    other_process.wait()
    generate("unused", tmp_path, DataConfig(prompts=8, shard_size=2), log=lambda *a: None)
    assert fake_target == [0, 1, 2, 3]
    assert len(load_shards(tmp_path)) == 4 and not list(tmp_path.glob("*.claim"))


def test_a_claim_being_written_counts_as_held(tmp_path):
    path = shard_path(tmp_path, 0)
    path.with_suffix(".claim").write_text("")      # created, its pid not written yet
    assert not claim_shard(path)


def test_claims_are_exclusive_and_the_holder_may_reclaim(other_process, tmp_path):
    path = shard_path(tmp_path, 0)
    assert claim_shard(path) and claim_shard(path)
    assert path.with_suffix(".claim").read_text() == str(os.getpid())
    held = shard_path(tmp_path, 1)
    held.with_suffix(".claim").write_text(str(other_process.pid))
    assert not claim_shard(held)


def test_a_failed_shard_releases_its_claim(monkeypatch, tmp_path):
    def broken(model, tok, items, cfg):
        raise RuntimeError("out of KV")

    monkeypatch.setattr(data, "generate_shard", broken)
    monkeypatch.setattr("ssd.models.loader.load_model", lambda *a, **k: None)
    monkeypatch.setattr(data.Tokenizer, "from_folder", staticmethod(lambda folder: None))
    with pytest.raises(RuntimeError, match="out of KV"):
        generate("unused", tmp_path, DataConfig(prompts=4, shard_size=2), log=lambda *a: None)
    assert list(tmp_path.iterdir()) == []
