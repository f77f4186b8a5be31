"""The Numba INT8 scan against the NumPy float32 reference on random and real (MiniLM) data."""

from __future__ import annotations

import numpy as np
import pytest

from slb.buffer import quantize_rows
from slb.scan import quantization_bound, quantize_query, scan, scan_batch
from slb.tools import as_entry

from .conftest import QUERIES, TOOLS


def _unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _check_equivalent(x, q, k):
    m8, sc = quantize_rows(x)
    s8, i8 = scan_batch(m8, sc, q, k, "numba")
    sf, i_f = scan_batch(m8, sc, q, k, "numpy", f32=x)
    exact = q @ x.T  # float32 scores of every row
    for j in range(len(q)):
        bound = quantization_bound(sc, float(quantize_query(q[j])[1]), x.shape[1])
        # scores within the quantization bound of the exact float scores of the rows they name
        assert np.all(np.abs(s8[j] - exact[j, i8[j]]) <= bound)
        assert np.all(np.diff(s8[j]) <= 0), "top-k must be sorted best first"
        # same top-1 unless the float top-2 lie within two bounds of each other (a genuine near-tie)
        if sf.shape[1] == 1 or sf[j, 0] - sf[j, 1] > 2 * bound:
            assert i8[j, 0] == i_f[j, 0]
    return s8, i8, sf, i_f


@pytest.mark.parametrize("n,d", [(1, 8), (7, 16), (250, 384), (3000, 384)])
def test_numba_matches_float_reference_on_random_data(n, d):
    rng = np.random.default_rng(n)
    x = _unit(rng, n, d)
    q = x[rng.integers(0, n, 12)] + 0.05 * _unit(rng, 12, d)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    s8, i8, sf, i_f = _check_equivalent(x, q.astype(np.float32), k=5)
    assert s8.shape == (12, min(5, n))


def test_numba_matches_float_reference_on_minilm_embeddings(embedder):
    tools = [as_entry(t) for t in TOOLS]
    x = embedder.embed_tools(tools)
    q = embedder.embed_texts([q for q, _ in QUERIES])
    s8, i8, sf, i_f = _check_equivalent(x, q, k=3)
    assert (i8[:, 0] == i_f[:, 0]).all()  # real queries here have clear winners


def test_single_equals_batched_and_handles_k_larger_than_n():
    rng = np.random.default_rng(1)
    x = _unit(rng, 40, 32)
    m8, sc = quantize_rows(x)
    q = _unit(rng, 5, 32)
    sb, ib = scan_batch(m8, sc, q, 50)
    assert sb.shape == (5, 40) and sorted(ib[0].tolist()) == list(range(40))
    for j in range(5):
        s, i = scan(m8, sc, q[j], 50)
        np.testing.assert_array_equal(i, ib[j])
        np.testing.assert_allclose(s, sb[j], rtol=1e-6)


def test_batched_over_many_blocks_matches_single():
    rng = np.random.default_rng(2)
    x = _unit(rng, 2000, 64)  # > one 512-row block, with a partial tail
    m8, sc = quantize_rows(x)
    q = _unit(rng, 3, 64)
    sb, ib = scan_batch(m8, sc, q, 7)
    for j in range(3):
        np.testing.assert_array_equal(scan(m8, sc, q[j], 7)[1], ib[j])


def test_scan_rejects_wrong_dimension_and_backend():
    m8, sc = quantize_rows(_unit(np.random.default_rng(0), 4, 16))
    with pytest.raises(ValueError, match="dimension"):
        scan(m8, sc, np.ones(8, np.float32), 2)
    with pytest.raises(ValueError, match="backend"):
        scan(m8, sc, np.ones(16, np.float32), 2, backend="cuda")


def test_threads_share_one_index():
    """Threads scanning one ScanIndex at once each get their own query's top-k (per-thread scratch buffers)."""
    import sys
    import threading

    from slb.index import ScanIndex

    rng = np.random.default_rng(3)
    m = rng.normal(size=(300, 64)).astype(np.float32)
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    m8, sc = quantize_rows(m)
    index = ScanIndex(m8, sc)
    queries = m[rng.choice(300, 8, replace=False)]
    want = [index.scan(q, 5) for q in queries]
    bad = []

    def work(j):
        for _ in range(400):
            s, i = index.scan(queries[j], 5)
            if not np.array_equal(i, want[j][1]):
                bad.append(j)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: a shared buffer would be overwritten
    try:
        threads = [threading.Thread(target=work, args=(j,)) for j in range(len(queries))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not bad
