"""The compressed signature (IR): a short, deterministic text form of a tool that a model can call it from.

    get_weather(city: str, unit?: "c"|"f"=c) — current weather for a city

- every top-level parameter in declaration order, required ones first; `?` marks optional ones;
- types abbreviated (str, int, num, bool, any), arrays as `[T]`, enums as `"a"|"b"` (at most MAX_ENUM values,
  then `|…`), defaults as `=value` (scalars only);
- nested objects flattened as `{field: T, opt?: T}` up to NEST_DEPTH levels, then `{…}`;
- the first clause of the description, at most DESC_WORDS words.
The same tool always gives the same text (no set iteration, no randomness), so it can be cached and hashed.
"""

from __future__ import annotations

import json
import re
from typing import Any

from registry.model import Tool

MAX_ENUM = 5
NEST_DEPTH = 2
DESC_WORDS = 4
TYPE_NAMES = {"string": "str", "integer": "int", "number": "num", "boolean": "bool", "null": "null", "object": "obj"}
_CLAUSE_END = re.compile(r"(?<=[a-z0-9)\]])[.;:!?](\s|$)|\s[-–—(]\s?|,\s(?:and|or|which|that|including)\s|\n")


_FILLER = {"a", "an", "the", "specified", "given", "provided", "specific", "certain"}
_DANGLING = {"to", "for", "of", "on", "at", "in", "by", "with", "from", "and", "or", "all", "about", "into", "based"}


def compress(tool: Tool) -> str:
    """The IR of `tool` (see the module docstring)."""
    params = _params(tool.input_schema, depth=0)
    head = f"{tool.name}({params})"
    clause = first_clause(tool.description)
    return f"{head} — {clause}" if clause else head


def first_clause(description: str, max_words: int = DESC_WORDS) -> str:
    """The description up to its first sentence or clause break, at most `max_words` words, lower-cased first
    letter; '' for an empty description."""
    text = " ".join(description.split())
    if not text:
        return ""
    m = _CLAUSE_END.search(text)
    if m:
        text = text[: m.start()].strip()
    words = [w for w in text.split(" ") if w.lower() not in _FILLER][:max_words]
    while len(words) > 1 and words[-1].lower().strip(",;:") in _DANGLING:
        words.pop()
    out = " ".join(words).rstrip(",;:")
    if len(out) > 1 and out[0].isupper() and not out[1].isupper():
        out = out[0].lower() + out[1:]
    return out


def _params(schema: dict[str, Any], depth: int) -> str:
    props = schema.get("properties") or {}
    if not isinstance(props, dict):
        props = {}
    required = [r for r in (schema.get("required") or []) if isinstance(r, str)]
    order = [r for r in required if r in props] + [p for p in props if p not in required]
    parts = [_param(name, props[name], name in required, depth) for name in order]
    # Required names that the schema lists but does not describe still have to appear.
    parts += [f"{name}: any" for name in required if name not in props]
    return ", ".join(parts)


def _param(name: str, spec: Any, required: bool, depth: int) -> str:
    spec = spec if isinstance(spec, dict) else {}
    kind = type_text(spec, depth)
    default = spec.get("default")
    has_default = not required and _is_scalar(default) and default not in ("None", "none", "")
    if has_default and kind in (_scalar_type(default), "str"):
        return f"{name}={_scalar(default)}"  # the default shows the type
    enum = spec.get("enum")
    if has_default and isinstance(enum, list) and default in enum:  # default first: `unit=c|f`
        rest = [v for v in enum if v != default]
        return f"{name}=" + type_text({**spec, "enum": [default, *rest]}, depth)
    text = name if required else f"{name}?"
    if kind != "str":
        text += f": {kind}"
    if has_default:
        text += "=" + _scalar(default)
    return text


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) and value is not None


def _scalar_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    return "num" if isinstance(value, float) else "str"


def type_text(spec: dict[str, Any], depth: int = 0) -> str:
    """The abbreviated type of one JSON Schema."""
    if "enum" in spec and isinstance(spec["enum"], list) and spec["enum"]:
        values = [_scalar(v) for v in spec["enum"][:MAX_ENUM]]
        return "|".join(values) + ("|…" if len(spec["enum"]) > MAX_ENUM else "")
    if "const" in spec:
        return json.dumps(spec["const"], ensure_ascii=False)
    for key in ("anyOf", "oneOf"):
        if isinstance(spec.get(key), list) and spec[key]:
            alts = [type_text(s, depth) for s in spec[key] if isinstance(s, dict)]
            return "|".join(dict.fromkeys(alts)) or "any"
    kind = spec.get("type")
    if isinstance(kind, list):
        return "|".join(TYPE_NAMES.get(k, str(k)) for k in kind if k != "null") or "null"
    if kind == "array":
        items = spec.get("items")
        return f"[{type_text(items, depth) if isinstance(items, dict) else 'any'}]"
    if kind == "object" or (kind is None and "properties" in spec):
        if not spec.get("properties"):
            return "obj"
        if depth + 1 >= NEST_DEPTH:
            return "{…}"
        return "{" + _params(spec, depth + 1) + "}"
    return TYPE_NAMES.get(kind, "any") if isinstance(kind, str) or kind is None else "any"


_KEYWORDS = {"true", "false", "null", "any", "str", "int", "num", "bool", "obj"}


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if re.fullmatch(r"[A-Za-z_][\w.\-/]{0,23}", value) and value not in _KEYWORDS \
            else json.dumps(value[:24], ensure_ascii=False)
    return json.dumps(value)


def required_names_present(tool: Tool, ir: str | None = None) -> bool:
    """Whether every required top-level parameter name appears in the IR as a parameter (`name:` / `name?:`)."""
    ir = compress(tool) if ir is None else ir
    return all(re.search(rf"[({{ ]{re.escape(name)}(?=[:?=,)}}])", ir) for name in tool.required)


def ir_stats(tools: list[Tool], tokenizer=None) -> dict[str, float | int]:
    """IR statistics: `tools`, `median_tokens` (SmolLM2 tokens unless another tokenizer with `.encode` is
    given), `p90_tokens`, `max_tokens`, and `required_coverage` (share of tools whose required parameter
    names all appear in the IR, 0..1)."""
    import statistics

    if tokenizer is None:
        from native.tokenizer import load_tokenizer

        tokenizer = load_tokenizer()
    if not tools:
        return {"tools": 0, "median_tokens": 0, "p90_tokens": 0, "max_tokens": 0, "required_coverage": 1.0}
    irs = [compress(t) for t in tools]
    lengths = sorted(len(tokenizer.encode(ir)) for ir in irs)
    covered = sum(required_names_present(t, ir) for t, ir in zip(tools, irs))
    return {
        "tools": len(tools),
        "median_tokens": statistics.median(lengths),
        "p90_tokens": lengths[min(len(lengths) - 1, int(0.9 * len(lengths)))],
        "max_tokens": lengths[-1],
        "required_coverage": covered / len(tools),
    }
