"""Structured output fields of an OpenAI or vLLM body -> the `Constraint` the output follows. No torch here.

OpenAI's `response_format` (text, json_object, json_schema); vLLM's `guided_json` (a schema, as an object or its
JSON text), `guided_regex` (a pattern the whole output matches), `guided_choice` (a list of strings: the output is
exactly one of them), `guided_grammar` (an llguidance lark grammar) and `structured_outputs`, vLLM's newer object
`{json | regex | choice | grammar | json_object}` with one of them set. At most one field per request. Each
grammar is compiled here, so a bad schema, pattern, choice list or grammar is a 400 naming its field.
"""
from __future__ import annotations

import json

from ssd.constraints import MAX_TEXT, Constraint
from services.router.openai_fields import BOOL, LIST, OBJECT, STR, check_object, get

FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs")
RESPONSE_FORMAT = {"type": None, "json_schema": None}
JSON_SCHEMA = {"name": None, "schema": None, "strict": None, "description": None}
# structured_outputs: the honoured keys (at most one set), and vLLM's others, refused unless null
OUTPUTS = ("json", "regex", "choice", "grammar", "json_object")
OUTPUTS_REFUSED = ("structural_tag", "whitespace_pattern", "disable_fallback", "disable_any_whitespace",
                   "disable_additional_properties")
MAX_CHOICES = 1024


def constraint(body: dict) -> Constraint | None:
    """The constraint of the one structured-output field `body` gives (None: none, or response_format text);
    ValueError naming the field (both fields when two are given)."""
    given = [name for name in FIELDS if body.get(name) is not None]
    if len(given) > 1:
        raise ValueError(f"{given[1]}: cannot be used with {given[0]} (at most one structured-output field)")
    if not given:
        return None
    name = given[0]
    if name == "response_format":
        found, name = _response_format(get(body, name, OBJECT))
    elif name == "structured_outputs":
        found, name = _structured_outputs(get(body, name, OBJECT))
    else:
        found = _guided(name[len("guided_"):], body, name, name)
    if found is None:
        return None
    try:
        found.validate()
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None
    return found


def _guided(kind: str, obj: dict, key: str, name: str) -> Constraint:
    """vLLM's guided_<kind> (obj[key]; `name` in errors): json, regex, choice or grammar."""
    if kind == "json":
        schema = get(obj, key, (dict, str), param=name)
        return Constraint("json_schema", schema if isinstance(schema, str) else json.dumps(schema))
    if kind == "choice":
        return Constraint("lark", choice_grammar(get(obj, key, LIST, param=name), name))
    text = get(obj, key, STR, param=name)
    if len(text) > MAX_TEXT:
        raise ValueError(f"{name}: at most {MAX_TEXT} characters")
    return Constraint("regex" if kind == "regex" else "lark", text)


def choice_grammar(options: list, name: str) -> str:
    """A lark grammar whose language is exactly these strings (each a JSON-escaped lark string literal)."""
    if not options or len(options) > MAX_CHOICES or not all(isinstance(o, str) for o in options):
        raise ValueError(f"{name}: must be a list of 1..{MAX_CHOICES} strings")
    grammar = "start: " + " | ".join(json.dumps(o, ensure_ascii=False) for o in dict.fromkeys(options))
    if len(grammar) > MAX_TEXT:
        raise ValueError(f"{name}: at most {MAX_TEXT} characters in all")
    return grammar


def _response_format(fmt: dict) -> tuple[Constraint | None, str]:
    check_object(fmt, RESPONSE_FORMAT, "response_format")
    kind = get(fmt, "type", STR, None, "response_format.type")
    if kind == "text":
        return None, "response_format"
    if kind == "json_object":
        return Constraint("json_object"), "response_format"
    if kind != "json_schema":
        raise ValueError(f"response_format.type: must be text, json_object or json_schema, got {kind!r}")
    spec = get(fmt, "json_schema", OBJECT, None, "response_format.json_schema")
    if spec is None:
        raise ValueError("response_format.json_schema: is required with type json_schema")
    check_object(spec, JSON_SCHEMA, "response_format.json_schema")
    get(spec, "name", STR, None, "response_format.json_schema.name")
    get(spec, "strict", BOOL, None, "response_format.json_schema.strict")
    schema = get(spec, "schema", OBJECT, None, "response_format.json_schema.schema")
    if schema is None:
        raise ValueError("response_format.json_schema.schema: is required")
    return Constraint("json_schema", json.dumps(schema)), "response_format.json_schema.schema"


def _structured_outputs(spec: dict) -> tuple[Constraint | None, str]:
    check_object(spec, {**{k: None for k in OUTPUTS}, **{k: () for k in OUTPUTS_REFUSED}}, "structured_outputs")
    given = [k for k in OUTPUTS if spec.get(k) is not None]
    if len(given) > 1:
        raise ValueError(f"structured_outputs.{given[1]}: cannot be used with structured_outputs.{given[0]} "
                         f"(give one of {', '.join(OUTPUTS)})")
    if not given:
        raise ValueError(f"structured_outputs: give one of {', '.join(OUTPUTS)}")
    key, name = given[0], f"structured_outputs.{given[0]}"
    if key == "json_object":
        return (Constraint("json_object") if get(spec, key, BOOL, param=name) else None), name
    return _guided(key, spec, key, name), name
