"""Tool embeddings kept on disk, so that a tool is embedded once per embedder, not once per process.

One SQLite file in the Nexus home (`$NEXUS_HOME/slb/embeddings.sqlite`) maps (embedder model id, tool schema hash)
to the tool's L2-normalized float32 vector. The model id names the model, its INT8 setting and the tool-text
recipe together (`slb.embedder.Embedder.model_id`), so a vector is only ever reused by the embedder that made it.
`nexus serve`, `nexus mcp` and the registry's buffer build all reach it through `Embedder.embed_tools`.

It is a cache: a row that does not decode (wrong length, not finite, not unit length) is ignored and written
again; a file that is not a database is moved aside (`.corrupt`) and started anew; a store that cannot be read or
written (read-only home, full disk) is skipped with one warning, never an error. The file is in WAL mode with a
busy timeout, so several processes read and write it at once; each write is one transaction (all rows or none).
Beyond `max_rows` the least recently used rows are dropped.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from pathlib import Path

import numpy as np

from registry.sqlite_wal import use_wal

DEFAULT_MAX_ROWS = 50_000  # ~80 MB of 384-d float32 rows; the public catalogue is 2,052 tools
BUSY_TIMEOUT_S = 30.0
TOUCH_AFTER_S = 3600.0  # a read refreshes a row's last-used time at most once an hour (reads stay reads)
_SCHEMA = """CREATE TABLE IF NOT EXISTS vectors (
    model TEXT NOT NULL, hash TEXT NOT NULL, dim INTEGER NOT NULL, vec BLOB NOT NULL, used REAL NOT NULL,
    PRIMARY KEY (model, hash)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS vectors_used ON vectors (used);"""


def store_path() -> Path:
    """`$NEXUS_HOME/slb/embeddings.sqlite` (the folder is created)."""
    from registry.home import home_path

    return home_path("slb", "embeddings.sqlite")


class EmbeddingStore:
    """`get(model_id, hashes, dim)` -> the stored vectors among `hashes`; `put(model_id, vectors)` stores some.

    Opens one short-lived connection per call, so an instance may be shared by threads and processes.
    """

    def __init__(self, path: str | Path | None = None, max_rows: int = DEFAULT_MAX_ROWS):
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.path = Path(path) if path is not None else store_path()
        self.max_rows = max_rows
        self.disabled: str | None = None  # why the store is skipped in this process, once it failed

    # -- connection -----------------------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            use_wal(conn, BUSY_TIMEOUT_S)
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
        except BaseException:
            conn.close()
            raise
        return conn

    def _run(self, work, default):
        """`work(conn)` on a fresh connection; a corrupt file is moved aside once and the work retried; any other
        failure disables the store for this process (one warning) and returns `default`. Locks wait on the busy
        timeout, the switch to WAL of a file another process is creating included (`registry.sqlite_wal`)."""
        if self.disabled:
            return default
        for attempt in (0, 1):
            try:
                conn = self._connect()
                try:
                    return work(conn)
                finally:
                    conn.close()
            except sqlite3.DatabaseError as e:
                corrupt = "not a database" in str(e) or "malformed" in str(e)
                if attempt == 0 and corrupt and self._move_aside():
                    continue
                self._disable(f"{type(e).__name__}: {e}")
                return default
            except OSError as e:
                self._disable(f"{type(e).__name__}: {e}")
                return default
        return default

    def _move_aside(self) -> bool:
        try:
            self.path.replace(self.path.with_name(self.path.name + ".corrupt"))
            for side in ("-wal", "-shm"):
                self.path.with_name(self.path.name + side).unlink(missing_ok=True)
        except OSError:
            return False
        print(f"nexus: {self.path} was not a readable SQLite file; moved it to {self.path.name}.corrupt and "
              "started an empty embedding store", file=sys.stderr, flush=True)
        return True

    def _disable(self, why: str) -> None:
        self.disabled = why
        print(f"nexus: embedding store {self.path} not used ({why}); tools are embedded in memory only",
              file=sys.stderr, flush=True)

    # -- rows -----------------------------------------------------------------------------------------------
    def get(self, model_id: str, hashes: list[str], dim: int) -> dict[str, np.ndarray]:
        """{schema hash: (dim,) float32 unit vector} for the `hashes` stored for `model_id` and valid."""
        hashes = list(dict.fromkeys(hashes))
        if not hashes:
            return {}

        def work(conn):
            rows = []
            for i in range(0, len(hashes), 500):  # under SQLite's bound-parameter limit
                part = hashes[i:i + 500]
                rows += conn.execute(f"SELECT hash, dim, vec, used FROM vectors WHERE model = ? AND hash IN "
                                     f"({','.join('?' * len(part))})", [model_id, *part]).fetchall()
            found, stale = {}, []
            now = time.time()
            for h, d, blob, used in rows:
                v = _decode(blob, d, dim)
                if v is not None:
                    found[h] = v
                    if now - used > TOUCH_AFTER_S:
                        stale.append(h)
            if stale:
                with _write(conn):
                    conn.executemany("UPDATE vectors SET used = ? WHERE model = ? AND hash = ?",
                                     [(now, model_id, h) for h in stale])
            return found

        return self._run(work, {})

    def put(self, model_id: str, vectors: dict[str, np.ndarray]) -> int:
        """Store `vectors` ({schema hash: (D,) float32}) for `model_id` in one transaction; returns rows written."""
        if not vectors:
            return 0
        now = time.time()
        rows = [(model_id, h, int(v.shape[0]), np.ascontiguousarray(v, "<f4").tobytes(), now)
                for h, v in vectors.items()]

        def work(conn):
            with _write(conn):
                conn.executemany("INSERT OR REPLACE INTO vectors (model, hash, dim, vec, used) VALUES (?, ?, ?, ?, ?)",
                                 rows)
                extra = conn.execute("SELECT COUNT(*) FROM vectors").fetchone()[0] - self.max_rows
                if extra > 0:  # least recently used first
                    conn.execute("DELETE FROM vectors WHERE (model, hash) IN (SELECT model, hash FROM vectors "
                                 "ORDER BY used LIMIT ?)", (extra,))
            return len(rows)

        return self._run(work, 0)

    def __len__(self) -> int:
        return self._run(lambda conn: conn.execute("SELECT COUNT(*) FROM vectors").fetchone()[0], 0)


class _write:
    """`BEGIN IMMEDIATE` ... `COMMIT` (or `ROLLBACK` on an error): the write lock is taken up front, so two
    writers queue on the busy timeout instead of failing on a lock upgrade."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self):
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind, value, tb):
        self.conn.execute("COMMIT" if kind is None else "ROLLBACK")
        return False


def _decode(blob: bytes, dim: int, want: int) -> np.ndarray | None:
    """The stored vector, or None when it is not `want` finite float32 values of unit length."""
    if dim != want or not isinstance(blob, bytes) or len(blob) != 4 * want:
        return None
    v = np.frombuffer(blob, "<f4").astype(np.float32)
    if not np.isfinite(v).all() or abs(float(v @ v) - 1.0) > 1e-3:
        return None
    return v
