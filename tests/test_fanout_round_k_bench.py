"""bench/fanout_round_k.py on the default pair, briefly: the split over a shorter round's own outcomes uses every fork
it asks for, the split over all K + 1 positions leaves some unused, and the outputs are the same."""
from ssd.models.loader import load_model
from ssd.tokenizer import Tokenizer
from tests.bench_scripts import load


def test_a_pinned_round_below_the_drafts_k_is_split_over_its_own_outcomes(default_models):
    bench = load("fanout_round_k")
    target, draft = load_model(default_models["target"]), load_model(default_models["draft"])
    tok = Tokenizer.from_folder(default_models["target"])
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": "Name three primes."}]))]
    pool, pool_out = bench.run(target, draft, prompts, 3, 1, "pool", 12)
    own, own_out = bench.run(target, draft, prompts, 3, 1, "round", 12)
    assert own_out == pool_out and len(own_out[0]) == 12
    assert own["forks_usable"] == own["forks_asked"] > 0
    assert pool["forks_usable"] < pool["forks_asked"]      # F_1 and F_2: positions a round of one token lacks
    for row in (pool, own):   # speculation happened: cache hits, and more than one token a round
        assert row["cache"].get("hit", 0) > 0 and row["tokens_per_round"] > 1
