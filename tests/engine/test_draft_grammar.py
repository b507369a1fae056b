"""The draft steered by a request's grammar (`ssd.engine.draft_grammar`): every token it proposes for a
constrained sequence (JIT steps, SSD forks and branch chains; greedy, sampled and coupled) lies inside the grammar
the target will mask to, a sampled proposal's q has no mass outside it, and the same draft without a grammar
tokenizer proposes tokens outside it (so the checks can fail). Through the shared round core: steering raises the
accepted drafts of constrained greedy SD and SSD and leaves the output equal to constrained AR. Also the grammar
state's masks past the grammar's end (EOS drafted again after the end), which the target's verify meets once
drafts are steered."""
import numpy as np
import pytest

from ssd.constraints import Constraint, Matcher, grammar_for
from ssd.engine.ar import AREngine
from ssd.engine.draft import DraftParams, DraftWorker
from ssd.engine.speculative import SpecConfig, SpeculativeEngine
from ssd.models.loader import load_model
from ssd.sampling import SamplingParams
from ssd.tokenizer import Tokenizer

PATTERN = Constraint("regex", "[0-9]{3}-[A-Z]{3}-[0-9]{3}")   # nothing a chat draft says on its own
PROMPT = "Tell me a short story about a dragon."
K, MAX_LEN = 3, 192


@pytest.fixture(scope="module")
def setup(default_models):
    tok = Tokenizer.from_folder(default_models["target"])
    target = load_model(default_models["target"])
    grammar = grammar_for(default_models["target"], target.cfg.vocab_size)()
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}]))
    return tok, target, load_model(default_models["draft"]), grammar, prompt


def inside(grammar, vocab: int, output: list[int], path: list[int]) -> bool:
    """Whether `path` continues `output` inside the grammar (up to and including an EOS where it may end)."""
    m = Matcher(grammar, PATTERN, vocab)
    m.commit(output)
    return m.mask_after(path) is not None or (bool(path) and m.mask_after(path[:-1]) is not None
                                               and m.mask_after(path[:-1])[path[-1]])


def drafted(worker: DraftWorker, prompt: list[int], output: list[int], params: DraftParams):
    """A JIT speculation and the SSD cache entries for it, for one constrained sequence."""
    worker.add(1, prompt + output, params, prompt_len=len(prompt))
    spec = worker.jit([1], K)[0]
    return spec, worker.speculate([(1, spec.tokens)])[1]


@pytest.mark.parametrize("params", [DraftParams(constraint=PATTERN),
                                    DraftParams(1.0, 0, seed=7, constraint=PATTERN),
                                    DraftParams(1.0, 0, seed=7, coupled=True, constraint=PATTERN)],
                         ids=["greedy", "sampled", "coupled"])
def test_every_drafted_token_lies_inside_the_grammar(setup, params):
    tok, target, draft, grammar, prompt = setup
    vocab = target.cfg.vocab_size
    output = tok.encode("12")   # the committed output so far: two digits of the first group
    worker = DraftWorker(draft, 2, MAX_LEN, K, [4] * (K + 1), grammar_tokenizer=grammar)
    spec, entries = drafted(worker, prompt, output, params)
    assert len(spec.tokens) == K and inside(grammar, vocab, output, spec.tokens)
    assert entries, "steered forks must remain"
    for e in entries:   # outcome (j, t*) and the chain that would follow it
        assert inside(grammar, vocab, output, spec.tokens[:e.accepted] + [e.token] + list(e.tokens)), e
    if params.temperature and not params.coupled:   # q travels: no mass outside the grammar
        m = Matcher(grammar, PATTERN, vocab)
        m.commit(output)
        for d, (ids, probs) in enumerate(spec.proposal):
            allowed = m.mask_after(spec.tokens[:d])
            assert allowed[ids].all() and abs(sum(probs) - 1) < 1e-3

    unsteered = DraftWorker(draft, 2, MAX_LEN, K, [4] * (K + 1))   # the control: no grammar tokenizer
    spec, entries = drafted(unsteered, prompt, output, params)
    assert not all(inside(grammar, vocab, output, spec.tokens[:e.accepted] + [e.token] + list(e.tokens)) for e in entries)


