"""The SQLite store: idempotent re-registration, versions, staleness, removal, concurrent writers."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from registry.store import RegistryStore

REPO = __import__('pathlib').Path(__file__).resolve().parents[2]


def tool_dict(name: str, description: str = "Does a thing.", required=("x",)) -> dict:
    props = {r: {"type": "string"} for r in required}
    return {"name": name, "description": description,
            "inputSchema": {"type": "object", "properties": props, "required": list(required)}}


def test_wal_and_tables(store):
    mode = store.db.execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    assert store.path.name == "registry.sqlite" and store.path.exists()


def test_a_registry_opened_while_another_process_creates_it_waits_for_the_lock(tmp_path):
    """Two `nexus` commands on a fresh home: the other holds a write lock on the new file, still in rollback mode,
    where SQLite refuses the switch to WAL at once (no busy timeout); the store waits for it, not an error."""
    import threading

    path = tmp_path / "registry.sqlite"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE t (x)")
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO t VALUES (1)")
    release = threading.Timer(0.5, lambda: other.execute("COMMIT"))
    release.start()
    try:
        with RegistryStore(path) as store:
            assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert store.add_tools([tool_dict("a")]).added == ["a"]
    finally:
        release.join()
        other.close()


def test_reregister_is_idempotent_and_change_bumps_version(store):
    r1 = store.add_tools([tool_dict("a"), tool_dict("b")], server=None)
    assert r1.added == ["a", "b"] and r1.ok
    r2 = store.add_tools([tool_dict("a"), tool_dict("b")])
    assert r2.unchanged == ["a", "b"] and not r2.added and not r2.updated
    assert store.tool_version("a") == 1
    r3 = store.add_tools([tool_dict("a", description="Does another thing.")])
    assert r3.updated == ["a"] and store.tool_version("a") == 2
    versions = store.db.execute("SELECT version FROM tool_versions WHERE tool='a' ORDER BY version").fetchall()
    assert versions == [(1,), (2,)]
    assert store.get_tool("a").description == "Does another thing."


def test_schema_change_marks_artefacts_stale(store):
    store.add_tools([tool_dict("a"), tool_dict("b")])
    assert [t.name for t in store.stale_tools("embedding")] == ["a", "b"]
    for t in store.list_tools():
        store.mark_fresh(t.name, "embedding", t.schema_hash)
    store.mark_fresh("a", "kv_block", store.get_tool("a").schema_hash)
    assert store.stale_tools("embedding") == []
    assert [t.name for t in store.stale_tools("kv_block")] == ["b"]
    store.add_tools([tool_dict("a", required=("x", "y"))])  # new schema
    assert [t.name for t in store.stale_tools("embedding")] == ["a"]
    assert [t.name for t in store.stale_tools("kv_block")] == ["a", "b"]


def test_bad_tools_are_reported_and_good_ones_kept(store):
    store.add_tools([tool_dict("keep")])
    report = store.add_tools([
        tool_dict("good"),
        {"name": "bad name", "inputSchema": {"type": "object"}},
        {"name": "bad_schema", "inputSchema": {"type": "object", "properties": {"x": {"type": 5}}}},
        tool_dict("good"),
    ])
    assert report.added == ["good"]
    assert [(e.tool, e.rule) for e in report.rejected] == [
        ("bad name", "name-pattern"), ("bad_schema", "json-schema:anyOf"), ("good", "unique-name")]
    assert [t.name for t in store.list_tools()] == ["good", "keep"]


def test_a_name_another_server_has_is_registered_under_its_server(store):
    """Two servers with a tool of one name (excel's and basic-memory's `delete_note`): the second is registered as
    `server.name`, called on its server by its own name, re-registered unchanged; a file's tool is refused."""
    store.upsert_server("s1", "cmd1")
    store.upsert_server("s2", "cmd2")
    store.add_tools([tool_dict("shared")], server="s1")
    report = store.add_tools([tool_dict("shared"), tool_dict("own")], server="s2", prune=True)
    assert report.ok and report.added == ["s2.shared", "own"] and report.renamed == [("shared", "s2.shared", "s1")]
    second = store.get_tool("s2.shared")
    assert (second.server, second.remote_name, second.server_name) == ("s2", "shared", "shared")
    assert store.get_tool("shared").server == "s1" and store.get_tool("shared").remote_name is None
    again = store.add_tools([tool_dict("shared"), tool_dict("own")], server="s2", prune=True)
    assert sorted(again.unchanged) == ["own", "s2.shared"] and not again.removed and not again.added
    report = store.add_tools([tool_dict("shared")])  # a file's tool has no server to be named by
    assert report.rejected[0].rule == "unique-name" and "s1" in report.rejected[0].message


def test_prune_removes_tools_the_server_dropped(store):
    store.upsert_server("s", "cmd")
    store.add_tools([tool_dict("a"), tool_dict("b")], server="s", prune=True)
    report = store.add_tools([tool_dict("a")], server="s", prune=True)
    assert report.removed == ["b"] and [t.name for t in store.list_tools()] == ["a"]


def test_remove_tool(store):
    store.add_tools([tool_dict("a"), tool_dict("b")])
    store.mark_fresh("a", "embedding", store.get_tool("a").schema_hash)
    store.remove_tool("a")
    assert store.get_tool("a") is None and [t.name for t in store.list_tools()] == ["b"]
    assert store.db.execute("SELECT COUNT(*) FROM artefacts").fetchone()[0] == 0
    with pytest.raises(KeyError, match="no tool named 'a'"):
        store.remove_tool("a")


def test_close_is_idempotent(nexus_home):
    s = RegistryStore()
    s.close()
    s.close()
    with pytest.raises(ValueError, match="closed"):
        s.list_tools()


WRITER = """
import sys
from registry.store import RegistryStore
path, tag = sys.argv[1], sys.argv[2]
s = RegistryStore(path)
for i in range(60):
    tools = [{{"name": f"{{tag}}_{{i}}_{{j}}", "inputSchema": {{"type": "object"}}}} for j in range(5)]
    tools.append({{"name": "shared", "description": f"{{tag}} {{i}}", "inputSchema": {{"type": "object"}}}})
    r = s.add_tools(tools)
    assert not r.rejected, r.rejected
s.close()
"""


def test_two_processes_registering_at_once_lose_nothing(tmp_path):
    path = tmp_path / "registry.sqlite"
    RegistryStore(path).close()
    script = WRITER.format()
    procs = [subprocess.Popen([sys.executable, "-c", script, str(path), tag],
                              cwd=REPO, stderr=subprocess.PIPE, text=True)
             for tag in ("p", "q")]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    with RegistryStore(path) as s:
        names = {t.name for t in s.list_tools()}
        assert names == {f"{tag}_{i}_{j}" for tag in "pq" for i in range(60) for j in range(5)} | {"shared"}
        # "shared" changed on every write that was not a no-op: versions are gapless 1..n
        versions = [v for (v,) in s.db.execute("SELECT version FROM tool_versions WHERE tool='shared' "
                                               "ORDER BY version")]
        assert versions == list(range(1, len(versions) + 1)) and s.tool_version("shared") == versions[-1]
        assert len(versions) >= 60
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
