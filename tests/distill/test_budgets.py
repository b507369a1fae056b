"""Wall-clock budgets of the distillation stages: teacher data stops before a shard that would end past its
budget (keeping the shards made), and the "minutes" schedule lays the learning rate's cosine over the training
budget instead of the step count. A fake clock: no timing in the test."""
import pytest

import ssd.distill.data as data
from ssd.distill.data import DataConfig, generate, load_shards
from ssd.distill.train import TrainConfig, _lr
from tests.distill.shard_fakes import shard_tensors


def test_teacher_data_keeps_the_shards_that_fit_its_budget(monkeypatch, tmp_path):
    clock = [1000.0]
    monkeypatch.setattr(data.time, "time", lambda: clock[0])

    def fake_shard(model, tok, items, cfg):   # each shard takes 10 s of the fake clock
        clock[0] += 10.0
        return shard_tensors(len(items))

    monkeypatch.setattr(data, "generate_shard", fake_shard)
    monkeypatch.setattr("ssd.models.loader.load_model", lambda *a, **k: None)
    monkeypatch.setattr(data.Tokenizer, "from_folder", staticmethod(lambda folder: None))
    # 10 prompts in shards of 2: five shards, but after two (20 s) a third would end at 30 s > 25 s
    generate("unused", tmp_path, DataConfig(prompts=10, shard_size=2, seconds=25), log=lambda *a: None)
    assert len(load_shards(tmp_path)) == 2
    # no budget: the run resumes and makes the rest
    generate("unused", tmp_path, DataConfig(prompts=10, shard_size=2), log=lambda *a: None)
    assert len(load_shards(tmp_path)) == 5


def test_the_minutes_schedule_decays_over_the_time_budget_not_the_steps():
    cfg = TrainConfig(lr=1e-3, warmup=10, steps=1_000_000, minutes=2.0, schedule="minutes")
    assert _lr(5, cfg, 0.0) == pytest.approx(1e-3 * 6 / 10)          # warmup is still counted in steps
    assert _lr(50, cfg, 0.0) == pytest.approx(1e-3)
    assert _lr(50, cfg, 60.0) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))
    assert _lr(50, cfg, 120.0) == pytest.approx(1e-4) == _lr(50, cfg, 500.0)
    steps = TrainConfig(lr=1e-3, warmup=10, steps=110)                # the default: over the steps
    assert _lr(60, steps, 1e6) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))


def test_an_unknown_schedule_is_refused():
    with pytest.raises(ValueError, match="schedule"):
        TrainConfig(schedule="epochs")


@pytest.mark.parametrize("bad", [{"depth": 0}, {"depth_decay": 0.0}, {"depth_decay": 1.5}])
def test_an_unroll_depth_or_decay_out_of_range_is_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        TrainConfig(**bad)
