"""Python functions as tools: `@tool` derives the JSON Schema from the signature and the description from the
docstring (its first paragraph; per-parameter text from a Google-style `Args:` section).

    @tool
    def convert(value: float, unit: Literal["m", "ft"] = "m") -> dict:
        '''Convert a length.

        Args:
            value: the length to convert
        '''

`convert.tool` is the validated `registry.model.Tool`; the function itself is unchanged and still callable.
The schema is closed (`additionalProperties: false`): the function takes exactly its named parameters, so a call
with any other key is invalid, and the schema says so before the call reaches the function.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from typing import Any, Callable, Literal

from registry.model import Tool

_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean"}


def tool(fn: Callable | None = None, *, name: str | None = None, description: str | None = None):
    """Decorate a function as a tool (with or without arguments). Sets `fn.tool` to its `Tool`."""

    def wrap(f: Callable) -> Callable:
        f.tool = function_tool(f, name=name, description=description)
        return f

    return wrap(fn) if fn is not None else wrap


def function_tool(fn: Callable, name: str | None = None, description: str | None = None) -> Tool:
    """The Tool for a plain function (see the module docstring). Raises ToolValidationError on a bad name,
    ValueError on a parameter kind a JSON call cannot supply (*args, **kwargs)."""
    summary, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
    hints = typing.get_type_hints(fn)
    props: dict[str, Any] = {}
    required: list[str] = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ValueError(f"tool {fn.__name__!r}: parameter *{p.name} cannot be given by a JSON call; name it")
        schema = type_schema(hints.get(p.name, Any))
        if p.name in arg_docs:
            schema["description"] = arg_docs[p.name]
        if p.default is p.empty:
            required.append(p.name)
        elif p.default is not None:
            schema["default"] = p.default
        props[p.name] = schema
    # closed: a function without **kwargs takes no other key (an open schema lets `f(x=1)` through to a TypeError)
    input_schema: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        input_schema["required"] = required
    return Tool.from_mcp({
        "name": name or fn.__name__,
        "description": description if description is not None else summary,
        "inputSchema": input_schema,
    })


def type_schema(hint: Any) -> dict[str, Any]:
    """JSON Schema for a Python annotation: str/int/float/bool, list[T], dict, Literal[...], Optional[T], Any."""
    if hint is Any or hint is inspect.Parameter.empty:
        return {}
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (list, tuple, set, frozenset) or hint in (list, tuple):
        item = type_schema(args[0]) if args else {}
        return {"type": "array", "items": item} if item else {"type": "array"}
    if origin is dict or hint is dict:
        return {"type": "object"}
    if origin in (typing.Union, types.UnionType):
        alts = [a for a in args if a is not type(None)]
        return type_schema(alts[0]) if len(alts) == 1 else {"anyOf": [type_schema(a) for a in alts]}
    raise ValueError(f"type {hint!r} has no JSON Schema mapping here; use str, int, float, bool, list, dict, Literal")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(first paragraph joined into one line, {param: description} from an `Args:` section)."""
    paragraphs = re.split(r"\n\s*\n", doc.strip())
    summary = " ".join(paragraphs[0].split()) if paragraphs and not paragraphs[0].startswith("Args:") else ""
    args: dict[str, str] = {}
    m = re.search(r"^Args:\s*\n((?:[ \t]+.*\n?)+)", doc, re.M)
    if m:
        for line in m.group(1).splitlines():
            pm = re.match(r"\s+(\w+)(?:\s*\([^)]*\))?:\s*(.+)", line)
            if pm:
                args[pm.group(1)] = pm.group(2).strip()
    return summary, args
