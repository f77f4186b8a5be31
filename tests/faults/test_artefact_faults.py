"""Damaged files Nexus wrote earlier: KV blocks fall back to text prefill, buffers and a locked registry give
clear errors. Nothing damaged is ever used, and nothing the user had is lost."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from registry.model import Tool
from registry.store import RegistryBusyError, RegistryStore
from slb.buffer import BufferData, BufferMismatchError, SLBuffer, quantize_rows, write_buffer
from splice.block import BlockError, load_block
from splice.compiler import block_key, compile_blocks
from splice.profile import SpliceProfile
from splice.prompt import preamble_tokens, segment_tokens
from splice.splicer import splice_tool

TOOL = Tool.from_mcp({"name": "fs.stat", "description": "Size and modification time of a file in the workspace.",
                      "inputSchema": {"type": "object", "required": ["path"],
                                      "properties": {"path": {"type": "string", "description": "relative path"}}}})
ALWAYS_SPLICE = SpliceProfile(backend="llamacpp", fingerprint="", curve=[(1 << 20, 0)], max_depth=1 << 20)


def _flip(path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


def _edit_header(path, old: bytes, new: bytes) -> None:
    data = path.read_bytes()
    assert len(old) == len(new) and old in data[:4096]
    path.write_bytes(data.replace(old, new, 1))


DAMAGE = {
    "truncated": ("KV block truncated",
                  lambda p, h: p.write_bytes(p.read_bytes()[: p.stat().st_size * 2 // 3]), "bytes"),
    "bit_flip": ("KV block bit-flipped", lambda p, h: _flip(p, p.stat().st_size - 777), "checksum"),
    "other_model": ("KV block from another model",
                    lambda p, h: _edit_header(p, h["fingerprint"].encode(), b"f" * len(h["fingerprint"])),
                    "fingerprint"),
    "older_format": ("KV block in an older format",
                     lambda p, h: _edit_header(p, b'"format_version": 2', b'"format_version": 1'), "format"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_block_falls_back_to_text(llamacpp_backend, fault, damage):
    name, inject, why = DAMAGE[damage]
    f = fault(name, "splice.block / splicer", "load refused (BlockError); splice falls back to text prefill")
    b = llamacpp_backend
    path = compile_blocks(b, [TOOL], progress=False)[0]
    header, _ = load_block(path, block_key(b, TOOL))
    inject(path, header)
    with pytest.raises(BlockError, match=why):
        load_block(path, block_key(b, TOOL))
    pre, seg = preamble_tokens(b.tokenizer), segment_tokens(b.tokenizer, TOOL)
    s = b.new_session(n_ctx=len(pre) + len(seg) + 8)
    try:
        s.prefill(pre)
        res = splice_tool(s, b, TOOL, depth=0, profile=ALWAYS_SPLICE)
        assert res.fallback and why in res.fallback and "recompile" in res.fallback
        assert res.redecoded == res.n_tokens == len(seg) and s.n_past == len(pre) + len(seg)
    finally:
        s.close()
    f.observe(f"BlockError ({why}); text prefill of all {len(seg)} tokens")


def _buffer(path, model_id="minilm-test", dim=8, n=5):
    rng = np.random.default_rng(0)
    q, sc = quantize_rows(rng.standard_normal((n, dim)))
    return write_buffer(path, BufferData(model_id, dim, [f"t{i}" for i in range(n)], ["h"] * n, q, sc))


BUFFER_DAMAGE = {
    "other_embedder": ("SLB buffer from another embedder", lambda p: None, dict(model_id="other-model"), "embedder"),
    "other_dim": ("SLB buffer with another dimension", lambda p: None, dict(dim=384), "384-d"),
    "truncated": ("SLB buffer truncated", lambda p: p.write_bytes(p.read_bytes()[:-16]), {}, "truncated"),
    "header_garbled": ("SLB buffer header bit-flipped", lambda p: _flip(p, 20), {}, "checksum"),
    "scale_bit_flip": ("SLB buffer data bit-flipped", lambda p: _flip(p, p.stat().st_size - 1), {}, "checksum"),
    "newer_format": ("SLB buffer from a newer format", lambda p: _flip(p, 6), {}, "format version"),
}


@pytest.mark.parametrize("damage", list(BUFFER_DAMAGE))
def test_mismatched_buffer_is_refused(tmp_path, fault, damage):
    name, inject, expect, why = BUFFER_DAMAGE[damage]
    f = fault(name, "slb.buffer", "BufferMismatchError naming the file and `nexus slb build`")
    path = _buffer(tmp_path / "tools.slb")
    SLBuffer(path, model_id="minilm-test", dim=8)  # intact: opens
    inject(path)
    with pytest.raises(BufferMismatchError, match=why) as e:
        SLBuffer(path, **{"model_id": "minilm-test", "dim": 8, **expect})
    assert str(path) in str(e.value) and "slb build" in str(e.value)
    f.observe(f"BufferMismatchError: {str(e.value).split(': ', 1)[-1][:70]}")


HOLDER = textwrap.dedent("""
    import sqlite3, sys, time
    db = sqlite3.connect(sys.argv[1], isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    db.execute("INSERT INTO servers (name, command, cwd, registered_at, updated_at) "
               "VALUES ('holder', 'true', NULL, 0, 0)")
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    db.execute("COMMIT")
""")


def _hold_lock(path, seconds: float) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "locked"
    return p


def test_registry_locked_short_wait_gives_clear_error(nexus_home, fault):
    f = fault("registry locked by another writer (past timeout)", "registry.store",
              "RegistryBusyError saying nothing changed; retry succeeds; both writes kept")
    with RegistryStore() as store:
        store.add_tools([TOOL])
        holder = _hold_lock(store.path, 3.0)
        try:
            with RegistryStore(busy_timeout_s=0.3) as impatient:
                with pytest.raises(RegistryBusyError, match="nothing was changed"):
                    impatient.upsert_server("mine", "python -m x")
        finally:
            assert holder.wait(30) == 0
        with RegistryStore(busy_timeout_s=0.3) as retry:
            retry.upsert_server("mine", "python -m x")
        names = {s.name for s in store.list_servers()}
        assert names == {"holder", "mine"} and store.get_tool(TOOL.name) is not None
    f.observe("RegistryBusyError; retry ok; holder's and our rows both present", lost=0)


def test_registry_locked_briefly_waits_and_succeeds(nexus_home, fault):
    f = fault("registry locked by another writer (within timeout)", "registry.store",
              "the write waits on the lock, then commits; both writes kept")
    with RegistryStore() as store:
        holder = _hold_lock(store.path, 1.0)
        try:
            report = store.add_tools([TOOL])  # default busy timeout (30 s) outlasts the holder
        finally:
            assert holder.wait(30) == 0
        assert report.added == [TOOL.name]
        assert {s.name for s in store.list_servers()} == {"holder"} and store.get_tool(TOOL.name)
    f.observe("waited for the lock, then committed; both rows present", lost=0)


EXAMPLE_DAMAGE = {
    "text_changed": ("example row text changed on disk", "UPDATE examples SET text = 'delete all files' "
                                                         "WHERE rowid = (SELECT MIN(rowid) FROM examples)"),
    "checksum_garbled": ("example row checksum garbled", "UPDATE examples SET checksum = 'x' || substr(checksum, 2) "
                                                            "WHERE source = 'template'"),
    "source_changed": ("example row source changed", "UPDATE examples SET source = 'learned' "
                                                      "WHERE source = 'template'"),
}


@pytest.mark.parametrize("damage", list(EXAMPLE_DAMAGE))
def test_corrupt_examples_are_reported_and_rebuilt(nexus_home, fault, damage):
    import sqlite3

    from registry.examples import template_examples
    from registry.store import ExamplesCorruptWarning

    name, sql = EXAMPLE_DAMAGE[damage]
    f = fault(name, "registry.store examples", "ExamplesCorruptWarning; damaged rows never returned; rebuilt")
    with RegistryStore() as store:
        store.add_tools([{**TOOL.to_mcp(), "examples": ["how big is notes.txt"]}])
        intact = store.examples()["fs.stat"]
        path = store.path
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(sql)
    db.close()
    with RegistryStore() as store:
        with pytest.warns(ExamplesCorruptWarning, match="fs.stat.*checksum"):
            got = store.examples()["fs.stat"]
        assert "delete all files" not in [e.text for e in got]
        expected = template_examples(TOOL.name, TOOL.description, TOOL.input_schema)
        # the same rows as before the damage (a rebuilt template sorts after the kept ones of its source)
        assert sorted((e.source, e.text) for e in got) == sorted((e.source, e.text) for e in intact)
        assert sorted(e.text for e in got) == sorted([*expected, "how big is notes.txt"])
        again = store.examples()["fs.stat"]  # rebuilt rows are valid: no second warning
        assert [e.text for e in again] == [e.text for e in got]
    f.observe(f"ExamplesCorruptWarning; damaged rows dropped, {len(expected)} templates rebuilt, user example kept")
