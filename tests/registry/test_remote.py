"""Remote MCP servers: bundled servers over streamable HTTP and SSE on 127.0.0.1, registered and read back;
headers with `${VAR}` kept out of the registry file; a listener that never answers; the schema migration of a
registry written before remote servers existed."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from http_servers import SilentListener

from registry.client import RemoteServer, ServerError, SyncToolClient
from registry.sources import register_remote
from registry.store import SCHEMA_VERSION, RegistryStore

REPO = Path(__file__).resolve().parents[2]


def nexus(*args: str, home: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nexus_agent.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=dict(os.environ, NEXUS_HOME=str(home)))


def test_register_bundled_server_over_streamable_http(store, http_server):
    srv = http_server("registry.servers.calculator")
    report = register_remote(srv.url, store, timeout_s=20)
    assert report.server == "calculator" and sorted(report.added) == ["add", "divide", "evaluate", "multiply"]
    [rec] = store.list_servers()
    assert (rec.transport, rec.url, rec.command, rec.tool_count) == ("http", srv.url, "", 4)
    assert rec.spec() == RemoteServer(srv.url, "http", {})
    again = register_remote(srv.url, store, timeout_s=20)
    assert len(again.unchanged) == 4 and not again.added


def test_sse_transport(http_server):
    srv = http_server("registry.servers.units", transport="--sse")
    assert srv.url.endswith("/sse")
    with SyncToolClient(RemoteServer(srv.url, "sse"), timeout_s=20) as client:
        assert "convert" in {t["name"] for t in client.list_tools()}
        r = client.call_tool("convert", {"value": 100, "from_unit": "C", "to_unit": "F"})
    assert r.structured == {"value": 212.0, "unit": "F"}


def test_headers_are_sent_and_env_references_stay_unexpanded(store, http_server, monkeypatch):
    srv = http_server("registry.servers.calculator", "--bearer", "s3cret-token")
    with pytest.raises(ServerError, match="failed to start"):  # 401 without the header
        register_remote(srv.url, store, timeout_s=10)
    monkeypatch.setenv("CALC_TOKEN", "s3cret-token")
    report = register_remote(srv.url, store, headers={"Authorization": "Bearer ${CALC_TOKEN}"}, timeout_s=20)
    assert len(report.added) == 4
    assert store.list_servers()[0].headers == {"Authorization": "Bearer ${CALC_TOKEN}"}
    assert b"s3cret-token" not in store.path.read_bytes() + store.path.with_suffix(".sqlite-wal").read_bytes()
    with SyncToolClient(store.list_servers()[0].spec()) as client:  # resolved again at connect time
        assert client.call_tool("add", {"a": 1, "b": 2}).structured == {"result": 3}
    monkeypatch.delenv("CALC_TOKEN")
    with pytest.raises(ServerError, match="CALC_TOKEN is not set"):
        SyncToolClient(store.list_servers()[0].spec(), timeout_s=5)


def test_server_that_never_answers_times_out(store):
    listener = SilentListener()
    try:
        with pytest.raises(ServerError, match="no answer within 2 s"):  # the 2 s timeout fired, not a hang
            register_remote(listener.url, store, timeout_s=2)
    finally:
        listener.close()
    assert store.list_servers() == []


def test_refused_connection_is_a_clear_error(store):
    listener = SilentListener()
    url = listener.url
    listener.close()  # nothing listens there now
    with pytest.raises(ServerError, match=f"MCP server {url}.*failed to start"):
        register_remote(url, store, timeout_s=5)


def test_bad_url_and_transport():
    with pytest.raises(ValueError, match="not an http"):
        RemoteServer("ftp://x/mcp")
    with pytest.raises(ValueError, match="unknown remote transport"):
        RemoteServer("http://127.0.0.1:1/mcp", "websocket")


V1_SCHEMA = """
CREATE TABLE servers (name TEXT PRIMARY KEY, command TEXT NOT NULL, cwd TEXT, registered_at REAL NOT NULL,
                      updated_at REAL NOT NULL);
CREATE TABLE tools (name TEXT PRIMARY KEY, server TEXT REFERENCES servers(name) ON DELETE SET NULL,
                    version INTEGER NOT NULL, schema_hash TEXT NOT NULL, data TEXT NOT NULL, updated_at REAL NOT NULL);
"""


def test_registry_of_the_previous_schema_is_migrated_in_place(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript(V1_SCHEMA)
    db.execute("INSERT INTO servers VALUES ('calculator', 'python -m registry.servers.calculator', '/w', 1.0, 2.0)")
    db.commit()
    db.close()
    with RegistryStore(path) as store:
        [rec] = store.list_servers()
        assert (rec.name, rec.command, rec.cwd, rec.transport, rec.url, rec.headers) == \
            ("calculator", "python -m registry.servers.calculator", "/w", "stdio", None, {})
        assert rec.spec().argv[1:] == ["-m", "registry.servers.calculator"] and rec.spec().cwd == "/w"
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        store.upsert_server("remote", transport="http", url="http://127.0.0.1:9/mcp", headers={"X-Key": "${K}"})
    with RegistryStore(path) as store:  # opening again is a no-op
        assert [(s.name, s.transport) for s in store.list_servers()] == [("calculator", "stdio"), ("remote", "http")]
    old_reader = sqlite3.connect(path)  # what an older Nexus selects still reads
    assert old_reader.execute("SELECT name, command, cwd FROM servers ORDER BY name").fetchall() == \
        [("calculator", "python -m registry.servers.calculator", "/w"), ("remote", "", None)]
    old_reader.close()


def test_servers_list_shows_transport_and_hides_literal_header_values(nexus_home, http_server):
    srv = http_server("registry.servers.calculator", "--bearer", "literal-secret")
    r = nexus("register", "--url", srv.url, "--header", "Authorization: Bearer literal-secret", "--header",
              "X-Trace: ${HOME}", home=nexus_home)
    assert r.returncode == 0, r.stderr
    listed = json.loads(nexus("servers", "list", "--json", home=nexus_home).stdout)
    assert listed[0]["transport"] == "http" and listed[0]["url"] == srv.url
    assert listed[0]["headers"] == {"Authorization": "<set>", "X-Trace": "${HOME}"}
    table = nexus("servers", "list", home=nexus_home).stdout
    assert "http" in table and "Authorization" in table and "literal-secret" not in table
    bad = nexus("register", "--url", srv.url, "--header", "no colon here", home=nexus_home)
    assert bad.returncode == 1 and "expected 'Name: value'" in bad.stderr