def test_steering_raises_acceptance_and_keeps_the_output_equal_to_ar(setup):
    tok, target, draft, grammar, prompt = setup
    params = [SamplingParams(max_tokens=12, constraint=PATTERN)]
    ar = AREngine(target, max_batch=1, max_len=MAX_LEN, grammar_tokenizer=grammar).generate([prompt], params)
    accepted = {}
    for mode in ("sd", "ssd"):
        for steered in (True, False):
            engine = SpeculativeEngine(target, draft, SpecConfig(mode=mode, k=K, budget=4), max_batch=1,
                                       max_len=MAX_LEN, grammar_tokenizer=grammar)
            if not steered:   # the draft's worker alone loses its grammar: the target still masks
                engine.draft._grammar = None
            assert [s.output for s in engine.generate([prompt], params)] == [s.output for s in ar]
            accepted[mode, steered] = sum(engine.stats.accepted)
            if steered and mode == "ssd":   # and the cache-hit path ran
                assert engine.stats.cache.get("hit", 0) > 0, engine.stats.cache
        assert accepted[mode, True] > accepted[mode, False], accepted


def test_masks_past_the_end_allow_eos_and_leave_the_state_intact(setup):
    tok, target, _, grammar, _ = setup
    vocab, eos = target.cfg.vocab_size, sorted(tok.eos_token_ids)[0]
    m = Matcher(grammar, Constraint("regex", "(yes|no)"), vocab)
    m.commit(tok.encode("yes"))   # the grammar has ended: only EOS may follow
    rows = m.masks([eos, eos, eos])
    assert rows.shape == (4, vocab) and (rows.sum(1) == 1).all() and rows[:, eos].all()
    assert m.mask_after([eos]) is None and np.array_equal(m.mask_after([]), rows[0])
    m.commit([eos])   # the state was left as it was: the EOS still commits


def test_seeded_constrained_sampling_is_the_same_in_every_mode(setup):
    """A seeded sampled constrained request (coupled draws, the draft steered and picking with the target's noise)
    returns the coupled constrained AR output in sd and ssd: exactness of the steered sampled path."""
    tok, target, draft, grammar, prompt = setup
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=12, constraint=PATTERN) for s in (3, 4)]
    ar = AREngine(target, max_batch=2, max_len=MAX_LEN, grammar_tokenizer=grammar).generate([prompt] * 2, params)
    assert all(s.params.coupled for s in ar)
    for mode in ("sd", "ssd"):
        engine = SpeculativeEngine(target, draft, SpecConfig(mode=mode, k=K, budget=4), max_batch=2,
                                   max_len=MAX_LEN, grammar_tokenizer=grammar)
        assert [s.output for s in engine.generate([prompt] * 2, params)] == [s.output for s in ar]
        assert sum(engine.stats.accepted) > 0
        assert mode == "sd" or engine.stats.cache.get("hit", 0) > 0, engine.stats.cache


def test_a_batch_mixing_steered_and_free_sequences_steers_only_the_constrained_one(setup):
    """The steered rows are proposed apart from the others, which keep their own path: the free sequence drafts
    what it drafts alone, the constrained one stays inside its grammar."""
    tok, target, draft, grammar, prompt = setup
    vocab, output = target.cfg.vocab_size, tok.encode("12")
    alone = DraftWorker(draft, 2, MAX_LEN, K, [4] * (K + 1), grammar_tokenizer=grammar)
    free_spec, free_entries = drafted(alone, prompt, output, DraftParams())
    worker = DraftWorker(draft, 2, MAX_LEN, K, [4] * (K + 1), grammar_tokenizer=grammar)
    worker.add(1, prompt + output, DraftParams(constraint=PATTERN), prompt_len=len(prompt))
    worker.add(2, prompt + output, DraftParams(), prompt_len=len(prompt))
    steered, free = worker.jit([1, 2], K)
    assert free.tokens == free_spec.tokens and inside(grammar, vocab, output, steered.tokens)
    entries = worker.speculate([(1, steered.tokens), (2, free.tokens)])
    assert [(e.accepted, e.token, e.tokens) for e in entries[2]] == \
        [(e.accepted, e.token, e.tokens) for e in free_entries]
    assert entries[1] and all(inside(grammar, vocab, output, steered.tokens[:e.accepted] + [e.token] + list(e.tokens))
                              for e in entries[1])
