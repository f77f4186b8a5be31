"""Several rows per tool: the grouped Numba scan against the float reference, the two-stage path, the buffer
file round trip and incremental rebuilds with example rows."""

from __future__ import annotations

import numpy as np
import pytest

from slb.buffer import BufferData, BufferMismatchError, SLBuffer, quantize_rows, write_buffer
from slb.build import build_buffer
from slb.embedder import Embedder, EmbedderConfig
from slb.index import ScanIndex
from slb.scan import quantization_bound, quantize_query, scan, scan_batch
from slb.tools import ToolEntry, as_entry
from slb.twostage import fit_rotation

from .conftest import TOOLS


def _unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _groups(rng, tools, max_rows):
    return np.repeat(np.arange(tools, dtype=np.int32), rng.integers(1, max_rows + 1, tools))


@pytest.mark.parametrize("tools,max_rows,d", [(1, 3, 8), (9, 4, 16), (250, 5, 384), (700, 6, 64)])
def test_grouped_scan_scores_a_tool_by_its_best_row(tools, max_rows, d):
    rng = np.random.default_rng(tools)
    row_tool = _groups(rng, tools, max_rows)
    x = _unit(rng, len(row_tool), d)
    q = x[rng.integers(0, len(x), 10)] + 0.05 * _unit(rng, 10, d)
    q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
    m8, sc = quantize_rows(x)
    s8, i8 = scan_batch(m8, sc, q, 5, "numba", row_tool=row_tool)
    sf, i_f = scan_batch(m8, sc, q, 5, "numpy", row_tool=row_tool)
    deq = (m8.astype(np.float32) * sc[:, None]) @ q.T  # (R, B) float scores of the dequantized rows
    best = np.full((tools, len(q)), -np.inf, np.float32)
    np.maximum.at(best, row_tool, deq)  # slow reference: best row per tool, by a plain scatter-max
    for j in range(len(q)):
        assert len(set(i8[j].tolist())) == len(i8[j]), "a tool appears once"
        assert np.all(np.diff(s8[j]) <= 0)
        bound = quantization_bound(sc, float(quantize_query(q[j])[1]), d)  # int8 rounding of the query and rows
        assert np.all(np.abs(s8[j] - best[i8[j], j]) <= bound)
        np.testing.assert_allclose(sf[j], best[i_f[j], j], atol=1e-5)
        if sf.shape[1] == 1 or sf[j, 0] - sf[j, 1] > 2 * bound:
            assert i8[j, 0] == i_f[j, 0]
    s1, i1 = scan(m8, sc, q[0], 5, row_tool=row_tool)
    np.testing.assert_array_equal(i1, i8[0])
    index = ScanIndex(m8, sc, row_tool=row_tool)
    assert len(index) == tools and index.n_rows == len(row_tool)
    si, ii = index.scan(q[0], 5)
    np.testing.assert_array_equal(ii, i8[0])


def test_one_row_per_tool_grouped_equals_plain():
    rng = np.random.default_rng(3)
    x = _unit(rng, 300, 32)
    m8, sc = quantize_rows(x)
    q = _unit(rng, 4, 32)
    a = scan_batch(m8, sc, q, 7)
    b = scan_batch(m8, sc, q, 7, row_tool=np.arange(300, dtype=np.int32))
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(a[0], b[0])


def test_two_stage_keeps_each_tools_best_row_once():
    rng = np.random.default_rng(5)
    tools, d = 2000, 96
    row_tool = _groups(rng, tools, 4)
    x = _unit(rng, len(row_tool), d)
    rot = fit_rotation(x)
    y8, ys = quantize_rows(x @ rot.T)
    kc = 32
    two = ScanIndex(np.ascontiguousarray(y8[:, :kc]), ys, np.ascontiguousarray(y8[:, kc:]), rot, 512, row_tool)
    plain = ScanIndex(y8, ys, row_tool=row_tool)  # same rotated rows, single pass
    for j in range(20):
        qr = x[rng.integers(0, len(x))] + 0.1 * _unit(rng, 1, d)[0]
        qr = (qr / np.linalg.norm(qr)).astype(np.float32)
        s2, i2 = two.scan(qr, 5)
        sp, ip = plain.scan((rot @ qr).astype(np.float32), 5)
        assert len(set(i2.tolist())) == 5
        assert i2[0] == ip[0]
        np.testing.assert_allclose(s2[0], sp[0], atol=2e-3)


def test_row_tool_must_be_contiguous():
    m8, sc = quantize_rows(np.eye(4, dtype=np.float32))
    for bad in ([0, 1, 0, 1], [1, 1, 2, 2], [0, 2, 2, 3]):
        with pytest.raises(ValueError, match="row_tool"):
            ScanIndex(m8, sc, row_tool=np.array(bad, np.int32))


def test_buffer_round_trip_with_example_rows_and_checksum(tmp_path):
    rng = np.random.default_rng(0)
    row_tool = np.array([0, 0, 0, 1, 2, 2], np.int32)
    m8, sc = quantize_rows(rng.standard_normal((6, 16)).astype(np.float32))
    keys = ["ha", "ex:1", "ex:2", "hb", "hc", "ex:3"]
    data = BufferData("m#r", 16, list("abc"), ["ha", "hb", "hc"], m8, sc, {}, row_tool=row_tool, row_keys=keys)
    path = write_buffer(tmp_path / "b.slb", data)
    buf = SLBuffer(path, model_id="m#r", dim=16)
    assert len(buf) == 3 and len(buf.index) == 3 and buf.index.n_rows == 6 and buf.row_keys == keys
    np.testing.assert_array_equal(buf.index.row_tool, row_tool)
    np.testing.assert_array_equal(buf.data().row_tool, row_tool)
    raw = bytearray(path.read_bytes())
    raw[buf.header["row_tool_offset"]] ^= 0x01  # row 0 now names tool 1: caught by the checksum
    path.write_bytes(bytes(raw))
    with pytest.raises(BufferMismatchError, match="checksum"):
        SLBuffer(path, model_id="m#r", dim=16)


def test_build_adds_example_rows_and_reuses_them(tmp_path):
    emb = Embedder(EmbedderConfig())
    tools = [as_entry(t) for t in TOOLS[:4]]
    path = tmp_path / "b.slb"
    first = build_buffer(tools, emb, path)
    assert first.rows == 4 and SLBuffer(path).index.row_tool is None  # no examples: one row per tool
    with_ex = [ToolEntry(t.name, t.description, t.input_schema, t.schema_hash,
                         (f"please run {t.name}", f"please run  {t.name}", "x" * (i + 1))) for i, t in enumerate(tools)]
    second = build_buffer(with_ex, emb, path)
    assert second.rows == 12 and second.examples_embedded == 8 and second.embedded == 0  # duplicates merged
    buf = SLBuffer(path, model_id=emb.model_id)
    assert buf.index.row_tool.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    q = emb.embed_query(f"please run {tools[2].name}")
    s, ids = buf.index.scan(q, 2)
    assert ids[0] == 2 and s[0] > 0.95  # the example row matches its own text
    third = build_buffer(with_ex, emb, path)
    assert third.examples_embedded == 0 and third.embedded == 0
