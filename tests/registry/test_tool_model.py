"""Tool validation at the trust boundary: names, meta-schema, sizes, errors naming tool + path + rule."""

from __future__ import annotations

import pytest

from registry.model import Tool, ToolValidationError

OK_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_valid_tool_round_trips_and_hash_is_content_based():
    t = Tool.from_mcp({"name": "get_weather", "description": "Weather.", "inputSchema": OK_SCHEMA}, server="wx")
    assert t.server == "wx" and t.input_schema == OK_SCHEMA and len(t.schema_hash) == 64
    again = Tool.from_mcp(t.to_json())
    assert again.schema_hash == t.schema_hash  # the server is not part of the content
    changed = Tool.from_mcp({"name": "get_weather", "description": "Weather!", "inputSchema": OK_SCHEMA})
    assert changed.schema_hash != t.schema_hash


def test_from_sdk_tool_object():
    import mcp_types

    sdk = mcp_types.Tool(name="q", input_schema=OK_SCHEMA, annotations=mcp_types.ToolAnnotations(read_only_hint=True))
    t = Tool.from_mcp(sdk)
    assert t.annotations == {"readOnlyHint": True} and t.required == ["city"]


@pytest.mark.parametrize(
    "tool, path, rule",
    [
        ({"name": "../etc/passwd", "inputSchema": OK_SCHEMA}, "$.name", "name-pattern"),
        ({"name": "a" * 129, "inputSchema": OK_SCHEMA}, "$.name", "name-pattern"),
        ({"name": "", "inputSchema": OK_SCHEMA}, "$.name", "name-pattern"),
        ({"name": "t", "inputSchema": {"type": "object", "properties": {"x": {"type": "strng"}}}},
         "$.inputSchema.properties.x.type", "json-schema:anyOf"),
        ({"name": "t", "inputSchema": {"type": "object", "required": "x"}},
         "$.inputSchema.required", "json-schema:type"),
        ({"name": "t", "inputSchema": {"type": "array"}}, "$.inputSchema.type", "root-type-object"),
        ({"name": "t"}, "$.inputSchema", "required"),
        ({"name": "t", "description": "d" * 5000, "inputSchema": OK_SCHEMA}, "$.description", "max-description-chars"),
        ({"name": "t", "inputSchema": {"type": "object", "description": "x" * 70000}},
         "$.inputSchema", "max-schema-bytes"),
        ({"name": "t", "inputSchema": OK_SCHEMA, "annotations": 3}, "$.annotations", "dict_type"),
    ],
)
def test_rejections_name_tool_path_and_rule(tool, path, rule):
    with pytest.raises(ToolValidationError) as info:
        Tool.from_mcp(tool)
    e = info.value
    assert (e.path, e.rule) == (path, rule)
    if tool.get("name"):
        assert e.tool == tool["name"][:80]
    assert path in str(e) and rule in str(e)
