"""Scoring one call's arguments against BFCL's possible answers, by the rules of BFCL's AST checker (as the
data's README states them), so the numbers compare with BFCL's published ones.

An item scores 1 when every parameter the schema requires is present, every produced parameter appears in
`possible_answer`, every parameter left out has "" among its acceptable values, and every produced value has
the schema's type and matches one acceptable value (numbers by value; booleans exactly; strings after
`normalize`; lists element by element in order; objects key by key with the same rules).
"""

from __future__ import annotations

import json
import re
from typing import Any

_DROP = re.compile(r"[\s,./\-_*^]")


def normalize(s: str) -> str:
    """BFCL's string normalisation: lower-case, spaces and `, . / - _ * ^` removed, `'` read as `"`."""
    return _DROP.sub("", s.lower()).replace("'", '"')


def _type_ok(value: Any, schema: dict) -> bool:
    t = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(t, list):
        return any(_type_ok(value, {**schema, "type": x}) for x in t)
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t in ("number", "float"):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t == "string":
        return isinstance(value, str)
    if t == "boolean":
        return isinstance(value, bool)
    if t in ("array", "tuple"):
        return isinstance(value, list)
    if t in ("object", "dict"):
        return isinstance(value, dict)
    return True  # no type, or "any"


def _matches(value: Any, accepted: Any, schema: dict) -> bool:
    """Whether one produced value matches one acceptable value."""
    if isinstance(accepted, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(accepted, bool) and value == accepted
    if isinstance(accepted, (int, float)):
        return isinstance(value, (int, float)) and float(value) == float(accepted)
    if isinstance(accepted, str):
        return isinstance(value, str) and normalize(value) == normalize(accepted)
    if isinstance(accepted, list):
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        return (isinstance(value, list) and len(value) == len(accepted)
                and all(_matches(v, a, items) for v, a in zip(value, accepted)))
    if isinstance(accepted, dict):
        if not isinstance(value, dict):
            return False
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        return _object_ok(value, accepted, props, [])[0]
    return value == accepted


def _object_ok(value: dict, answer: dict, props: dict, required: list) -> tuple[bool, str]:
    """Key-by-key check of an object against {key: [acceptable values]} (the top level and nested objects)."""
    for key in required:
        if key not in value:
            return False, f"missing required {key!r}"
    for key, v in value.items():
        if key not in answer:
            return False, f"unexpected parameter {key!r}"
        sub = props.get(key) if isinstance(props.get(key), dict) else {}
        if not _type_ok(v, sub):
            return False, f"{key!r} has the wrong type ({type(v).__name__})"
        options = answer[key] if isinstance(answer[key], list) else [answer[key]]
        if not any(_matches(v, a, sub) for a in options if a != ""):
            return False, f"{key!r}={json.dumps(v)[:60]} matches no acceptable value"
    for key, options in answer.items():
        options = options if isinstance(options, list) else [options]
        if key not in value and "" not in options:
            return False, f"{key!r} left out but required by the answer"
    return True, ""


def score(arguments: dict | None, possible_answer: dict, schema: dict) -> tuple[bool, str]:
    """(correct, the first reason it is not) for one call's arguments."""
    if not isinstance(arguments, dict):
        return False, "no arguments"
    schema = schema if isinstance(schema, dict) else {}
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = [k for k in schema.get("required") or [] if isinstance(k, str)]
    return _object_ok(arguments, possible_answer, props, required)


def copyable(query: str, possible_answer: dict) -> bool:
    """Whether every value the answer needs is written in the query (the ceiling of pure copying): each
    parameter that cannot be left out has an acceptable value whose every leaf appears in the query (strings
    after `normalize`, numbers as written)."""
    q = normalize(query)
    numbers = {float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", query.replace(",", ""))}

    def leaf_ok(v: Any) -> bool:
        if isinstance(v, bool):
            return False
        if isinstance(v, (int, float)):
            return float(v) in numbers
        if isinstance(v, str):
            return bool(normalize(v)) and normalize(v) in q
        if isinstance(v, list):
            return all(leaf_ok(x) for x in v)
        if isinstance(v, dict):
            return all(any(leaf_ok(x) for x in (opts if isinstance(opts, list) else [opts]) if x != "")
                       or "" in (opts if isinstance(opts, list) else [opts]) for opts in v.values())
        return False

    for options in possible_answer.values():
        options = options if isinstance(options, list) else [options]
        if "" in options:
            continue
        if not any(leaf_ok(v) for v in options):
            return False
    return True
