"""Teacher data (`ssd.distill.data`): the rows kept per token, and the prompts it answers."""
import torch

from ssd.distill.data import DataConfig, generate_shard
from ssd.distill.prompts import training_prompts
from ssd.models.loader import load_model
from ssd.prompts import PROMPTS
from ssd.tokenizer import Tokenizer


def test_a_shard_keeps_one_row_per_token_for_the_final_and_the_extra_layers(default_models):
    target = load_model(default_models["target"])
    tok = Tokenizer.from_folder(default_models["target"])
    last = target.cfg.num_layers - 1
    items = [(0, "chat", "Say hello."), (1, "math", "What is 2 + 3?")]
    shard = generate_shard(target, tok, items, DataConfig(max_new_tokens=6, batch=2, extra_layers=(1, last)))
    rows = int(shard["tokens"].numel()) - len(items)       # every token but each sequence's last
    for name in ("features", "features_l1", f"features_l{last}"):
        assert shard[name].shape == (rows, target.cfg.hidden_size) and shard[name].dtype == torch.float16
    # the last layer's output is the final norm's input: the hooks read the rows the engine computed
    assert torch.equal(shard[f"features_l{last}"], shard["features"])
    assert not torch.equal(shard["features_l1"], shard["features"])


def test_training_prompts_are_many_distinct_and_never_the_held_out_ones():
    prompts = training_prompts(6000, seed=0)
    texts = [t for _, t in prompts]
    assert len(set(texts)) == len(texts) == 6000
    assert not set(texts) & set(PROMPTS)
    assert {k for k, _ in prompts} == {"code", "chat", "math"}
    assert training_prompts(50, seed=0) == prompts[:50]   # a resumed run answers the same prompts


def _answers(shard) -> list[list[int]]:
    off = shard["offsets"].tolist()
    return [shard["tokens"][a + p:b].tolist() for a, b, p in zip(off, off[1:], shard["prompt_lens"].tolist())]


def test_a_sampled_answer_is_fixed_by_its_index_whatever_answers_beside_it(default_models):
    """Every third prompt is answered at temperature 1 from a stream seeded by its index (not the
    position-keyed noise, which costs a vocabulary of CPU random numbers per row and step): the same index gives
    the same answer alone or in a batch, and another seed gives another answer."""
    target = load_model(default_models["target"])
    tok = Tokenizer.from_folder(default_models["target"])
    sampled = (5, "chat", "Write one sentence about the sea.")
    others = [(3, "math", "What is 7 * 8?"), (4, "code", "Write a Python function that adds two numbers.")]
    cfg = DataConfig(max_new_tokens=24, batch=4, extra_layers=())
    alone = _answers(generate_shard(target, tok, [sampled], cfg))[0]
    beside = _answers(generate_shard(target, tok, [*others, sampled], cfg))[2]
    assert alone == beside
    greedy = _answers(generate_shard(target, tok, [sampled], DataConfig(max_new_tokens=24, sampled_every=0,
                                                                        extra_layers=())))[0]
    reseeded = [_answers(generate_shard(target, tok, [sampled], DataConfig(max_new_tokens=24, seed=s,
                                                                             extra_layers=())))[0] for s in (1, 2)]
    assert alone != greedy or any(r != alone for r in reseeded)   # it samples: some seed leaves the greedy path
    assert reseeded[0] != reseeded[1] or reseeded[0] != alone
