"""The registry file's SQLite layer (`registry.store.RegistryStore` is the API over it).

Tables:
- `servers(name, command, cwd, transport, url, headers, env, ...)`: how to reach each registered MCP server
  again: a stdio command line (run in `cwd` with the extra `env`), or a remote `url` (transport `http` for
  streamable HTTP or `sse`) sent `headers`. `headers` and `env` are JSON objects whose `${VAR}` references are
  kept unexpanded (registry.transports). Registries written before remote servers existed gain the columns on
  open (schema version 1 -> 2, every row kept as a stdio server).
- `tools(name, server, version, schema_hash, data)`: the current version of each tool (`data` is its JSON).
- `tool_versions(tool, version, schema_hash, data)`: every version ever registered, for audit and rollback.
- `artefacts(tool, kind, schema_hash)`: which schema hash a derived artefact of `kind` (e.g. "embedding",
  "kv_block") was built from. A tool is stale for a kind when that row is missing or its hash differs from the
  tool's current hash, so a schema change marks every artefact stale without touching this table.
- `examples(tool, text, source, schema_hash, checksum)`: example requests per tool (registry.examples):
  templated at registration, given by users, or learned from confirmed calls. A schema change deletes the
  tool's examples and templates new ones; a row whose checksum does not match is never returned (the tool's
  examples are rebuilt from its schema and the damage is reported).

Every write is one `BEGIN IMMEDIATE` transaction, so concurrent writers from several processes serialize on
SQLite's lock (with a busy timeout) instead of interleaving.
Every write is one `BEGIN IMMEDIATE` transaction (`Transaction`), so concurrent writers from several processes
serialize on SQLite's lock (with a busy timeout) instead of interleaving.
"""

from __future__ import annotations

import json
import sqlite3

from registry.model import Tool

SCHEMA = """
CREATE TABLE IF NOT EXISTS servers (
    name TEXT PRIMARY KEY,
    command TEXT NOT NULL,
    cwd TEXT,
    transport TEXT NOT NULL DEFAULT 'stdio',
    url TEXT,
    headers TEXT,
    env TEXT,
    registered_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS tools (
    name TEXT PRIMARY KEY,
    server TEXT REFERENCES servers(name) ON DELETE SET NULL,
    version INTEGER NOT NULL,
    schema_hash TEXT NOT NULL,
    data TEXT NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS tools_server ON tools(server);
CREATE TABLE IF NOT EXISTS tool_versions (
    tool TEXT NOT NULL,
    version INTEGER NOT NULL,
    schema_hash TEXT NOT NULL,
    data TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (tool, version)
);
CREATE TABLE IF NOT EXISTS examples (
    tool TEXT NOT NULL,
    text TEXT NOT NULL,
    source TEXT NOT NULL,
    schema_hash TEXT NOT NULL,
    checksum TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (tool, text)
);
CREATE TABLE IF NOT EXISTS artefacts (
    tool TEXT NOT NULL,
    kind TEXT NOT NULL,
    schema_hash TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (tool, kind)
);
"""


SCHEMA_VERSION = 2
SERVER_COLUMNS = (  # added in version 2, with their SQL definitions
    ("transport", "TEXT NOT NULL DEFAULT 'stdio'"), ("url", "TEXT"), ("headers", "TEXT"), ("env", "TEXT"),
)


class RegistryBusyError(ValueError):
    """Another process held the registry's write lock for longer than the busy timeout; nothing was written."""


class Transaction:
    """`BEGIN IMMEDIATE` ... `COMMIT` (or `ROLLBACK` on error) on an autocommit connection."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self):
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e):
                raise
            raise RegistryBusyError(
                "the registry is locked by another process's write transaction (another `nexus register` or "
                "`nexus compile`?); nothing was changed: retry when it has finished") from None
        return self.db

    def __exit__(self, exc_type, exc, tb):
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
        return False


def migrate(db: sqlite3.Connection) -> None:
    """Bring a registry written by an older Nexus to SCHEMA_VERSION in place, keeping every row."""
    if db.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
        return
    with Transaction(db):
        have = {r[1] for r in db.execute("PRAGMA table_info(servers)")}
        for column, sql in SERVER_COLUMNS:
            if column not in have:
                db.execute(f"ALTER TABLE servers ADD COLUMN {column} {sql}")
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def load_tool(data: str) -> Tool:
    """A Tool from its stored JSON, without re-validating (it was validated on the way in)."""
    d = json.loads(data)
    return Tool.model_construct(
        name=d["name"], title=d.get("title"), description=d.get("description") or "",
        input_schema=d["inputSchema"], output_schema=d.get("outputSchema"), annotations=d.get("annotations"),
        server=d.get("server"), schema_hash=d["schemaHash"], remote_name=d.get("remoteName"),
    )
