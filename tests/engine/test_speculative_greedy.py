"""Greedy SD and SSD produce exactly the AR engine's tokens, whatever K, fan-out, backup or draft quality."""
import pytest

from ssd import wire
from ssd.engine.ar import AREngine
from ssd.engine.speculative import SpecConfig, SpeculativeEngine
from ssd.models.loader import load_model
from ssd.sampling import SamplingParams
from ssd.spec.fanout import geometric_fanout
from ssd.tokenizer import Tokenizer

from ssd.prompts import PROMPTS


@pytest.fixture(scope="module")
def pair(default_models):
    tok = Tokenizer.from_folder(default_models["target"])
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p in PROMPTS]
    return load_model(default_models["target"]), load_model(default_models["draft"]), prompts


def ar_outputs(pair, n_prompts: int, max_tokens: int) -> list[list[int]]:
    """AR outputs of the first n prompts (EOS ignored, so every position is compared)."""
    target, _, prompts = pair
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return [s.output for s in AREngine(target, max_batch=n_prompts).generate(prompts[:n_prompts], params)]


@pytest.fixture(scope="module")
def reference(pair):
    """AR outputs: 64 tokens for each of the first 10 prompts (what the CI tests compare against)."""
    return ar_outputs(pair, 10, 64)


@pytest.fixture(scope="module")
def full_reference(pair):
    """AR outputs: 128 tokens for each of the 20 prompts (the slow full-length runs)."""
    return ar_outputs(pair, len(pair[2]), 128)


def run(pair, spec, n_prompts, max_tokens, draft=None):
    target, small, prompts = pair
    engine = SpeculativeEngine(target, draft or small, spec, max_batch=n_prompts)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return [s.output for s in engine.generate(prompts[:n_prompts], params)], engine


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_ten_prompts_64_tokens_equal_ar(pair, reference, mode):
    outputs, engine = run(pair, SpecConfig(mode=mode, k=3, budget=4), 10, 64)
    assert outputs == reference
    assert engine.stats.rounds > 0 and sum(engine.stats.accepted) > 0
    assert mode == "sd" or engine.stats.cache.get("hit", 0) > 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_twenty_prompts_128_tokens_equal_ar(pair, full_reference, mode):
    outputs, engine = run(pair, SpecConfig(mode=mode, k=3, budget=4), 20, 128)
    assert outputs == full_reference
    assert engine.stats.rounds > 0


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_the_routers_adaptive_k_and_fan_out_keep_output_equal_to_ar(pair, reference, mode):
    """The round core's adaptive K (per batch from measured costs, with probe and explore rounds at other K) and,
    in ssd, its online fan-out, as the router runs them: K varies between rounds, the tokens do not."""
    outputs, engine = run(pair, SpecConfig(mode=mode, k=3, adaptive=True, adaptive_fanout=mode == "ssd"), 6, 48)
    assert outputs == [r[:48] for r in reference[:6]]
    assert engine.stats.rounds > 0 and sum(engine.stats.accepted) > 0
    assert engine.core.planner.adaptive, "the adaptive policy did not run"


@pytest.mark.parametrize("k", [1, 2])
def test_chains_as_deep_as_the_next_rounds_k_keep_output_equal_to_ar(pair, reference, k):
    """ssd with the adaptive choice held at K = 1 or 2 from the cache (the draft's K is 3): each round's DraftRound
    asks for chains of that depth, the draft grows only those, rounds hit them, and the tokens stay AR's."""
    target, small, prompts = pair
    engine = SpeculativeEngine(target, small, SpecConfig(mode="ssd", k=3, adaptive=True), max_batch=3)
    planner, worker = engine.core.planner, engine.draft
    planner.choice["ssd"], planner.adaptive["ssd"].cached, planner.adaptive["ssd"].explore_every = k, True, 0
    planner.adapt = lambda batch: None
    depths, grown = [], []
    speculate = worker.speculate

    def recorded(items, fanouts=None, depths_=None):
        depths.extend((depths_ or {}).values())
        out = speculate(items, fanouts, depths_)
        grown.extend(len(e.tokens) for entries in out.values() for e in entries)
        return out
    worker.speculate = recorded
    outputs = [s.output for s in engine.generate(prompts[:3], SamplingParams(max_tokens=24, ignore_eos=True))]
    assert outputs == [r[:24] for r in reference[:3]]
    assert depths and set(depths) == {k} and grown and max(grown) == k
    assert engine.stats.cache.get("hit", 0) > 0 and sum(engine.stats.accepted) > 0


