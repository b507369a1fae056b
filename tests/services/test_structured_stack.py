"""Structured output through the real stack over HTTP (the openai client): a chat with response_format json_schema
returns the same JSON in ar and ssd (greedy), which parses and validates against the schema, and finishes
("stop") where the grammar ends; vLLM's guided_regex, guided_choice, guided_grammar and structured_outputs hold
too (the same output in ar and sd/ssd); a bad schema or pattern is a 400 naming the
field; over gRPC (the SDK) GenerateRequest.constraint does the same, INVALID_ARGUMENT naming it; the draft service
proposes within the grammar, so drafts of a pattern it would never write are accepted."""
import json
import re

import jsonschema
import openai
import pytest

from ssd.client import Client, InvalidRequestError
from tests.services.conftest import accepted_drafts

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                           "population": {"type": "integer", "minimum": 0, "maximum": 99999999}},
          "required": ["city", "population"], "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "Give the capital of France and its population as JSON."}]


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=f"http://{stack.http_address}/v1", api_key="unused", max_retries=0, timeout=300)


def test_json_schema_chat_parses_and_is_the_same_in_ar_and_ssd(client):
    model = client.models.list().data[0].id
    fmt = {"type": "json_schema", "json_schema": {"name": "capital", "schema": SCHEMA, "strict": True}}
    outs = [client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=24, temperature=0,
                                           response_format=fmt, extra_body={"speculation": {"mode": mode}})
            for mode in ("ar", "ssd")]
    assert outs[0].choices[0].message.content == outs[1].choices[0].message.content
    for out in outs:
        assert out.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)


def test_guided_regex_completion_matches_its_pattern(client):
    out = client.completions.create(model=client.models.list().data[0].id, prompt="Is the sky blue? Answer:",
                                    max_tokens=8, temperature=0,
                                    extra_body={"guided_regex": " (yes|no)", "speculation": {"mode": "sd"}})
    assert re.fullmatch(" (yes|no)", out.choices[0].text) and out.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 3}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"guided_regex": "("}, "guided_regex"),
])
def test_a_bad_constraint_is_a_400_naming_the_field(client, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=client.models.list().data[0].id, messages=MESSAGES, max_tokens=4,
                                       extra_body=body)
    assert e.value.param == param


def test_the_draft_service_is_steered_by_the_grammar(stack):
    """A pattern the draft would never write on its own: unsteered, every drafted token is rejected (0 accepted on
    this prompt in process); steered by the grammar on the draft service, SD at K=3 accepts drafts (5 in process:
    greedy SD rounds are the same through the stack, tests/services/test_round_parity.py)."""
    pattern = "[0-9]{3}-[A-Z]{3}-[0-9]{3}"
    with Client(stack.grpc_address, timeout=300) as client:
        out = client.generate([{"role": "user", "content": "Give me a product code."}], max_tokens=16, mode="sd",
                              k=3, constraint=("regex", pattern))
    assert re.fullmatch(pattern, out.text) and out.finish_reason == "eos"
    assert accepted_drafts([out]) >= 3, (out.text, out.stats)


def test_grpc_constraint_through_the_sdk(stack):
    with Client(stack.grpc_address, timeout=300) as client:
        out = client.generate(MESSAGES, max_tokens=24, mode="ssd", constraint=("json_schema", json.dumps(SCHEMA)))
        with pytest.raises(InvalidRequestError, match="constraint: invalid regex"):
            client.generate("Hi", max_tokens=4, constraint=("regex", "("))
    assert out.finish_reason == "eos"
    jsonschema.validate(json.loads(out.text), SCHEMA)


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string", "maxLength": 12}},
                                                           "required": ["city"], "additionalProperties": False}}}


def test_a_named_tool_choice_answers_tool_calls_that_the_openai_types_parse(client):
    out = client.chat.completions.create(
        model=client.models.list().data[0].id, max_tokens=24, temperature=0,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}], tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice.message.content
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=out.model, max_tokens=4, tools=[WEATHER], tool_choice="any",
                                       messages=[{"role": "user", "content": "Hi"}])
    assert e.value.param == "tool_choice"


CITIES = ["Paris", "London", "Berlin", "Madrid"]


def test_guided_choice_is_one_of_the_strings_and_the_same_in_ar_and_ssd(client):
    model = client.models.list().data[0].id
    outs = [client.chat.completions.create(model=model, messages=MESSAGES[:1], max_tokens=8, temperature=0,
                                           extra_body={"guided_choice": CITIES, "speculation": {"mode": mode}})
            for mode in ("ar", "ssd")]
    assert outs[0].choices[0].message.content == outs[1].choices[0].message.content
    assert all(o.choices[0].message.content in CITIES and o.choices[0].finish_reason == "stop" for o in outs)


def test_guided_grammar_and_structured_outputs_generate_their_language(client):
    model = client.models.list().data[0].id
    grammar = 'start: " The answer is " NUMBER "."\nNUMBER: /[0-9]{1,3}/'
    outs = [client.completions.create(model=model, prompt="What is 6 times 7?", max_tokens=12, temperature=0,
                                      extra_body={"guided_grammar": grammar, "speculation": {"mode": mode}})
            for mode in ("ar", "sd")]
    assert outs[0].choices[0].text == outs[1].choices[0].text
    assert re.fullmatch(r" The answer is [0-9]{1,3}\.", outs[0].choices[0].text), outs[0].choices[0].text
    outs = [client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0,
                                      extra_body={"structured_outputs": {"regex": " [A-Z][a-z]{2,8}"},
                                                  "speculation": {"mode": mode}}) for mode in ("ar", "sd")]
    assert outs[0].choices[0].text == outs[1].choices[0].text
    assert re.fullmatch(" [A-Z][a-z]{2,8}", outs[0].choices[0].text) and outs[0].choices[0].finish_reason == "stop"
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4, temperature=0,
                                          extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert chat.choices[0].message.content in ("yes", "no")
