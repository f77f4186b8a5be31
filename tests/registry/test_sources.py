"""Sources end to end: a real server subprocess into SQLite, read back in a fresh process; files; the
decorator; failing servers that must not lose what is already registered."""

from __future__ import annotations

import json
import sys
from typing import Literal

import pytest

from registry.client import ServerError
from registry.decorator import tool
from registry.sources import load_tool_file, register_file, register_functions, register_server


def run_python(code: str, timeout: float = 60) -> str:
    """Run `code` in a fresh interpreter (repo as cwd); return its stdout, failing the test on error."""
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=repo)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_server_registration_read_back_in_fresh_process(store, small_catalog):
    command = f"python -m registry.servers.catalog --catalog {small_catalog} --page-size 8"
    report = register_server(command, store, timeout_s=30)
    assert report.server == "catalog" and len(report.added) == 30 and report.ok
    out = run_python(
        "import json; from registry.store import RegistryStore\n"
        f"s = RegistryStore({str(store.path)!r})\n"
        "print(json.dumps({'tools': [t.to_json() for t in s.list_tools()], "
        "'servers': [(r.name, r.command, r.tool_count) for r in s.list_servers()]}))"
    )
    data = json.loads(out)
    assert [t["name"] for t in data["tools"]] == [f"tool_{i:02d}" for i in range(30)]
    assert data["tools"][3]["inputSchema"]["required"] == ["x"] and data["tools"][3]["server"] == "catalog"
    assert data["servers"] == [["catalog", command, 30]]
    again = register_server(command, store, timeout_s=30)
    assert len(again.unchanged) == 30 and not again.added and not again.updated


@pytest.mark.parametrize("code, expect", [
    ("import sys; print('config file missing', file=sys.stderr); sys.exit(3)", "config file missing"),
    ("import time; time.sleep(30)", "no answer within 2 s"),
])
def test_broken_server_gives_clear_error_and_loses_nothing(store, small_catalog, code, expect):
    register_server(f"python -m registry.servers.catalog --catalog {small_catalog}", store, timeout_s=30)
    before = [t.to_json() for t in store.list_tools()]
    command = f"{sys.executable} -c \"{code}\""
    with pytest.raises(ServerError, match="failed to start") as info:
        register_server(command, store, timeout_s=2)
    assert expect in str(info.value)
    assert [t.to_json() for t in store.list_tools()] == before
    assert [s.name for s in store.list_servers()] == ["catalog"]


def test_json_and_jsonl_files(store, tmp_path):
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    (tmp_path / "one.json").write_text(json.dumps({"tools": [{"name": "search", "inputSchema": schema}]}))
    (tmp_path / "many.jsonl").write_text(
        json.dumps({"name": "lookup", "inputSchema": schema}) + "\n\n"
        + json.dumps({"name": "bad/name", "inputSchema": schema}) + "\n"
    )
    assert register_file(tmp_path / "one.json", store).added == ["search"]
    report = register_file(tmp_path / "many.jsonl", store)
    assert report.added == ["lookup"] and report.rejected[0].rule == "name-pattern"
    (tmp_path / "broken.jsonl").write_text('{"name": "x"}\n{oops\n')
    with pytest.raises(ValueError, match=r"broken.jsonl:2"):
        load_tool_file(tmp_path / "broken.jsonl")
    assert [t.name for t in store.list_tools()] == ["lookup", "search"]


def test_decorator_schema_from_signature(store):
    @tool
    def book_table(restaurant: str, seats: int, when: str | None = None,
                   area: Literal["indoor", "outdoor"] = "indoor", notes: list[str] | None = None) -> dict:
        """Reserve a table at a restaurant.

        Longer text that is not part of the description.

        Args:
            restaurant: name of the restaurant
            seats: number of people
        """
        return {}

    t = book_table.tool
    assert t.name == "book_table" and t.description == "Reserve a table at a restaurant."
    assert t.input_schema == {
        "type": "object",
        "properties": {
            "restaurant": {"type": "string", "description": "name of the restaurant"},
            "seats": {"type": "integer", "description": "number of people"},
            "when": {"type": "string"},
            "area": {"enum": ["indoor", "outdoor"], "default": "indoor"},
            "notes": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["restaurant", "seats"],
        "additionalProperties": False,  # the function takes no other key
    }
    assert register_functions([book_table], store).added == ["book_table"]
    with pytest.raises(ValueError, match="cannot be given by a JSON call"):
        tool(lambda *args: None)
