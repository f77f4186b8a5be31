"""Every bundled server as a real stdio subprocess: list its tools, make a deterministic call, reject bad
arguments against the schema."""

from __future__ import annotations

import pytest

from registry.client import SyncToolClient
from registry.model import Tool
from registry.servers import BUNDLED, command_for
from registry.servers.runtime import Handler, call_handler

# server -> (tool, arguments, expected structured result, invalid arguments)
CALLS = {
    "calculator": ("evaluate", {"expression": "(2 + 3) * 4 ** 2"}, {"result": 80}, {"expression": 5}),
    "clock": ("convert_timezone", {"datetime": "2024-03-01T09:30", "from_zone": "America/New_York",
                                   "to_zone": "Asia/Tokyo"}, {"datetime": "2024-03-01T23:30", "utc_offset": "+0900"},
              {"datetime": "2024-03-01T09:30"}),
    "files": ("write_file", {"path": "a/b.txt", "content": "hi"}, {"path": "a/b.txt", "bytes": 2}, {"path": "x"}),
    "notes": ("add_note", {"title": "t", "body": "b"}, {"id": 1}, {"title": "t", "body": "b", "tags": "x"}),
    "units": ("convert", {"value": 100, "from_unit": "C", "to_unit": "F"}, {"value": 212.0, "unit": "F"},
              {"value": 1, "from_unit": "parsec", "to_unit": "m"}),
    "catalog": ("tool_03", {"x": 7}, None, {"x": "seven"}),
}


def test_every_bundled_server_has_a_call():
    assert set(CALLS) == set(BUNDLED)


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_bundled_server(name, small_catalog, tmp_path):
    command = command_for(name)
    if name == "catalog":
        command += f" --catalog {small_catalog}"
    if name == "files":
        command += f" --root {tmp_path / 'sandbox'}"
    tool, args, expected, bad = CALLS[name]
    with SyncToolClient(command, timeout_s=30) as client:
        listed = {t["name"]: t for t in client.list_tools()}
        assert tool in listed and listed[tool]["inputSchema"]["type"] == "object"
        first = client.call_tool(tool, args)
        assert not first.is_error, first.text
        if expected is not None:
            assert first.structured == expected
        again = client.call_tool(tool, args) if name not in ("notes", "files") else first
        assert again.structured == first.structured  # deterministic
        rejected = client.call_tool(tool, bad)
        assert rejected.is_error and "invalid arguments" in rejected.text
        if name != "catalog":  # a catalogue's schemas are its file's; the others come from @tool signatures
            assert listed[tool]["inputSchema"]["additionalProperties"] is False
            extra = client.call_tool(tool, args | {"no_such_key": 1})
            assert extra.is_error and "invalid arguments" in extra.text and "no_such_key" in extra.text, extra.text
        unknown = client.call_tool("no_such_tool", {})
        assert unknown.is_error and "unknown tool" in unknown.text


def test_runtime_refuses_keys_the_function_does_not_take():
    def area(width: float, height: float) -> dict:
        return {"area": width * height}

    # an open schema (no additionalProperties) lets "depth" through; the runtime still refuses it before the call
    schema = {"type": "object", "properties": {"width": {"type": "number"}, "height": {"type": "number"}}}
    tool = Tool.from_mcp({"name": "area", "inputSchema": schema})
    h = Handler(tool, area)
    assert call_handler(h, {"width": 2, "height": 3}) == ({"area": 6}, None)
    assert call_handler(h, {"width": 2, "height": 3, "depth": 4, "unit": "m"}) == (
        None, "invalid arguments for area: $.arguments: unknown keys 'depth', 'unit'; area takes height, width")
    # a function taking **kwargs, or the whole dict, gets every key its schema allows
    assert call_handler(Handler(tool, lambda **kw: sorted(kw)), {"width": 1, "depth": 4}) == (["depth", "width"], None)
    assert call_handler(Handler(tool, lambda d: sorted(d), pass_dict=True), {"depth": 4}) == (["depth"], None)


def test_catalog_paginates(small_catalog):
    with SyncToolClient(f"python -m registry.servers.catalog --catalog {small_catalog} --page-size 7") as client:
        tools = client.list_tools()
    assert [t["name"] for t in tools] == [f"tool_{i:02d}" for i in range(30)]


def test_files_sandbox_refuses_escape(tmp_path):
    root = tmp_path / "sandbox"
    with SyncToolClient(f"python -m registry.servers.files --root {root}") as client:
        for path in ("../outside.txt", "/etc/passwd", "a/../../x"):
            r = client.call_tool("write_file", {"path": path, "content": "x"})
            assert r.is_error and ("sandbox" in r.text), r.text
        assert client.call_tool("list_files", {}).structured == {"files": []}
    assert not (tmp_path / "outside.txt").exists()


def test_notes_persist_in_sqlite(tmp_path):
    db = tmp_path / "notes.sqlite"
    with SyncToolClient(f"python -m registry.servers.notes --db {db}") as client:
        client.call_tool("add_note", {"title": "shopping", "body": "milk", "tags": ["home"]})
    with SyncToolClient(f"python -m registry.servers.notes --db {db}") as client:
        found = client.call_tool("search_notes", {"query": "milk", "tag": "home"}).structured
    assert found == {"notes": [{"id": 1, "title": "shopping", "body": "milk", "tags": ["home"]}]}
