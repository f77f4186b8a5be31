"""What the SLB needs from a tool, and the text it embeds for one.

The core takes plain tool records (`ToolEntry`) so it does not depend on the registry store: anything with
`name`, `description`, an input schema (`input_schema` or MCP's `inputSchema`) and optionally a
`schema_hash` becomes one via `as_entry()` (pydantic `registry.model.Tool`, MCP dicts, dataclasses).
A tool may carry example requests (`examples`): each becomes one more buffer row, embedded like a query.
Agent frameworks prefix tool names with their server's name (`time_get_current_time`, `mcp_git__git_log`);
`strip_server_prefixes` gives such entries a `label` without the prefix, which the routing texts use instead
of the name the client sent.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

# what `tool_text` embeds for a tool (see its docstring); compare them with `nexus eval routing --recipe ...`.
TEXT_RECIPES = ("name_desc", "name_desc_params", "schema")
DEFAULT_RECIPE = "schema"


@dataclass(frozen=True)
class ToolEntry:
    """One routable tool: name, description, JSON-schema `input_schema`, a content hash of those three (and of
    the label when there is one), example requests (one buffer row each; not part of the hash), and `label`:
    the name as the routing texts say it, "" for `name` itself (see `strip_server_prefixes`)."""

    name: str
    description: str = ""
    input_schema: dict = field(default_factory=dict)
    schema_hash: str = ""
    examples: tuple[str, ...] = ()
    label: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a tool needs a non-empty name")
        if not self.schema_hash:
            object.__setattr__(self, "schema_hash",
                               hash_tool(self.name, self.description, self.input_schema, self.label))

    @property
    def text_name(self) -> str:
        """The name the routing texts use: the label, or the name when there is none."""
        return self.label or self.name


def hash_tool(name: str, description: str, input_schema: dict, label: str = "") -> str:
    """sha256 hex of the canonical JSON of (name, description, input_schema), with the label appended when it
    differs from the name (the routing text changes with it, so the embedding keyed by this hash does too)."""
    content = [name, description or "", input_schema or {}] + ([label] if label and label != name else [])
    blob = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def as_entry(tool: Any) -> ToolEntry:
    """A ToolEntry from a registry `Tool`, an MCP tool dict, or anything with the same attributes."""
    if isinstance(tool, ToolEntry):
        return tool
    get = tool.get if isinstance(tool, dict) else (lambda k, d=None: getattr(tool, k, d))
    schema = get("input_schema") or get("inputSchema") or {}
    examples = get("examples") or ()
    return ToolEntry(str(get("name")), get("description") or "", dict(schema), get("schema_hash") or "",
                     tuple(str(e) for e in examples if str(e).strip()) if isinstance(examples, (list, tuple)) else ())


_NAMESPACE = re.compile(r".*[A-Za-z0-9]__+([A-Za-z0-9].*)")  # greedy: the tail after the last "__"
_LEADING = re.compile(r"([A-Za-z0-9]+)[_.\-/:]+(?=[A-Za-z0-9])")


def server_prefix_labels(names: list[str]) -> list[str]:
    """The names of one request's tools without the server prefixes agent frameworks add, for routing texts.

    Two kinds of prefix go: a namespace ending in a double underscore (`mcp_time__convert_time`, as the OpenAI
    Agents SDK and others write it: the part after the last `__` is the tool's own name), and a leading word
    that a group of at least two of the tools share and that each of them repeats later in its name
    (pydantic-ai's `time_convert_time`, `git_git_show`), dropped as often as that holds. A repeated word is
    dropped only where it appears again, so no word of the name leaves the text and a server's own names
    (`git_show`, `git_log`: "git" shared but not repeated) are kept as they are.
    """
    labels = [m.group(1) if (m := _NAMESPACE.fullmatch(n)) else n for n in names]
    while True:
        lead = [(m.group(1).lower(), n[m.end():]) if (m := _LEADING.match(n)) else None for n in labels]
        shared = {w for w in (x[0] for x in lead if x) if sum(1 for x in lead if x and x[0] == w) >= 2}
        new = [x[1] if x and x[0] in shared and x[0] in _split_identifier(x[1]).lower().split() else n
               for n, x in zip(labels, lead)]
        if new == labels:
            return labels
        labels = new


def strip_server_prefixes(entries: list[ToolEntry]) -> list[ToolEntry]:
    """`entries` (one request's tools) with a `label` where `server_prefix_labels` drops a prefix from the
    name; the name the client sent stays the entry's name (routes answer with it)."""
    labels = server_prefix_labels([e.name for e in entries])
    return [e if lab == e.name else replace(e, label=lab, schema_hash=hash_tool(e.name, e.description,
                                                                                e.input_schema, lab))
            for e, lab in zip(entries, labels)]


MAX_EXAMPLE_ROWS = 16  # buffer rows per tool beyond its text: the first 16 distinct examples


def example_texts(tool: ToolEntry, limit: int = MAX_EXAMPLE_ROWS) -> list[str]:
    """The tool's distinct example requests (whitespace-normalized, first occurrence kept), at most `limit`."""
    out = dict.fromkeys(" ".join(e.split()) for e in tool.examples)
    return [e for e in out if e][:limit]


def row_key(text: str) -> str:
    """Content key of an example row (the tool-text row's key is the tool's schema hash)."""
    return "ex:" + hashlib.sha256(text.encode()).hexdigest()[:24]


def _split_identifier(name: str) -> str:
    """`calc.final_velocity` / `getUserInfo` -> `calc final velocity` / `get User Info`."""
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return re.sub(r"[._\-/]+", " ", name).strip()


def param_names(schema: dict) -> list[str]:
    """Top-level parameter names of a JSON schema, required ones first."""
    props = (schema or {}).get("properties") or {}
    req = [p for p in (schema or {}).get("required") or [] if p in props]
    return req + [p for p in props if p not in req]


def tool_text(tool: ToolEntry, recipe: str = DEFAULT_RECIPE) -> str:
    """The text embedded for a tool.

    name_desc: "<name words>: <description>".
    name_desc_params: the same plus "Parameters: <param words>, ..." (names split into words; at most 12).
    schema (default): name and description plus every top-level parameter (required first) with its description
    and enum values, where the words that tell near-synonym tools apart sit:
    "... Parameters: unit (the unit of the result) one of celsius, fahrenheit; city (...)."
    """
    if recipe not in TEXT_RECIPES:
        raise ValueError(f"unknown tool text recipe {recipe!r}; choose one of {TEXT_RECIPES}")
    text = f"{_split_identifier(tool.text_name)}: {tool.description.strip()}"
    if recipe == "name_desc_params":
        params = [_split_identifier(p) for p in param_names(tool.input_schema)[:12]]
        if params:
            text += " Parameters: " + ", ".join(params) + "."
    elif recipe == "schema":
        params = [_param_text(p, ((tool.input_schema or {}).get("properties") or {}).get(p))
                  for p in param_names(tool.input_schema)]
        if params:
            text += " Parameters: " + "; ".join(params) + "."
    return text


def _prop_words(prop: Any, max_enum: int = 20) -> tuple[str, list[str]]:
    """(stripped description or "", first `max_enum` enum values as strings) of one schema property."""
    if not isinstance(prop, dict):
        return "", []
    desc = prop.get("description")
    enum = prop.get("enum")
    desc = desc.strip() if isinstance(desc, str) else ""
    return desc, [str(e) for e in enum[:max_enum]] if isinstance(enum, list) else []


def _param_text(name: str, prop: Any) -> str:
    """`unit (the unit of the result) one of celsius, fahrenheit` for one schema property."""
    desc, enum = _prop_words(prop)
    return (_split_identifier(name) + (f" ({desc.rstrip('.')})" if desc else "")
            + (" one of " + ", ".join(enum) if enum else ""))


def lexical_text(tool: ToolEntry, max_enum: int = 20) -> str:
    """The text BM25 matches a query against (slb.lexical): name words, description, and every schema
    property's name, description and enum values (nested objects and array items too, 4 levels deep): wider
    than the embedded `schema` text, which keeps top-level parameters only."""
    out = [_split_identifier(tool.text_name), tool.description or ""]

    def walk(schema: Any, depth: int) -> None:
        if not isinstance(schema, dict) or depth > 4:
            return
        for name, prop in (schema.get("properties") or {}).items():
            out.append(_split_identifier(str(name)))
            if not isinstance(prop, dict):
                continue
            desc, enum = _prop_words(prop, max_enum)
            out.extend([desc, *enum])
            walk(prop, depth + 1)
            walk(prop.get("items"), depth + 1)

    walk(tool.input_schema, 0)
    return " ".join(x for x in out if x)
