"""The registry store: one SQLite file (WAL) holding servers, tools, schema versions and artefact freshness.

The tables, the schema version and the write transaction are `registry.store_sql`'s; the records it returns
(`RegisterReport`, `ServerRecord`) are `registry.records`'.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Iterable

from registry.examples import SOURCES, Example, example_checksum, normalize_example, template_examples
from registry.home import home_path
from registry.model import Tool, ToolValidationError, canonical_json
from registry.records import RegisterReport, ServerRecord
from registry.sqlite_wal import use_wal
from registry.store_sql import SCHEMA, SCHEMA_VERSION, RegistryBusyError, Transaction, load_tool, migrate

__all__ = ["MAX_LEARNED", "SCHEMA_VERSION", "ExamplesCorruptWarning", "RegisterReport", "RegistryBusyError",
           "RegistryStore", "ServerRecord"]

MAX_LEARNED = 32  # learned examples kept per tool (the oldest go first)


class ExamplesCorruptWarning(UserWarning):
    """Stored example rows of a tool failed their checksum: they were dropped and rebuilt from the schema."""

class RegistryStore:
    """The SQLite registry. `path=None` uses `$NEXUS_HOME/registry.sqlite`. Close with `.close()` (idempotent)
    or use it as a context manager."""

    def __init__(self, path: str | Path | None = None, busy_timeout_s: float = 30.0):
        if path is None:
            path = home_path("registry.sqlite")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db: sqlite3.Connection | None = sqlite3.connect(
            str(self.path), timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        use_wal(self._db, busy_timeout_s)
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.executescript(SCHEMA)  # idempotent; runs in its own implicit transaction
        migrate(self._db)

    # -- plumbing -------------------------------------------------------------------------------------
    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise ValueError(f"registry store {self.path} is closed")
        return self._db

    def _write(self):
        return Transaction(self.db)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> "RegistryStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- servers --------------------------------------------------------------------------------------
    def upsert_server(self, name: str, command: str = "", cwd: str | None = None, *, transport: str = "stdio",
                      url: str | None = None, headers: dict[str, str] | None = None,
                      env: dict[str, str] | None = None) -> None:
        """Record how to reach server `name`: a shell-style command line run in `cwd` with extra `env`
        (transport "stdio"), or a `url` sent `headers` (transport "http" or "sse")."""
        from registry.transports import TRANSPORTS

        if transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {transport!r}; choose one of {', '.join(TRANSPORTS)}")
        if (transport == "stdio") != bool(command) or (transport != "stdio") != bool(url):
            raise ValueError(f"server {name!r}: a stdio server needs a command and no URL, a remote one a URL")
        now = time.time()
        with self._write():
            self.db.execute(
                "INSERT INTO servers(name, command, cwd, transport, url, headers, env, registered_at, updated_at) "
                "VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT(name) DO UPDATE SET command=excluded.command, "
                "cwd=excluded.cwd, transport=excluded.transport, url=excluded.url, headers=excluded.headers, "
                "env=excluded.env, updated_at=excluded.updated_at",
                (name, command, cwd, transport, url, json.dumps(headers) if headers else None,
                 json.dumps(env) if env else None, now, now),
            )

    def list_servers(self) -> list[ServerRecord]:
        rows = self.db.execute(
            "SELECT s.name, s.command, s.cwd, COUNT(t.name), s.registered_at, s.updated_at, s.transport, s.url, "
            "s.headers, s.env FROM servers s LEFT JOIN tools t ON t.server = s.name GROUP BY s.name ORDER BY s.name"
        ).fetchall()
        return [ServerRecord(*r[:8], headers=json.loads(r[8] or "{}"), env=json.loads(r[9] or "{}")) for r in rows]

    def get_server(self, name: str) -> ServerRecord | None:
        return next((s for s in self.list_servers() if s.name == name), None)

    def server_command(self, name: str) -> tuple[str, str | None] | None:
        """(command, cwd) recorded for server `name`, or None if it is not registered (remote: command "")."""
        row = self.db.execute("SELECT command, cwd FROM servers WHERE name = ?", (name,)).fetchone()
        return (row[0], row[1]) if row else None

    # -- tools ----------------------------------------------------------------------------------------
    def add_tools(self, tools: Iterable[Tool | dict], server: str | None = None, prune: bool = False) -> RegisterReport:
        """Validate and store a batch of tools in one transaction; bad tools are reported, good ones kept.

        A tool whose schema hash is unchanged is left alone (re-registering is idempotent); a changed hash
        bumps the version and so makes every derived artefact stale. A server's tool whose name another source
        has is registered as `server.name` (`Tool.qualified`, reported in `renamed`); a file's is rejected
        (remove the other first). With `prune=True`, tools of `server` absent from this batch are removed.
        """
        report = RegisterReport(server=server)
        valid: list[Tool] = []
        seen: set[str] = set()
        given: dict[str, list[str]] = {}  # user examples from an `examples` list in the tool object
        for item in tools:
            try:
                tool = Tool.from_mcp(item, server=server)
                raw = item.get("examples") if isinstance(item, dict) else None
                if raw is not None and not isinstance(raw, list):
                    raise ToolValidationError(tool.name, "$.examples", "type-array",
                                              "examples must be a list of request strings")
                try:
                    texts = [normalize_example(x) for x in raw or []]
                except ValueError as e:
                    raise ToolValidationError(tool.name, "$.examples", "example", str(e)) from None
            except ToolValidationError as e:
                report.rejected.append(e)
                continue
            if tool.name in seen:
                report.rejected.append(ToolValidationError(tool.name, "$.name", "unique-name",
                                                           "listed twice in one batch"))
                continue
            seen.add(tool.name)
            valid.append(tool)
            given[tool.name] = texts
        rejected_names = {e.tool for e in report.rejected}
        now = time.time()
        with self._write():
            for tool in valid:
                row = self.db.execute("SELECT server, version, schema_hash FROM tools WHERE name = ?",
                                      (tool.name,)).fetchone()
                if row is not None and row[0] != server and server is not None:
                    try:
                        qualified = tool.qualified()
                    except ToolValidationError as e:
                        report.rejected.append(e)
                        continue
                    report.renamed.append((tool.name, qualified.name, row[0]))
                    given[qualified.name] = given[tool.name]
                    seen.add(qualified.name)
                    tool = qualified
                    row = self.db.execute("SELECT server, version, schema_hash FROM tools WHERE name = ?",
                                          (tool.name,)).fetchone()
                if row is not None and row[0] != server:
                    owner = f"server {row[0]!r}" if row[0] else "a file or function source"
                    report.rejected.append(ToolValidationError(
                        tool.name, "$.name", "unique-name",
                        f"already registered by {owner}; run `nexus tools remove {tool.name}` first",
                    ))
                    continue
                if row is not None and row[2] == tool.schema_hash:
                    report.unchanged.append(tool.name)
                    self._insert_examples(tool, given[tool.name], "user", now)
                    if not self.db.execute("SELECT 1 FROM examples WHERE tool = ? AND source = 'template'",
                                           (tool.name,)).fetchone():  # registered before examples existed
                        self._insert_templates(tool, now)
                    continue
                version = 1 if row is None else row[1] + 1
                data = canonical_json(tool.to_json())
                self.db.execute(
                    "INSERT INTO tools(name, server, version, schema_hash, data, updated_at) VALUES (?,?,?,?,?,?) "
                    "ON CONFLICT(name) DO UPDATE SET version=excluded.version, schema_hash=excluded.schema_hash, "
                    "data=excluded.data, updated_at=excluded.updated_at",
                    (tool.name, server, version, tool.schema_hash, data, now),
                )
                self.db.execute(
                    "INSERT OR REPLACE INTO tool_versions(tool, version, schema_hash, data, created_at) "
                    "VALUES (?,?,?,?,?)",
                    (tool.name, version, tool.schema_hash, data, now),
                )
                self.db.execute("DELETE FROM examples WHERE tool = ?", (tool.name,))  # made for the old schema
                self._insert_templates(tool, now)
                self._insert_examples(tool, given[tool.name], "user", now)
                (report.added if row is None else report.updated).append(tool.name)
            if prune and server is not None:
                keep = seen | rejected_names
                for (name,) in self.db.execute("SELECT name FROM tools WHERE server = ?", (server,)).fetchall():
                    if name not in keep:
                        self._delete(name)
                        report.removed.append(name)
        return report

    def list_tools(self, server: str | None = None) -> list[Tool]:
        """All current tools sorted by name (only those of `server` when given)."""
        if server is None:
            rows = self.db.execute("SELECT data FROM tools ORDER BY name").fetchall()
        else:
            rows = self.db.execute("SELECT data FROM tools WHERE server = ? ORDER BY name", (server,)).fetchall()
        return [load_tool(r[0]) for r in rows]

    def get_tool(self, name: str) -> Tool | None:
        row = self.db.execute("SELECT data FROM tools WHERE name = ?", (name,)).fetchone()
        return load_tool(row[0]) if row else None

    def tool_version(self, name: str) -> int | None:
        """The current version number of `name` (1 on first registration), or None."""
        row = self.db.execute("SELECT version FROM tools WHERE name = ?", (name,)).fetchone()
        return row[0] if row else None

    def tool_count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM tools").fetchone()[0]

    def remove_tool(self, name: str) -> None:
        """Remove a tool, its version history and its artefact records. Raises KeyError if it is unknown."""
        with self._write():
            if not self._delete(name):
                raise KeyError(f"no tool named {name!r} in {self.path}; see `nexus tools list`")

    def _delete(self, name: str) -> bool:
        cur = self.db.execute("DELETE FROM tools WHERE name = ?", (name,))
        self.db.execute("DELETE FROM tool_versions WHERE tool = ?", (name,))
        self.db.execute("DELETE FROM artefacts WHERE tool = ?", (name,))
        self.db.execute("DELETE FROM examples WHERE tool = ?", (name,))
        return cur.rowcount > 0

    # -- example requests -----------------------------------------------------------------------------
    def _insert_examples(self, tool: Tool, texts: list[str], source: str, now: float) -> int:
        n = 0
        for text in texts:
            cur = self.db.execute(
                "INSERT OR IGNORE INTO examples(tool, text, source, schema_hash, checksum, created_at) "
                "VALUES (?,?,?,?,?,?)",
                (tool.name, text, source, tool.schema_hash,
                 example_checksum(tool.name, tool.schema_hash, source, text), now))
            n += cur.rowcount
        return n

    def _insert_templates(self, tool: Tool, now: float) -> None:
        self._insert_examples(tool, template_examples(tool.name, tool.description, tool.input_schema),
                              "template", now)

    def add_examples(self, name: str, texts: Iterable[str], source: str = "user", cap: int = MAX_LEARNED) -> int:
        """Store example requests of tool `name` for its current schema; returns how many were new (a text
        the tool already has is skipped). Learned examples are capped at `cap` per tool, oldest dropped first.
        Raises KeyError for an unknown tool, ValueError for an empty or oversized text."""
        texts = [normalize_example(t) for t in texts]
        Example("x", source, "")  # validates the source
        with self._write():
            tool = self.get_tool(name)
            if tool is None:
                raise KeyError(f"no tool named {name!r} in {self.path}; see `nexus tools list`")
            n = self._insert_examples(tool, texts, source, time.time())
            if source == "learned":
                self.db.execute(
                    "DELETE FROM examples WHERE tool = ? AND source = 'learned' AND text NOT IN (SELECT text FROM "
                    "examples WHERE tool = ? AND source = 'learned' ORDER BY created_at DESC, rowid DESC LIMIT ?)",
                    (name, name, cap))
        return n

    def remove_examples(self, name: str, texts: Iterable[str] | None = None, source: str | None = None) -> int:
        """Delete examples of `name` (all, those with these texts, and/or of one source); returns how many."""
        sql, args = "DELETE FROM examples WHERE tool = ?", [name]
        if source is not None:
            sql, args = sql + " AND source = ?", [*args, source]
        with self._write():
            if texts is None:
                return self.db.execute(sql, args).rowcount
            return sum(self.db.execute(sql + " AND text = ?", [*args, normalize_example(t)]).rowcount for t in texts)

    def examples(self, name: str | None = None) -> dict[str, list[Example]]:
        """tool name -> its valid examples for its current schema (all tools, or only `name`), templates first,
        then user, then learned, each in insertion order. A row that fails its checksum is never returned: it
        is deleted, the tool's templates are rebuilt from its schema (valid user and learned rows stay) and an
        ExamplesCorruptWarning names the tool. Rows of an older schema hash are dropped."""
        import warnings

        where, args = ("WHERE e.tool = ?", (name,)) if name is not None else ("", ())
        rows = self.db.execute(
            "SELECT e.rowid, e.tool, e.text, e.source, e.schema_hash, e.checksum, t.schema_hash FROM examples e "
            f"LEFT JOIN tools t ON t.name = e.tool {where} ORDER BY e.tool, "
            "CASE e.source WHEN 'template' THEN 0 WHEN 'user' THEN 1 ELSE 2 END, e.created_at, e.rowid", args,
        ).fetchall()
        corrupt: dict[int, str] = {}  # rowid -> tool
        drop: list[int] = []
        for rowid, tool, text, source, h, checksum, current in rows:
            if not all(isinstance(v, str) for v in (tool, text, source, h, checksum)) or \
                    checksum != example_checksum(tool, h, source, text) or source not in SOURCES:
                corrupt[rowid] = tool if isinstance(tool, str) else "?"
            elif h != current:
                drop.append(rowid)
        if corrupt or drop:
            with self._write():
                for rowid in [*corrupt, *drop]:
                    self.db.execute("DELETE FROM examples WHERE rowid = ?", (rowid,))
                for tool in set(corrupt.values()):
                    t = self.get_tool(tool)
                    if t is not None:
                        self._insert_templates(t, time.time())
            for tool in sorted(set(corrupt.values())):
                warnings.warn(f"registry {self.path}: stored examples of tool {tool!r} failed their checksum "
                              "(damaged): they were not used, were deleted, and the templated examples were rebuilt "
                              f"from the schema; re-add lost ones with `nexus tools examples add {tool} ...`",
                              ExamplesCorruptWarning, stacklevel=2)
            return self.examples(name)
        out: dict[str, list[Example]] = {}
        for _, tool, text, source, h, _, _ in rows:
            out.setdefault(tool, []).append(Example(text, source, h))
        return out

    # -- derived artefacts ----------------------------------------------------------------------------
    def mark_fresh(self, tool_name: str, kind: str, schema_hash: str) -> None:
        """Record that the artefact `kind` (e.g. "embedding", "kv_block") of `tool_name` was built from
        `schema_hash`. Building from an outdated tool is allowed; it simply stays stale."""
        with self._write():
            self.db.execute(
                "INSERT INTO artefacts(tool, kind, schema_hash, updated_at) VALUES (?,?,?,?) "
                "ON CONFLICT(tool, kind) DO UPDATE SET schema_hash=excluded.schema_hash, "
                "updated_at=excluded.updated_at",
                (tool_name, kind, schema_hash, time.time()),
            )

    def stale_tools(self, kind: str) -> list[Tool]:
        """Tools whose `kind` artefact is missing or was built from another schema hash, sorted by name."""
        rows = self.db.execute(
            "SELECT t.data FROM tools t LEFT JOIN artefacts a ON a.tool = t.name AND a.kind = ? "
            "WHERE a.schema_hash IS NULL OR a.schema_hash != t.schema_hash ORDER BY t.name",
            (kind,),
        ).fetchall()
        return [load_tool(r[0]) for r in rows]
