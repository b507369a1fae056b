"""Tools through the real stack over HTTP (the openai client): with tool_choice auto (the default) the model
answers either text or (pushed by a logit bias towards a call's first token) a call, parsed by the openai types as
`tool_calls`; streamed, the client's accumulated deltas are the same text or call as the whole response, and ar and
ssd agree (greedy); a named call streams as tool_call deltas; tool_choice none answers plain text."""
import json

import jsonschema
import openai
import pytest

from ssd.tokenizer import Tokenizer

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string", "maxLength": 12}},
                                                           "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=f"http://{stack.http_address}/v1", api_key="unused", max_retries=0, timeout=300)


def _accumulate(stream):
    content, name, args, finish = "", "", "", None
    for c in stream:
        delta = c.choices[0].delta
        content += delta.content or ""
        for t in delta.tool_calls or ():
            name += t.function.name or ""
            args += t.function.arguments or ""
        finish = c.choices[0].finish_reason or finish
    return content, name, args, finish


@pytest.fixture(scope="module")
def brace(default_models):
    """The token a call starts with in json.dumps's layout ('{"'): a logit bias on it makes the tiny model, which
    answers this question in text, take auto's call branch."""
    return Tokenizer.from_folder(default_models["target"]).encode('{"name"')[0]


@pytest.mark.parametrize("call", [False, True], ids=["text", "call"])
def test_auto_answers_text_or_a_call_the_same_whole_streamed_and_in_ar_and_ssd(client, brace, call):
    model = client.models.list().data[0].id
    outs = []
    for mode in ("ar", "ssd"):
        ask = dict(model=model, messages=ASK, tools=[WEATHER], max_tokens=24, temperature=0,
                   logit_bias={str(brace): 5} if call else None, extra_body={"speculation": {"mode": mode}})
        whole = client.chat.completions.create(**ask).choices[0]
        streamed = _accumulate(client.chat.completions.create(**ask, stream=True))
        if call:
            (tc,) = whole.message.tool_calls
            assert whole.finish_reason == "tool_calls" and whole.message.content is None
            assert tc.function.name == "get_weather" and tc.id.startswith("call_")
            jsonschema.validate(json.loads(tc.function.arguments), WEATHER["function"]["parameters"])
            outs.append(("", tc.function.name, tc.function.arguments, "tool_calls"))
        else:
            assert whole.message.tool_calls is None and whole.finish_reason in ("stop", "length")
            assert whole.message.content and not whole.message.content.startswith("{")
            outs.append((whole.message.content, "", "", whole.finish_reason))
        assert streamed == outs[-1]
    assert outs[0] == outs[1]


def test_a_named_call_streams_as_tool_call_deltas(client):
    model = client.models.list().data[0].id
    ask = dict(model=model, messages=ASK, tools=[WEATHER], max_tokens=24, temperature=0,
               tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (call,) = client.chat.completions.create(**ask).choices[0].message.tool_calls
    content, name, args, finish = _accumulate(client.chat.completions.create(**ask, stream=True))
    assert (content, name, args, finish) == ("", "get_weather", call.function.arguments, "tool_calls")


def test_tool_choice_none_answers_text(client):
    out = client.chat.completions.create(model=client.models.list().data[0].id, messages=ASK, tools=[WEATHER],
                                         tool_choice="none", max_tokens=8, temperature=0)
    assert out.choices[0].message.tool_calls is None and out.choices[0].finish_reason in ("stop", "length")
