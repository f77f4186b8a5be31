"""The registry's Tool model: an MCP tool schema validated at the trust boundary (DESIGN section 4).

Everything the registry accepts passes through `Tool`: from an MCP server, a JSON/JSONL file, or a decorated
Python function. Validation rejects what later stages cannot handle safely: names that are not file-name safe
(they become part of KV block file names), input schemas that are not valid JSON Schema (checked against the
schema's own meta-schema by `jsonschema`, not by hand-written rules), and oversized text.
A rejection is a `ToolValidationError` naming the tool, the JSON path of the offending value and the rule.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

NAME_PATTERN = r"[A-Za-z0-9_.-]{1,128}"
_NAME_RE = re.compile(NAME_PATTERN + r"\Z")


def safe_name(text: str) -> str:
    """`text` as a name of NAME_PATTERN: each run of other characters one "-" ("Basic Memory" -> "Basic-Memory",
    the name a server may report), cut to 128; "" when nothing of it is left."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:128]


@dataclass(frozen=True)
class ToolLimits:
    """Size bounds on a tool; lengths in characters, sizes in bytes of compact UTF-8 JSON."""

    max_title_chars: int = 256
    max_description_chars: int = 4096
    max_schema_bytes: int = 64 * 1024
    max_schema_depth: int = 32

    def __post_init__(self):
        for field, value in vars(self).items():
            if value <= 0:
                raise ValueError(f"ToolLimits.{field} must be positive, got {value}")


LIMITS = ToolLimits()


class ToolValidationError(ValueError):
    """A tool that was rejected: which tool, where in its JSON (a JSON path like `$.inputSchema.properties.x`),
    and which rule it broke (e.g. `name-pattern`, `json-schema:type`, `max-description-chars`)."""

    def __init__(self, tool: str, path: str, rule: str, message: str):
        self.tool, self.path, self.rule, self.message = tool, path, rule, message
        super().__init__(f"tool {tool!r}: {path}: {message} [rule: {rule}]")

    def as_dict(self) -> dict[str, str]:
        return {"tool": self.tool, "path": self.path, "rule": self.rule, "message": self.message}


def json_path(parts) -> str:
    """`$.a.b[0]` from a sequence of keys and indices."""
    out = "$"
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(p)):
            out += f".{p}"
        else:
            out += f"[{json.dumps(str(p))}]"
    return out