MATRIX = [(k, backup, fan) for k in (1, 3, 5) for backup in ("jit", "ngram", "none", "auto")
          for fan in ("uniform", "geometric")]
CI_MATRIX = [(1, "jit", "uniform"), (1, "ngram", "uniform"), (1, "none", "uniform"), (3, "jit", "uniform"),
             (3, "jit", "geometric"), (3, "ngram", "geometric"), (3, "none", "geometric"),
             (3, "auto", "geometric"), (5, "jit", "geometric"), (5, "ngram", "uniform"), (5, "none", "uniform")]


def spec_for(k, backup, fan):
    fanout = geometric_fanout(k, 3 * (k + 1), a=0.6, r=0.5) if fan == "geometric" else None
    return SpecConfig(mode="ssd", k=k, fanout=fanout, budget=3 * (k + 1), backup=backup)


@pytest.mark.parametrize("k,backup,fan", CI_MATRIX)
def test_ssd_matrix_equals_ar(pair, reference, k, backup, fan):
    outputs, engine = run(pair, spec_for(k, backup, fan), 3, 24)
    assert outputs == [r[:24] for r in reference[:3]]
    assert engine.stats.backups  # the backup path ran (the first round after prefill is a forced miss)


@pytest.mark.slow
@pytest.mark.parametrize("k,backup,fan", MATRIX)
def test_ssd_matrix_full_length_equals_ar(pair, full_reference, k, backup, fan):
    outputs, _ = run(pair, spec_for(k, backup, fan), 20, 128)
    assert outputs == full_reference


def test_draft_equal_to_target_hits_the_cache_and_stays_exact(pair, reference):
    """With the target as its own draft nearly every outcome is anticipated: the hit path carries the run."""
    target = pair[0]
    outputs, engine = run(pair, SpecConfig(mode="ssd", k=3, budget=4), 3, 48, draft=target)
    assert outputs == [r[:48] for r in reference[:3]]
    stats = engine.stats
    assert stats.hit_rate > 0.5
    assert stats.acceptance_rate > 0.8
    assert stats.tokens_per_round > 2.5


def test_stats_account_for_every_token(pair, reference):
    outputs, engine = run(pair, SpecConfig(mode="ssd", k=3), 4, 32)
    stats = engine.stats
    assert stats.tokens == sum(len(o) - 1 for o in outputs)  # all but each prefill token came from a round
    assert stats.cache["forced"] == 4
    assert sum(stats.cache.values()) == stats.rounds + 4 - 4  # one lookup per round, minus the finishing ones


class LateDraftEngine(SpeculativeEngine):
    """The services' order at its worst: every verify's outcome is applied before the entries the draft published
    during it, so every drafted round finds the draft late and waits for them (`RoundCore.resolve_wait`)."""

    def _flush(self):
        handles = [self.draft_handle, self.target_handle]
        delivered = [h.deliver() for h in handles]
        for h in reversed(handles):
            for msg in h.replies():
                self.core.on_message(h, msg)
        return any(delivered), any(isinstance(m, wire.Verify) for m in delivered[1])


def test_late_outcomes_that_wait_for_the_drafts_entries_keep_output_equal_to_ar(pair, reference):
    target, small, prompts = pair
    engine = LateDraftEngine(target, small, SpecConfig(mode="ssd", k=3, budget=4), max_batch=4)
    outputs = [s.output for s in engine.generate(prompts[:4], SamplingParams(max_tokens=64, ignore_eos=True))]
    assert outputs == [r[:64] for r in reference[:4]]
    st = engine.stats
    assert sum(st.accepted) > 0, "no drafted token was accepted: the comparison above proves nothing"
    assert st.cache.get("hit", 0) == 0 and st.cache["late"] > 0   # no outcome found its entries there at once
    assert st.waits.get("hit", 0) > 0 and st.waits.get("no_entry", 0) > 0   # rounds ran from both after the wait
    assert sum(st.waits.values()) == st.cache["late"]
