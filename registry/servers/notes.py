"""Notes MCP server: short notes kept in SQLite (`--db FILE`, default `$NEXUS_HOME/notes.sqlite`).

Handlers run in worker threads (registry.servers.runtime), so each thread opens its own connection to the file;
SQLite's locking (busy timeout 30 s) orders their writes.
"""

from __future__ import annotations

import argparse
import sqlite3
import threading

from registry.decorator import tool
from registry.home import home_path
from registry.servers.runtime import ToolInputError, add_transport_arguments, handlers_from_functions, serve

DB_PATH: str | None = None  # set by main()
_LOCAL = threading.local()


def _db() -> sqlite3.Connection:
    """This thread's connection to the notes file."""
    assert DB_PATH is not None, "notes server not started through main()"
    if getattr(_LOCAL, "db", None) is None:
        _LOCAL.db = sqlite3.connect(DB_PATH, timeout=30)
    return _LOCAL.db


def _row(r) -> dict:
    return {"id": r[0], "title": r[1], "body": r[2], "tags": [t for t in r[3].split(",") if t]}


@tool
def add_note(title: str, body: str, tags: list[str] | None = None) -> dict:
    """Save a new note and return its id."""
    with _db():
        cur = _db().execute("INSERT INTO notes(title, body, tags) VALUES (?,?,?)", (title, body, ",".join(tags or [])))
    return {"id": cur.lastrowid}


@tool
def get_note(note_id: int) -> dict:
    """Fetch one note by id."""
    r = _db().execute("SELECT id, title, body, tags FROM notes WHERE id = ?", (note_id,)).fetchone()
    if r is None:
        raise ToolInputError(f"no note with id {note_id}; search_notes lists ids")
    return _row(r)


@tool
def search_notes(query: str = "", tag: str | None = None) -> dict:
    """Find notes whose title or body contains text, optionally with a tag; ordered by id."""
    rows = _db().execute(
        "SELECT id, title, body, tags FROM notes WHERE (title LIKE ?1 OR body LIKE ?1) ORDER BY id", (f"%{query}%",)
    ).fetchall()
    notes = [_row(r) for r in rows]
    return {"notes": [n for n in notes if tag is None or tag in n["tags"]]}


@tool
def delete_note(note_id: int) -> dict:
    """Delete a note by id."""
    with _db():
        cur = _db().execute("DELETE FROM notes WHERE id = ?", (note_id,))
    if cur.rowcount == 0:
        raise ToolInputError(f"no note with id {note_id}")
    return {"deleted": note_id}


FUNCTIONS = [add_note, get_note, search_notes, delete_note]


def main(argv: list[str] | None = None) -> None:
    global DB_PATH
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None, help="SQLite file (default: $NEXUS_HOME/notes.sqlite)")
    add_transport_arguments(parser)
    args = parser.parse_args(argv)
    if args.db is None:
        args.db = str(home_path("notes.sqlite"))
    DB_PATH = args.db
    with _db():
        _db().execute("CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, title TEXT, body TEXT, tags TEXT)")
    serve("notes", handlers_from_functions(FUNCTIONS), args=args)


if __name__ == "__main__":
    main()
