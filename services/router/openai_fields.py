"""The pieces every OpenAI body parser shares: typed field access that names the field in its ValueError, the
check of a nested object's keys, and chat messages. No torch here."""
from __future__ import annotations

import math

NUMBER, INT, BOOL, STR, LIST, OBJECT, STOP = (int, float), (int,), (bool,), (str,), (list,), (dict,), (str, list)
WHAT = {NUMBER: "a number", INT: "an integer", BOOL: "a boolean", STR: "a string", LIST: "a list",
        OBJECT: "an object", STOP: "a string or a list of strings", (dict, str): "an object or a string"}
MESSAGE_FIELDS = frozenset({"role", "content"})
MESSAGE_UNSUPPORTED = frozenset({"name", "tool_calls", "tool_call_id", "function_call", "refusal", "audio"})


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def same(a, b) -> bool:
    """Equal and of the same JSON type (True is not 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def get(obj: dict, key: str, types: tuple, default=None, param: str | None = None):
    """obj[key] checked against `types` (None or absent: `default`); ValueError naming `param or key`."""
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types) or \
            (isinstance(value, float) and not math.isfinite(value)):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ValueError(f"{param or key}: must be {WHAT[types]}, got {shown}")
    return value


def check_object(obj: dict, fields, where: str) -> None:
    for name, value in obj.items():
        allowed = fields.get(name, ()) if isinstance(fields, dict) else None
        if name in fields and (allowed is None or value is None or any(same(value, v) for v in allowed)):
            continue
        raise ValueError(f"{where}.{name}: " + ("not supported by this server" if name in fields else
                                                "unknown field"))


def messages(items: list | None) -> list:
    """Chat messages as {role, content} with text content parts joined into one string; the rest is for
    Frontend.build to judge."""
    if items is None:
        raise ValueError("messages: is required, as a list of {role, content} objects")
    out = []
    for i, m in enumerate(items):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}]: needs a string role and a content")
        for name, value in m.items():
            if name not in MESSAGE_FIELDS and value is not None:
                raise ValueError(f"messages[{i}].{name}: " + ("not supported by this server"
                                                              if name in MESSAGE_UNSUPPORTED else "unknown field"))
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       and set(p) == {"type", "text"} for p in content):
                raise ValueError(f"messages[{i}].content: only text parts ({{type: text, text}}) are supported")
            content = "".join(p["text"] for p in content)
        out.append({"role": m["role"], "content": content})
    return out
