"""The two-stage scan (PCA-rotated coarse block + exact rescore) against the float32 reference, the
buffer format that stores it, and the router's choice of path by size."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from slb.buffer import MAGIC, BufferData, BufferMismatchError, SLBuffer, quantize_rows, write_buffer
from slb.index import ScanIndex
from slb.scan import quantization_bound, quantize_query
from slb.tools import as_entry
from slb.twostage import COARSE_DIM, fit_rotation

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "routing"


def _unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _two_stage(x, kc=COARSE_DIM, shortlist=256):
    rot = fit_rotation(x)
    y8, sc = quantize_rows(x @ rot.T)
    return ScanIndex(np.ascontiguousarray(y8[:, :kc]), sc, np.ascontiguousarray(y8[:, kc:]), rot, shortlist), rot


def _agreement(x, q, ix, rot, k=5):
    """Share of queries whose two-stage top-1 is the float32 top-1; asserts every score is within the
    quantization bound of the exact float score of the row it names."""
    exact = q @ x.T
    s, ids = ix.scan_batch(q, k)
    top2 = -np.sort(-exact, axis=1)[:, :2]
    for j in range(len(q)):
        bound = quantization_bound(ix.scales, float(quantize_query(rot @ q[j])[1]), x.shape[1])
        assert np.all(np.abs(s[j] - exact[j, ids[j]]) <= bound)
        assert np.all(np.diff(s[j]) <= 0)
        if ids[j, 0] != exact[j].argmax():  # only a genuine INT8 near-tie may flip the top-1
            assert top2[j, 0] - exact[j, ids[j, 0]] <= 2 * bound
    return float(np.mean(ids[:, 0] == exact.argmax(axis=1)))


def test_rotation_is_orthogonal_and_orders_variance():
    x = _unit(np.random.default_rng(0), 500, 64) * np.linspace(3, 0.1, 64, dtype=np.float32)
    r = fit_rotation(x)
    np.testing.assert_allclose(r @ r.T, np.eye(64), atol=1e-5)
    var = ((x - x.mean(0)) @ r.T).var(axis=0)
    assert np.all(np.diff(var) <= 1e-6)


@pytest.mark.skipif(not (DATA / "tools.jsonl").exists(), reason="public routing catalogue not present")
def test_two_stage_matches_float_on_minilm_catalogue(embedder):
    """Real MiniLM embeddings of the public catalogue and real queries; a shortlist of 20 of 300 rows (the
    production ratio, 256 of 4096), float32 as the reference."""
    tools = [json.loads(line) for line in (DATA / "tools.jsonl").read_text().splitlines()]
    queries = [json.loads(line) for line in (DATA / "queries.jsonl").read_text().splitlines()][:120]
    gold = {q["gold_tool"] for q in queries}
    rng = np.random.default_rng(0)
    rest = [t for t in tools if t["name"] not in gold]
    chosen = [t for t in tools if t["name"] in gold] + [rest[i] for i in rng.permutation(len(rest))[: 300 - len(gold)]]
    x = embedder.embed_tools([as_entry(t) for t in chosen])
    q = embedder.embed_texts([r["query"] for r in queries])
    ix, rot = _two_stage(x, shortlist=20)
    assert ix.two_stage and ix.lead.shape == (300, COARSE_DIM)
    # every flip is checked above to be a genuine INT8 near-tie; how many such ties the 120 queries hold moves
    # with the embeddings' last float bits (2 in isolation, 3 after the whole suite ran in the same process)
    assert _agreement(x, q, ix, rot) >= 0.95


@pytest.mark.parametrize("n,noise", [(5000, 0.05), (5000, 0.5)])
def test_two_stage_matches_single_pass_on_random_data(n, noise):
    rng = np.random.default_rng(n)
    x = _unit(rng, n, 384)
    q = x[rng.integers(0, n, 40)] + noise * _unit(rng, 40, 384)
    q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
    ix, rot = _two_stage(x)
    plain = ScanIndex(ix.rows(), ix.scales)  # same rotated rows, single pass over all dims
    s2, i2 = ix.scan_batch(q, 5)
    s1, i1 = plain.scan_batch((q @ rot.T).astype(np.float32), 5)
    hit = np.mean(i2[:, 0] == i1[:, 0])
    assert hit >= (1.0 if noise < 0.1 else 0.9)
    same = i2[:, 0] == i1[:, 0]  # scores agree up to one rounding step of the (differently rotated) query
    np.testing.assert_allclose(s2[same, 0], s1[same, 0], atol=2e-3)
    assert _agreement(x, q, ix, rot) >= (1.0 if noise < 0.1 else 0.9)


def test_two_stage_buffer_round_trip_and_old_version_rejected(tmp_path):
    rng = np.random.default_rng(3)
    x = _unit(rng, 300, 32)
    rot = fit_rotation(x)
    y8, sc = quantize_rows(x @ rot.T)
    names = [f"t{i}" for i in range(300)]
    path = write_buffer(tmp_path / "b.slb", BufferData("m#r", 32, names, names, y8, sc, {}, rot, 8))
    buf = SLBuffer(path, model_id="m#r", dim=32)
    assert buf.index.two_stage and buf.index.lead.shape == (300, 8) and buf.index.tail.shape == (300, 24)
    np.testing.assert_allclose(buf.index.rows_f32(), x, atol=float(sc.max()) * 3)
    assert buf.index.scan(x[7], 1)[1][0] == 7
    blob = bytearray(path.read_bytes())
    blob[len(MAGIC): len(MAGIC) + 2] = struct.pack("<H", 1)
    (tmp_path / "old.slb").write_bytes(bytes(blob))
    with pytest.raises(BufferMismatchError, match="version 1.*nexus slb build"):
        SLBuffer(tmp_path / "old.slb")


def test_build_switches_to_two_stage_above_threshold(embedder, tmp_path, monkeypatch):
    import slb.build

    from .conftest import QUERIES, TOOLS

    monkeypatch.setattr(slb.build, "TWO_STAGE_MIN_ROWS", 10)  # 12 hand-written tools: over the line
    buf = SLBuffer(slb.build.build_buffer(TOOLS, embedder, tmp_path / "b.slb").path, model_id=embedder.model_id)
    assert buf.index.two_stage
    q = embedder.embed_texts([t for t, _ in QUERIES])
    assert [buf.names[i] for i in buf.index.scan_batch(q, 1)[1][:, 0]] == [g for _, g in QUERIES]
    monkeypatch.setattr(slb.build, "TWO_STAGE_MIN_ROWS", 16_384)  # rebuild below it: plain rows again
    slb.build.build_buffer(TOOLS, embedder, tmp_path / "b.slb")
    assert not SLBuffer(tmp_path / "b.slb").index.two_stage
