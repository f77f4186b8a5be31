"""The buffer file: memmap round trip, header checks, atomic writes, incremental rebuilds."""

from __future__ import annotations

import numpy as np
import pytest

from slb.buffer import BufferData, BufferMismatchError, SLBuffer, quantize_rows, read_header, write_buffer
from slb.build import build_buffer
from slb.embedder import Embedder, EmbedderConfig
from slb.tools import as_entry

from .conftest import TOOLS


def test_quantize_rows_is_symmetric_and_tight():
    x = np.random.default_rng(0).standard_normal((50, 384)).astype(np.float32)
    q, s = quantize_rows(x)
    assert q.dtype == np.int8 and np.abs(q).max() == 127
    assert np.all(np.abs(q * s[:, None] - x) <= s[:, None] / 2 + 1e-6)


def test_write_then_memmap_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    m8, sc = quantize_rows(rng.standard_normal((5, 16)).astype(np.float32))
    data = BufferData("m#r", 16, list("abcde"), [f"h{i}" for i in range(5)], m8, sc, {"tau": 0.1})
    path = write_buffer(tmp_path / "b.slb", data)
    buf = SLBuffer(path, model_id="m#r", dim=16)
    np.testing.assert_array_equal(buf.m8, m8)
    np.testing.assert_array_equal(buf.scales, sc)
    assert buf.names == list("abcde") and buf.calibration == {"tau": 0.1}
    assert all(buf.header[k] % 64 == 0 for k in ("lead_offset", "tail_offset", "scales_offset"))
    assert [p.name for p in tmp_path.iterdir()] == ["b.slb"]  # no temp file left behind


def test_header_mismatch_is_a_clear_error(tmp_path):
    m8, sc = quantize_rows(np.ones((2, 8), np.float32))
    path = write_buffer(tmp_path / "b.slb", BufferData("model-a#x", 8, ["a", "b"], ["1", "2"], m8, sc))
    with pytest.raises(BufferMismatchError, match="model-a#x.*nexus slb build"):
        SLBuffer(path, model_id="model-b#x")
    with pytest.raises(BufferMismatchError, match="384-d"):
        SLBuffer(path, dim=384)
    (tmp_path / "junk.slb").write_bytes(b"not a buffer at all")
    with pytest.raises(BufferMismatchError, match="not an SLB buffer"):
        read_header(tmp_path / "junk.slb")


def test_incremental_rebuild_reembeds_only_changed_tools(tmp_path, embedder):
    path = tmp_path / "b.slb"
    tools = [as_entry(t) for t in TOOLS]
    fresh = Embedder()  # its own counter
    r1 = build_buffer(tools, fresh, path)
    assert (r1.embedded, r1.reused, r1.rebuilt_from_scratch) == (12, 0, True)
    first = SLBuffer(path)
    row0 = np.array(first.m8[0])
    # unchanged registry: nothing embedded, even by a new embedder process
    r2 = build_buffer(tools, Embedder(), path)
    assert (r2.embedded, r2.reused) == (0, 12)
    # one tool changed, one removed, one added
    changed = dict(TOOLS[1], description="Send a text message to a phone number.")
    new = {"name": "new_tool", "description": "Measure the distance between two GPS points.", "inputSchema": {}}
    r3 = build_buffer([TOOLS[0], changed] + TOOLS[2:11] + [new], Embedder(), path)
    assert (r3.embedded, r3.reused, r3.removed) == (2, 10, 2)
    buf = SLBuffer(path)
    np.testing.assert_array_equal(buf.m8[0], row0)
    assert buf.names[-1] == "new_tool" and "git_commit" not in buf.names


def test_rebuild_with_another_recipe_starts_from_scratch(tmp_path):
    path = tmp_path / "b.slb"
    build_buffer(TOOLS[:3], Embedder(EmbedderConfig(recipe="name_desc")), path)
    r = build_buffer(TOOLS[:3], Embedder(EmbedderConfig(recipe="name_desc_params")), path)
    assert r.rebuilt_from_scratch and r.embedded == 3
    assert SLBuffer(path).model_id.endswith("#name_desc_params")


def test_duplicate_tool_names_are_rejected(tmp_path, embedder):
    with pytest.raises(ValueError, match="duplicate tool names"):
        build_buffer([TOOLS[0], TOOLS[0]], embedder, tmp_path / "b.slb")