def canonical_json(value: Any) -> str:
    """Compact JSON with sorted keys: the form hashed and stored."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@lru_cache(maxsize=8)
def _meta_validator(cls):
    """One validator of the meta-schema per JSON Schema draft (building it is the slow part)."""
    return cls(cls.META_SCHEMA)


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether dicts/lists nest deeper than `limit` (iterative: a hostile document cannot exhaust the stack)."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            if d > limit:
                return True
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return False


def check_json_schema(tool: str, field: str, schema: Any, limits: ToolLimits = LIMITS) -> None:
    """Raise ToolValidationError unless `schema` is a bounded, valid JSON Schema whose root is an object."""
    from jsonschema import validators
    from jsonschema.exceptions import best_match

    where = f"$.{field}"
    if not isinstance(schema, dict):
        raise ToolValidationError(tool, where, "schema-is-object",
                                  f"must be a JSON object, got {type(schema).__name__}")
    if _depth_exceeds(schema, limits.max_schema_depth):  # first: serializing a very deep document would recurse
        raise ToolValidationError(tool, where, "max-schema-depth", f"nested deeper than {limits.max_schema_depth}")
    size = len(canonical_json(schema).encode())
    if size > limits.max_schema_bytes:
        raise ToolValidationError(
            tool, where, "max-schema-bytes", f"schema is {size} bytes, limit {limits.max_schema_bytes}; simplify it"
        )
    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    error = best_match(_meta_validator(cls).iter_errors(schema))
    if error is not None:
        path = json_path([field, *error.absolute_path])
        raise ToolValidationError(tool, path, f"json-schema:{error.validator}", error.message)
    if schema.get("type") != "object":
        raise ToolValidationError(
            tool, f"{where}.type", "root-type-object", 'an MCP tool schema must have "type": "object" at its root'
        )


def arguments_error(tool: str, schema: dict, arguments: Any, most: int = 3) -> str | None:
    """A one-line message naming the ways `arguments` break the tool's input schema, the best-matching first
    (at most `most`, so a caller fixes them in one go: an unexpected key and the required one it stood for), e.g.
    "invalid arguments for add: $.arguments.a: 'x' is not of type 'number'"; None when they are valid."""
    from jsonschema import validators
    from jsonschema.exceptions import best_match, relevance

    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    errors = list(cls(schema).iter_errors(arguments))
    if not errors:
        return None
    first = best_match(errors)
    rest = sorted((e for e in errors if e is not first), key=relevance)[: most - 1]
    said = "; ".join(f"{json_path(['arguments', *e.absolute_path])}: {e.message}" for e in [first, *rest])
    return f"invalid arguments for {tool}: {said}"


def check_name(name: Any) -> None:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        shown = name if isinstance(name, str) else repr(name)
        raise ToolValidationError(
            str(shown)[:80], "$.name", "name-pattern",
            f"name must match {NAME_PATTERN} (letters, digits, '_', '.', '-'; 1-128 characters)",
        )


class Tool(BaseModel):
    """One MCP tool as the registry keeps it.

    `input_schema` / `output_schema` are JSON Schema objects (dicts); `annotations` is MCP's ToolAnnotations as
    a plain dict; `server` is the registered server name it came from (None for files and functions);
    `schema_hash` is the sha256 hex of everything a model sees (name, title, description, schemas,
    annotations): it changes exactly when derived artefacts (embeddings, KV blocks) must be rebuilt.
    """

    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="ignore")

    name: str
    title: str | None = None
    description: str = ""
    input_schema: dict[str, Any] = Field(alias="inputSchema")
    output_schema: dict[str, Any] | None = Field(default=None, alias="outputSchema")
    annotations: dict[str, Any] | None = None
    server: str | None = None
    schema_hash: str = ""
    remote_name: str | None = None  # the name its server calls it by, when registered under another (qualified)

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        check_name(data.get("name"))
        name = data["name"]
        description = data.get("description") or ""
        if not isinstance(description, str):
            raise ToolValidationError(name, "$.description", "type-string", "description must be a string")
        if len(description) > LIMITS.max_description_chars:
            raise ToolValidationError(
                name, "$.description", "max-description-chars",
                f"description is {len(description)} characters, limit {LIMITS.max_description_chars}; shorten it",
            )
        title = data.get("title")
        if title is not None and (not isinstance(title, str) or len(title) > LIMITS.max_title_chars):
            raise ToolValidationError(
                name, "$.title", "max-title-chars", f"title must be a string of at most {LIMITS.max_title_chars} chars"
            )
        for field, key in (("inputSchema", "input_schema"), ("outputSchema", "output_schema")):
            schema = data.get(field, data.get(key))
            if schema is None and field == "outputSchema":
                continue
            if schema is None:
                raise ToolValidationError(name, f"$.{field}", "required", "inputSchema is missing")
            check_json_schema(name, field, schema)
        data = dict(data, description=description)
        data["schema_hash"] = _content_hash(data)
        return data

    @classmethod
    def from_mcp(cls, tool: Any, server: str | None = None) -> "Tool":
        """A validated Tool from an MCP `Tool` object or its JSON dict (camelCase or snake_case keys).

        Raises ToolValidationError (a ValueError) naming the tool, the JSON path and the rule.
        """
        if hasattr(tool, "model_dump"):
            tool = tool.model_dump(by_alias=True, exclude_none=True, mode="json")
        if not isinstance(tool, dict):
            raise ToolValidationError("?", "$", "tool-is-object",
                                      f"a tool must be a JSON object, got {type(tool).__name__}")
        data = {k: v for k, v in tool.items() if k not in ("server", "schema_hash", "schemaHash", "remoteName",
                                                          "remote_name")}
        if server is not None:
            data["server"] = server
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            inner = (first.get("ctx") or {}).get("error")
            if isinstance(inner, ToolValidationError):
                raise inner from None
            name = data.get("name") if isinstance(data.get("name"), str) else "?"
            raise ToolValidationError(name, json_path(first["loc"]), first["type"], first["msg"]) from None

    def to_mcp(self) -> dict[str, Any]:
        """The MCP wire form (camelCase keys, no registry fields)."""
        out: dict[str, Any] = {"name": self.name}
        if self.title is not None:
            out["title"] = self.title
        out["description"] = self.description
        out["inputSchema"] = self.input_schema
        if self.output_schema is not None:
            out["outputSchema"] = self.output_schema
        if self.annotations is not None:
            out["annotations"] = self.annotations
        return out

    def to_json(self) -> dict[str, Any]:
        """The MCP form plus the registry fields `server`, `schemaHash` and (for a qualified name) `remoteName`."""
        extra = {"remoteName": self.remote_name} if self.remote_name else {}
        return {**self.to_mcp(), "server": self.server, "schemaHash": self.schema_hash, **extra}

    @property
    def server_name(self) -> str:
        """The name its server calls it by."""
        return self.remote_name or self.name

    def qualified(self) -> "Tool":
        """This tool as `server.name`: the name it is registered under when another source's tool has its name
        (two servers with a `delete_note` each: `excel.delete_note` stays `delete_note`, the second becomes
        `memory.delete_note`, called on its server as `delete_note`)."""
        data = dict(self.to_mcp(), name=f"{self.server}.{self.name}")
        return Tool.from_mcp(data, server=self.server).model_copy(update={"remote_name": self.name})

    @property
    def required(self) -> list[str]:
        """Names of the required top-level parameters."""
        req = self.input_schema.get("required") or []
        return [r for r in req if isinstance(r, str)]


def _content_hash(data: dict[str, Any]) -> str:
    content = {
        "name": data["name"],
        "title": data.get("title"),
        "description": data.get("description") or "",
        "inputSchema": data.get("inputSchema", data.get("input_schema")),
        "outputSchema": data.get("outputSchema", data.get("output_schema")),
        "annotations": data.get("annotations"),
    }
    return hashlib.sha256(canonical_json(content).encode()).hexdigest()
