"""The on-disk embedding store (slb.embed_store) on real SQLite files: vectors come back as stored, only for the
model id that stored them; bad rows and a corrupt file are ignored, not errors; two processes write at once; and
an Embedder with a store embeds a tool once across instances (what `nexus serve` and `nexus mcp` share)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

from slb.embed_store import EmbeddingStore
from slb.embedder import Embedder, EmbedderConfig
from slb.tools import as_entry

from .conftest import TOOLS

ROOT = Path(__file__).resolve().parents[2]


def unit_rows(n: int, dim: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    x = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return {f"h{seed}-{i}": v for i, v in enumerate(x)}


def test_vectors_come_back_for_their_model_id_only(tmp_path):
    store = EmbeddingStore(tmp_path / "e.sqlite")
    rows = unit_rows(5)
    assert store.put("model-a#schema", rows) == 5
    got = store.get("model-a#schema", [*rows, "unknown"], 8)
    assert sorted(got) == sorted(rows)
    for h, v in rows.items():
        np.testing.assert_array_equal(got[h], v)
    assert store.get("model-b#schema", list(rows), 8) == {}  # another model or recipe: nothing
    assert store.get("model-a#schema", list(rows), 16) == {}  # another dimension: nothing
    assert store.get("model-a#schema", [], 8) == {}


def test_a_row_that_does_not_decode_is_ignored_and_written_again(tmp_path):
    path = tmp_path / "e.sqlite"
    store = EmbeddingStore(path)
    rows = unit_rows(3)
    store.put("m", rows)
    a, b, c = rows
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE vectors SET vec = ? WHERE hash = ?", (b"\0" * 5, a))  # torn
        conn.execute("UPDATE vectors SET vec = ? WHERE hash = ?", ((rows[b] * 3).tobytes(), b))  # not unit length
        conn.execute("UPDATE vectors SET vec = ? WHERE hash = ?", (np.full(8, np.nan, np.float32).tobytes(), c))
    assert store.get("m", list(rows), 8) == {}
    store.put("m", rows)
    assert sorted(store.get("m", list(rows), 8)) == sorted(rows)


def test_a_corrupt_file_is_moved_aside_and_the_store_starts_empty(tmp_path, capsys):
    path = tmp_path / "e.sqlite"
    path.write_bytes(b"this is not a database " * 400)
    store = EmbeddingStore(path)
    assert store.get("m", ["h"], 8) == {}
    assert (tmp_path / "e.sqlite.corrupt").read_bytes().startswith(b"this is not")
    assert "moved it to e.sqlite.corrupt" in capsys.readouterr().err
    rows = unit_rows(2)
    assert store.put("m", rows) == 2 and len(store.get("m", list(rows), 8)) == 2


def test_an_unwritable_store_is_skipped_with_one_warning(tmp_path, capsys):
    store = EmbeddingStore(tmp_path / "no-such-folder" / "e.sqlite")
    assert store.put("m", unit_rows(2)) == 0 and store.get("m", ["h0-0"], 8) == {}
    assert store.disabled and capsys.readouterr().err.count("not used") == 1


def test_least_recently_used_rows_go_beyond_max_rows(tmp_path):
    store = EmbeddingStore(tmp_path / "e.sqlite", max_rows=5)
    old, new = unit_rows(3, seed=1), unit_rows(4, seed=2)
    store.put("m", old)
    store.put("m", new)
    assert len(store) == 5
    assert sorted(store.get("m", list(new), 8)) == sorted(new)  # the newest rows are kept


WRITER = """
import sys
import numpy as np
from slb.embed_store import EmbeddingStore
store, who = EmbeddingStore(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(int(who == "b"))
for batch in range(40):
    x = rng.normal(size=(10, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    assert store.put("m", {f"{who}-{batch}-{i}": v for i, v in enumerate(x)}) == 10
    shared = {f"shared-{i}": np.eye(8, dtype=np.float32)[i] for i in range(8)}  # both write the same rows
    assert store.put("m", shared) == 8
    assert len(store.get("m", list(shared), 8)) == 8
assert store.disabled is None
"""


def test_two_processes_write_at_once(tmp_path):
    path = tmp_path / "e.sqlite"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), who], cwd=ROOT, stderr=subprocess.PIPE)
             for who in ("a", "b")]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    store = EmbeddingStore(path)
    want = [f"{who}-{b}-{i}" for who in "ab" for b in range(40) for i in range(10)] + [f"shared-{i}" for i in range(8)]
    assert len(store) == len(want) and len(store.get("m", want, 8)) == len(want)


def test_a_store_opened_while_another_process_creates_it_waits_for_the_lock(tmp_path):
    """The race of two processes creating the file at once (1 writer process in 80 on fresh files here; once in a
    clean clone's run of the test above): the other holds a write lock on the new file, still in rollback mode, and
    SQLite refuses the switch to WAL at once, without the busy timeout. The store waits for the lock instead of
    turning itself off."""
    path = tmp_path / "e.sqlite"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE t (x)")
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO t VALUES (1)")
    with sqlite3.connect(path) as probe:  # what the store meets: the switch fails without waiting
        try:
            probe.execute("PRAGMA journal_mode=WAL")
            raise AssertionError("SQLite switched to WAL under another connection's write lock")
        except sqlite3.OperationalError as e:
            assert "locked" in str(e)
    release = threading.Timer(0.5, lambda: other.execute("COMMIT"))
    release.start()
    store = EmbeddingStore(path)
    rows = unit_rows(4)
    try:
        assert store.put("m", rows) == 4
    finally:
        release.join()
        other.close()
    assert store.disabled is None and sorted(store.get("m", list(rows), 8)) == sorted(rows)


def test_an_embedder_with_a_store_embeds_a_tool_once_across_instances(tmp_path):
    store = EmbeddingStore(tmp_path / "e.sqlite")
    tools = [as_entry(t) for t in TOOLS]
    first = Embedder(store=store)
    x = first.embed_tools(tools)
    assert (first.last.embedded, first.last.stored, first.tools_embedded) == (len(tools), 0, len(tools))
    second = Embedder(store=store)  # a restart: a new process would hold nothing in memory either
    y = second.embed_tools(tools + tools[:2])
    assert (second.last.tools, second.last.embedded, second.last.stored) == (len(tools), 0, len(tools))
    np.testing.assert_array_equal(x, y[: len(tools)])
    other = Embedder(EmbedderConfig(recipe="name_desc"), store=store)  # another recipe is another model id
    other.embed_tools(tools[:3])
    assert other.last.embedded == 3 and len(store) == len(tools) + 3


def test_the_registry_build_shares_the_home_store(nexus_home):
    """`slb.service.build` (what `nexus register`, `nexus run` and `nexus mcp` rebuild with) embeds into the home
    store; a build whose buffer is gone takes every vector from it."""
    from registry.store import RegistryStore
    from slb.service import buffer_path, build

    with RegistryStore() as store:
        store.add_tools(TOOLS)
        first = build(store)
        assert (first.embedded, first.from_store) == (len(TOOLS), 0)
        assert len(EmbeddingStore(nexus_home / "slb" / "embeddings.sqlite")) == len(TOOLS)
        buffer_path().unlink()
        again = build(store)
        assert (again.embedded, again.from_store, again.reused) == (0, len(TOOLS), 0)
