"""Tool calls over HTTP, through the real aiohttp app over a fake core that streams a scripted output: the grammar
`tool_choice` auto builds takes exactly a call or text that does not start with `{`; a call answers `tool_calls`,
whole and streamed (the openai client's stream accumulates to the whole response's call); text answers content;
a call cut by max_tokens comes back as text with `length`. And guided_choice's grammar takes exactly its strings."""
from __future__ import annotations

import json

import llguidance
import pytest

from ssd.constraints import Constraint, grammar_tokenizer
from services.router.openai_structured import choice_grammar
from services.router.openai_tools import tool_call
from tests.services.http_fakes import MODEL, openai_client, served, tok  # noqa: F401 (fixtures)

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}}}
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture
def client(served):
    served[1].script = None
    return openai_client(served.port)


def test_the_auto_grammar_takes_a_call_or_text_that_does_not_start_like_one(default_models, tok):
    call = tool_call({"messages": MESSAGES, "tools": [WEATHER]})
    assert call.auto and call.constraint.kind == "lark" and "get_weather" in call.messages[0]["content"]
    lt = grammar_tokenizer(default_models["target"], tok.vocab_size, tuple(tok.eos_token_ids))

    def takes(text: str) -> bool:
        m = llguidance.LLMatcher(lt, call.constraint.grammar(), log_level=0)
        return m.consume_tokens(tok.encode(text)) and not m.is_error() and m.is_accepting()

    assert takes(CALL) and takes("It is sunny.") and takes(" {not a call}") and takes("")
    assert not takes('{"name":"get_weather","arguments":{"city":"Paris"}}')   # not json.dumps's layout
    assert not takes('{"name": "get_time", "arguments": {}}') and not takes("{hello")
    assert tool_call({"messages": MESSAGES, "tools": [WEATHER], "tool_choice": "required"}).constraint.kind == \
        "json_schema"
    assert tool_call({"messages": MESSAGES, "tools": [WEATHER], "tool_choice": "none"}) is None


def _stream(client, **kw):
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER], stream=True,
                                                 **kw))
    name, args, ids, content = "", "", set(), ""
    for c in chunks[1:]:
        delta = c.choices[0].delta
        content += delta.content or ""
        for t in delta.tool_calls or ():
            assert t.index == 0
            ids |= {t.id} if t.id else set()
            name += (t.function.name or "") if t.function else ""
            args += (t.function.arguments or "") if t.function else ""
    return chunks, name, args, ids, content


@pytest.mark.parametrize("choice", ["auto", "required", None])
def test_a_call_answers_tool_calls_whole_and_streamed(client, served, tok, choice):
    served[1].script = tok.encode(CALL)
    kw = {} if choice is None else {"tool_choice": choice}
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER], max_tokens=64, **kw)
    (call,) = whole.choices[0].message.tool_calls
    assert whole.choices[0].finish_reason == "tool_calls" and whole.choices[0].message.content is None
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    chunks, name, args, ids, content = _stream(client, max_tokens=64, **kw)
    assert chunks[0].choices[0].delta.role == "assistant" and content == ""
    first = chunks[1].choices[0].delta.tool_calls[0]
    assert first.id and first.type == "function" and first.function.name == "get_weather"
    assert (name, args) == (call.function.name, call.function.arguments) and len(ids) == 1
    assert [c.choices[0].finish_reason for c in chunks][-1] == "tool_calls"
    assert chunks[-1].model_extra["ssd"]["finish_reason"] == "eos"


def test_text_under_auto_answers_content_whole_and_streamed(client, served, tok):
    served[1].script = tok.encode("It is sunny in Paris.")
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER], max_tokens=64)
    assert whole.choices[0].message.content == "It is sunny in Paris." and whole.choices[0].message.tool_calls is None
    assert whole.choices[0].finish_reason == "stop"
    chunks, name, args, ids, content = _stream(client, max_tokens=64)
    assert content == "It is sunny in Paris." and not name and not ids
    assert len([c for c in chunks if c.choices[0].delta.content]) > 1   # streamed as it came, not held to the end
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_call_cut_by_max_tokens_is_text_with_length(client, served, tok):
    served[1].script = tok.encode(CALL)
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER], max_tokens=5)
    assert whole.choices[0].finish_reason == "length" and whole.choices[0].message.tool_calls is None
    assert CALL.startswith(whole.choices[0].message.content)
    chunks, name, args, ids, content = _stream(client, max_tokens=5)
    assert content == whole.choices[0].message.content and not ids
    assert chunks[-1].choices[0].finish_reason == "length"


def test_the_guided_choice_grammar_is_exactly_its_strings(default_models, tok):
    options = ["yes", 'say "no"', "a|b", "back\\slash\nnewline", "café ☕", "/re/"]
    grammar = choice_grammar(options, "guided_choice")
    lt = grammar_tokenizer(default_models["target"], tok.vocab_size, tuple(tok.eos_token_ids))

    def takes(text: str) -> bool:
        m = llguidance.LLMatcher(lt, Constraint("lark", grammar).grammar(), log_level=0)
        return m.consume_tokens(tok.encode(text)) and not m.is_error() and m.is_accepting()

    assert all(takes(o) for o in options)
    assert not any(takes(t) for t in ["ye", "yesno", "a", "b", 'say "no', "/re", ""])


def test_each_of_n_streamed_choices_is_its_own_call_with_its_tokens_logprobs(client, served, tok):
    served[1].script = tok.encode(CALL)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER], stream=True, n=2,
                                                 logprobs=True, max_tokens=64))
    for i in range(2):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == i]
        args = "".join(t.function.arguments or "" for c in mine for t in c.delta.tool_calls or ())
        assert json.loads(args) == {"city": "Paris"} and mine[-1].finish_reason == "tool_calls"
        assert sum(len(c.logprobs.content) for c in mine if c.logprobs) == len(served[1].script)


def test_a_call_cut_by_a_stop_string_is_text_not_an_error(client, served, tok):
    served[1].script = tok.encode(CALL)
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER], max_tokens=64,
                                           tool_choice="required", stop=["Paris"])
    assert whole.choices[0].message.content == CALL[:CALL.index("Paris")] and whole.choices[0].finish_reason == "stop"
    chunks, name, args, ids, content = _stream(client, max_tokens=64, stop=["Paris"])
    assert content == whole.choices[0].message.content and not ids
