"""WAL mode for a SQLite file several Nexus processes open at once (the registry, the embedding store).

A new file starts in rollback mode, and switching it to WAL needs every other connection out of the way: while
another process holds a write lock on it (it is creating the same file), SQLite refuses the switch at once with
"database is locked", without waiting on the busy timeout. `use_wal` switches once, where the file is not in WAL
yet, and waits out such a lock itself.
"""

from __future__ import annotations

import sqlite3
import time


def use_wal(conn: sqlite3.Connection, timeout_s: float) -> None:
    """Put `conn`'s database in WAL mode, retrying a lock for up to `timeout_s` (then the error is raised)."""
    deadline, pause = time.monotonic() + timeout_s, 0.005
    while conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        try:
            conn.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e) or time.monotonic() >= deadline:
                raise
            time.sleep(pause)
            pause = min(2 * pause, 0.25)
