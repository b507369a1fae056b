"""OpenAI function tools on chat: `tools` and `tool_choice` -> the messages with the tools described to the model
and the constraint its output follows, and the way back from that output to OpenAI's `tool_calls`. No torch.

SmolLM2's chat template has no tools, so they are described in a system message. A call is the JSON object
`{"name": <a tool's name>, "arguments": <its parameters' schema>}` in `JSON_LAYOUT` (json.dumps's). With
`tool_choice` `required` or a named function the output is constrained to exactly a call (a `json_schema`
constraint); with `auto` (the default with tools) to a lark grammar of either a call or free text that does not
start with `{`, so the first character of the output says which it is, and a finished output that starts with
`{` is a whole call. `none` offers no tools: the request is an ordinary chat.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from ssd.constraints import JSON_LAYOUT, Constraint
from services.router.openai_structured import FIELDS as STRUCTURED_FIELDS
from services.router.openai_fields import LIST, OBJECT, STR, check_object, get, messages

REQUIRED_PROMPT = ("You can call the following functions. Answer with one call, as a JSON object "
                   '{{"name": <function name>, "arguments": <its arguments>}} and nothing else.\n{tools}')
AUTO_PROMPT = ("You can call the following functions. To call one, answer with only a JSON object "
               '{{"name": <function name>, "arguments": <its arguments>}}; otherwise answer in plain text.\n{tools}')
# free text that does not start like a call (empty included), or a call
AUTO_GRAMMAR = 'start: TEXT? | call\nTEXT: /[^{{](.|\\n)*/\ncall: %json {schema}\n'


@dataclass(slots=True)
class ToolCall:
    messages: list        # the chat with the tools described in a system message
    constraint: Constraint
    auto: bool            # the model may answer in text instead


def tool_call(body: dict) -> ToolCall | None:
    """The tool call a chat body asks for, or None (no tools, or tool_choice none); ValueError naming the field."""
    tools = get(body, "tools", LIST, [])
    choice = body.get("tool_choice")
    if not tools:
        if choice not in (None, "none"):
            raise ValueError("tool_choice: needs tools")
        return None
    functions = _functions(tools)
    if choice == "none":
        return None
    for name in STRUCTURED_FIELDS:
        if body.get(name) is not None:
            raise ValueError(f"{name}: cannot be used with tools")
    if choice in (None, "auto", "required"):
        names = list(functions)
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict) \
            and choice["function"].get("name") in functions and set(choice) == {"type", "function"} \
            and set(choice["function"]) == {"name"}:
        names = [choice["function"]["name"]]
    else:
        raise ValueError("tool_choice: must be none, auto, required or {type: function, function: {name}} naming "
                         "a tool")
    auto = choice in (None, "auto")
    schema = call_schema({n: functions[n]["parameters"] for n in names})
    try:
        if auto:
            layout = {**schema, "x-guidance": JSON_LAYOUT}
            constraint = Constraint("lark", AUTO_GRAMMAR.format(schema=json.dumps(layout)))
        else:
            constraint = Constraint("json_schema", json.dumps(schema))
        constraint.validate()
    except ValueError as err:
        raise ValueError(f"tools: {err}") from None
    system = (AUTO_PROMPT if auto else REQUIRED_PROMPT).format(tools=json.dumps([functions[n] for n in names]))
    msgs = list(messages(get(body, "messages", LIST)))
    if msgs and msgs[0]["role"] == "system":
        msgs[0] = {"role": "system", "content": msgs[0]["content"] + "\n\n" + system}
    else:
        msgs.insert(0, {"role": "system", "content": system})
    return ToolCall(msgs, constraint, auto)


def _functions(tools: list) -> dict[str, dict]:
    functions = {}
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise ValueError(f"tools[{i}]: must be {{type: function, function: {{name, parameters}}}}")
        check_object(t, {"type": None, "function": None}, f"tools[{i}]")
        fn = t["function"]
        check_object(fn, {"name": None, "description": None, "parameters": None, "strict": None},
                     f"tools[{i}].function")
        name = get(fn, "name", STR, None, f"tools[{i}].function.name")
        if not name or name in functions:
            raise ValueError(f"tools[{i}].function.name: must be a non-empty name, each once")
        get(fn, "description", STR, None, f"tools[{i}].function.description")
        functions[name] = {"name": name, "description": fn.get("description") or "",
                           "parameters": get(fn, "parameters", OBJECT, {"type": "object"},
                                             f"tools[{i}].function.parameters")}
    return functions


def call_schema(parameters: dict[str, dict]) -> dict:
    """The JSON schema of a call of one of these functions (name -> its parameters' schema)."""
    calls = [{"type": "object", "properties": {"name": {"const": n}, "arguments": p},
              "required": ["name", "arguments"], "additionalProperties": False} for n, p in parameters.items()]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def as_call(text: str) -> dict | None:
    """The call a finished constrained output holds (OpenAI's `function`: {name, arguments as JSON text}), or None
    when it is text (auto's other branch, or a call a stop string cut short)."""
    if not text.startswith("{"):
        return None
    try:
        call = json.loads(text)
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or "arguments" not in call:
        return None
    return {"name": call["name"], "arguments": json.dumps(call["arguments"])}


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"
