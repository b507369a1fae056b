"""Structured output under speculation: a constrained greedy SD and SSD output equals constrained AR token for token
(every verified position is masked to the grammar along the drafted tokens, so drafted tokens outside it are
rejected), the outputs parse against their schema or pattern and end with EOS where the grammar ends, and a bad
grammar is refused naming the constraint."""
import json
import re

import jsonschema
import pytest

from ssd.constraints import Constraint, grammar_for
from ssd.engine.ar import AREngine
from ssd.engine.speculative import SpecConfig, SpeculativeEngine
from ssd.models.loader import load_model
from ssd.sampling import SamplingParams
from ssd.tokenizer import Tokenizer

TOKENS, MAX_LEN = 24, 256
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                           "population": {"type": "integer", "minimum": 0, "maximum": 99999999}},
          "required": ["city", "population"], "additionalProperties": False}
CASES = [("Give the capital of France and its population as JSON.", Constraint("json_schema", json.dumps(SCHEMA))),
         ("Is the sky blue? Answer yes or no.", Constraint("regex", "(yes|no)")),
         ("Describe a cat as a JSON object.", Constraint("json_object"))]


@pytest.fixture(scope="module")
def pair(default_models):
    tok = Tokenizer.from_folder(default_models["target"])
    target = load_model(default_models["target"])
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p, _ in CASES]
    grammar = grammar_for(default_models["target"], target.cfg.vocab_size)()
    return target, load_model(default_models["draft"]), prompts, tok, grammar


def params() -> list[SamplingParams]:
    return [SamplingParams(max_tokens=TOKENS, constraint=c) for _, c in CASES]


@pytest.fixture(scope="module")
def reference(pair):
    target, _, prompts, _, grammar = pair
    return AREngine(target, max_batch=len(prompts), max_len=MAX_LEN, grammar_tokenizer=grammar).generate(prompts,
                                                                                                         params())


def test_constrained_ar_output_parses_and_ends_with_eos_where_the_grammar_ends(pair, reference):
    tok = pair[3]
    for seq in reference[:2]:   # the bounded cases finish inside the token budget, with EOS
        assert seq.output[-1] in tok.eos_token_ids, tok.decode(seq.output)
    texts = [tok.decode(s.output[:-1]) for s in reference[:2]]
    jsonschema.validate(json.loads(texts[0]), SCHEMA)
    assert re.fullmatch("(yes|no)", texts[1])
    assert tok.decode(reference[2].output).lstrip().startswith("{")   # a free object runs past 24 tokens


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_constrained_greedy_speculation_equals_constrained_ar(pair, reference, mode):
    target, draft, prompts, _, grammar = pair
    engine = SpeculativeEngine(target, draft, SpecConfig(mode=mode, k=3, budget=4), max_batch=len(prompts),
                               max_len=MAX_LEN, grammar_tokenizer=grammar)
    assert [s.output for s in engine.generate(prompts, params())] == [s.output for s in reference]
    assert engine.stats.rounds > 0 and sum(engine.stats.accepted) > 0   # drafted tokens were verified and kept


def test_a_bad_schema_or_regex_is_refused_naming_the_constraint():
    with pytest.raises(ValueError, match="invalid json_schema"):
        Constraint("json_schema", json.dumps({"type": 3})).validate()
    with pytest.raises(ValueError, match="invalid regex"):
        Constraint("regex", "(").validate()
    with pytest.raises(ValueError, match="constraint.kind"):
        Constraint("yaml")
