"""Top-k scan of a query against the INT8 buffer: a Numba kernel and a NumPy float32 reference.

Both paths sit behind `scan()` / `scan_batch()` and return the same thing: the k best rows by cosine score,
best first. The Numba path quantizes the query to int8, multiplies it with the int8 rows in int16 products
summed in int32, a block of 512 rows at a time into a 2 KiB scratch, then updates a small sorted top-k from
that block (fused: no N-sized score vector is ever written). The reference is a float32 BLAS matmul over the
float32 matrix (or the dequantized buffer) followed by argpartition.

Scores are cosines in [-1, 1] (float32): row i scores `dot(q8, m8[i]) * row_scale[i] * query_scale`.

Several rows per tool (its description plus example requests): `row_tool` (R,) int32 names the tool of each
row, rows of one tool contiguous and tools numbered 0..T-1 in order. The grouped kernel scores a tool by its
best row inside the block loop (a running max over the tool's rows, offered to the top-k when the next tool
starts) and returns tool ids, not row ids.
"""

from __future__ import annotations

import numpy as np
from numba import njit

BACKENDS = ("numba", "numpy")


@njit(cache=True, nogil=True, fastmath=True, boundscheck=False)
def _topk_insert(top_s, top_i, n_top, s, i):  # keeps top_s sorted descending, length n_top
    j = n_top - 1
    while j > 0 and top_s[j - 1] < s:
        top_s[j] = top_s[j - 1]
        top_i[j] = top_i[j - 1]
        j -= 1
    top_s[j] = s
    top_i[j] = i


@njit(cache=True, nogil=True, fastmath=True, boundscheck=False)
def _quantize_into(q, q16):
    # q: (D,) float32 -> q16 (D,) int16 holding int8 values; returns the query scale (float32)
    d = q.shape[0]
    amax = np.float32(0.0)
    for c in range(d):
        a = abs(q[c])
        if a > amax:
            amax = a
    scale = amax / np.float32(127.0) if amax > 0 else np.float32(1.0)
    inv = np.float32(1.0) / scale
    for c in range(d):
        v = np.rint(q[c] * inv)
        q16[c] = np.int16(min(127.0, max(-127.0, v)))
    return scale


_BLOCK = 512  # rows per dot-product block: its 512 int32 accumulators (2 KiB) stay in L1 between the two phases


@njit(cache=True, nogil=True, fastmath=True, boundscheck=False)
def _dot_block(m8, q16, r0, r1, acc):
    # acc[: r1 - r0] = m8[r0:r1] @ q16 (int32). int16 products (|127 * 127| fits int16) summed in int32:
    # LLVM turns this into vpmaddwd. Kept apart from the float top-k, which otherwise stops vectorization.
    d = m8.shape[1]
    for r in range(r0, r1):
        a = np.int32(0)
        for c in range(d):
            a += np.int32(np.int16(m8[r, c]) * q16[c])
        acc[r - r0] = a


@njit(cache=True, nogil=True, fastmath=True, boundscheck=False)
def _scan_rows(m8, scales, q16, qscale, r0, r1, top_s, top_i, filled, acc):
    # rows [r0, r1) of m8 (N, D) int8 against q16 (D,); updates the sorted top-k (k,) in place, block by
    # block (fused: no N-sized score vector); returns how many top-k slots are filled.
    k = top_s.shape[0]
    thresh = top_s[k - 1] if filled == k else np.float32(-np.inf)
    for b0 in range(r0, r1, _BLOCK):
        b1 = min(r1, b0 + _BLOCK)
        _dot_block(m8, q16, b0, b1, acc)
        for r in range(b0, b1):
            s = np.float32(acc[r - b0]) * scales[r] * qscale
            if filled < k:
                filled += 1
                _topk_insert(top_s, top_i, filled, s, r)
                if filled == k:
                    thresh = top_s[k - 1]
            elif s > thresh:
                _topk_insert(top_s, top_i, k, s, r)
                thresh = top_s[k - 1]
    return filled


@njit(cache=True, nogil=True, fastmath=True, boundscheck=False)
def _offer(top_s, top_i, filled, s, i):
    # offer (s, i) to the sorted top-k (k,) holding `filled` entries; returns the new fill
    k = top_s.shape[0]
    if filled < k:
        filled += 1
        _topk_insert(top_s, top_i, filled, s, i)
    elif s > top_s[k - 1]:
        _topk_insert(top_s, top_i, k, s, i)
    return filled


@njit(cache=True, nogil=True, fastmath=True, boundscheck=False)
def _scan_groups_into(m8, scales, row_tool, q, q16, acc, top_s, top_i):
    # m8 (R, D) int8, scales (R,) f32, row_tool (R,) int32 non-decreasing tool ids, q (D,) f32 unit query.
    # Scratch q16 (D,) int16, acc (_BLOCK,) int32; out top_s/top_i (k,): the k best tools by their best row.
    qscale = _quantize_into(q, q16)
    for j in range(top_s.shape[0]):
        top_s[j] = -np.inf
        top_i[j] = -1
    n = m8.shape[0]
    filled = 0
    cur = -1
    best = np.float32(-np.inf)
    for b0 in range(0, n, _BLOCK):
        b1 = min(n, b0 + _BLOCK)
        _dot_block(m8, q16, b0, b1, acc)
        for r in range(b0, b1):
            s = np.float32(acc[r - b0]) * scales[r] * qscale
            t = row_tool[r]
            if t != cur:
                if cur >= 0:
                    filled = _offer(top_s, top_i, filled, best, cur)
                cur = t
                best = s
            elif s > best:
                best = s
    if cur >= 0:
        filled = _offer(top_s, top_i, filled, best, cur)
    return filled


@njit(cache=True, nogil=True, fastmath=True, boundscheck=False)
def _scan_one(m8, scales, q, k):
    # m8 (N, D) int8, scales (N,) float32, q (D,) float32 -> (scores (k,) float32, ids (k,) int64)
    q16 = np.empty(q.shape[0], np.int16)
    qscale = _quantize_into(q, q16)
    top_s = np.full(k, -np.inf, np.float32)
    top_i = np.full(k, -1, np.int64)
    acc = np.empty(_BLOCK, np.int32)
    _scan_rows(m8, scales, q16, qscale, 0, m8.shape[0], top_s, top_i, 0, acc)
    return top_s, top_i


@njit(cache=True, nogil=True, fastmath=True, boundscheck=False)
def _scan_into(m8, scales, q, q16, acc, top_s, top_i):
    # _scan_one into caller-owned scratch q16 (D,) int16, acc (_BLOCK,) int32 and outputs top_s/top_i (k,):
    # no allocation on the hot path (slb.index.ScanIndex keeps these buffers per index).
    qscale = _quantize_into(q, q16)
    for j in range(top_s.shape[0]):
        top_s[j] = -np.inf
        top_i[j] = -1
    return _scan_rows(m8, scales, q16, qscale, 0, m8.shape[0], top_s, top_i, 0, acc)


@njit(cache=True, nogil=True, fastmath=True, boundscheck=False)
def _scan_many(m8, scales, qs, k):
    # qs (B, D) float32 -> (B, k) scores and ids; rows are walked in blocks of 512 so that one block stays
    # in L2 while every query passes over it (the matrix is read from memory once, not B times).
    b, d = qs.shape
    n = m8.shape[0]
    q16 = np.empty((b, d), np.int16)
    qscale = np.empty(b, np.float32)
    for j in range(b):
        qscale[j] = _quantize_into(qs[j], q16[j])
    top_s = np.full((b, k), -np.inf, np.float32)
    top_i = np.full((b, k), -1, np.int64)
    filled = np.zeros(b, np.int64)
    acc = np.empty(_BLOCK, np.int32)
    for r0 in range(0, n, 512):
        r1 = min(n, r0 + 512)
        for j in range(b):
            filled[j] = _scan_rows(m8, scales, q16[j], qscale[j], r0, r1, top_s[j], top_i[j], filled[j], acc)
    return top_s, top_i


def quantize_query(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(D,) or (B, D) float -> (int8 same shape, float32 scale per query) with symmetric max-abs scaling."""
    q = np.asarray(q, np.float32)
    amax = np.abs(q).max(axis=-1, keepdims=True)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q8 = np.clip(np.rint(q / scale), -127, 127).astype(np.int8)
    return q8, scale[..., 0]


def check_row_tool(row_tool: np.ndarray, rows: int) -> int:
    """Validate a (R,) row -> tool map (int32, starts at 0, steps of 0 or 1: rows of a tool contiguous, no
    tool without a row) and return the number of tools T."""
    if row_tool.shape != (rows,) or row_tool.dtype != np.int32:
        raise ValueError(f"row_tool must be ({rows},) int32, got {row_tool.shape} {row_tool.dtype}")
    if rows and (row_tool[0] != 0 or not np.isin(np.diff(row_tool), (0, 1)).all()):
        raise ValueError("row_tool must number tools 0..T-1 in row order, each tool's rows contiguous: "
                         "rebuild the buffer")
    return int(row_tool[-1]) + 1 if rows else 0


def _check(m8: np.ndarray, scales: np.ndarray, d: int, k: int) -> int:
    if m8.ndim != 2 or m8.dtype != np.int8:
        raise ValueError(f"buffer matrix must be (N, D) int8, got {m8.shape} {m8.dtype}")
    if m8.shape[1] != d:
        raise ValueError(f"query dimension {d} does not match the buffer's {m8.shape[1]}: "
                         "was it embedded by the same model?")
    if scales.shape != (m8.shape[0],):
        raise ValueError(f"scales must be ({m8.shape[0]},), got {scales.shape}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return min(k, m8.shape[0])


def scan_batch(
    m8: np.ndarray, scales: np.ndarray, queries: np.ndarray, k: int = 5, backend: str = "numba",
    f32: np.ndarray | None = None, row_tool: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k rows (or tools) per query.

    m8: (N, D) int8 buffer rows; scales: (N,) float32 per-row scale (row ≈ m8[i] * scales[i]);
    queries: (B, D) float32, L2-normalized; backend "numba" (int8 kernel) or "numpy" (float32 reference:
    `f32` (N, D) float32 if given, else the dequantized buffer, times the float query, by BLAS).
    row_tool: (N,) int32 tool of each row (see the module docstring); then ids are tool ids and a tool scores
    its best row. Returns (scores (B, k') float32 cosines best first, ids (B, k') int64), k' = min(k, N or T).
    """
    queries = np.ascontiguousarray(np.atleast_2d(queries), np.float32)
    k = _check(m8, scales, queries.shape[1], k)
    if row_tool is not None:
        k = min(k, check_row_tool(row_tool, m8.shape[0]))
    if backend == "numba":
        if row_tool is None:
            return _scan_many(m8, scales, queries, k)
        out_s, out_i = np.empty((len(queries), k), np.float32), np.empty((len(queries), k), np.int64)
        q16, acc = np.empty(queries.shape[1], np.int16), np.empty(_BLOCK, np.int32)
        for j, q in enumerate(queries):
            _scan_groups_into(m8, scales, row_tool, q, q16, acc, out_s[j], out_i[j])
        return out_s, out_i
    if backend == "numpy":
        mat = f32 if f32 is not None else m8.astype(np.float32) * scales[:, None]
        s = queries @ mat.T  # (B, N)
        if row_tool is not None:  # best row per tool: (B, T)
            s = np.maximum.reduceat(s, np.flatnonzero(np.r_[True, np.diff(row_tool) != 0]), axis=1)
        part = (np.argpartition(-s, k - 1, axis=1)[:, :k] if k < s.shape[1]
                else np.tile(np.arange(s.shape[1]), (len(s), 1)))
        ps = np.take_along_axis(s, part, axis=1)
        order = np.argsort(-ps, axis=1, kind="stable")
        return np.take_along_axis(ps, order, axis=1), np.take_along_axis(part, order, axis=1).astype(np.int64)
    raise ValueError(f"unknown scan backend {backend!r}; choose one of {BACKENDS}")


def scan(
    m8: np.ndarray, scales: np.ndarray, query: np.ndarray, k: int = 5, backend: str = "numba",
    f32: np.ndarray | None = None, row_tool: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k rows (tools, with `row_tool`) for one (D,) float32 query: (scores (k,) float32 best first,
    ids (k,) int64).

    The Numba path is the hot path of routing: only cheap checks run before the kernel.
    """
    if row_tool is not None:
        s, i = scan_batch(m8, scales, np.asarray(query, np.float32)[None, :], k, backend, f32, row_tool)
        return s[0], i[0]
    if backend == "numba" and query.dtype == np.float32 and query.ndim == 1 and query.shape[0] == m8.shape[1] > 0:
        if 0 < k <= m8.shape[0] and len(scales) == m8.shape[0] and m8.dtype == np.int8:  # cheap checks only
            return _scan_one(m8, scales, query, k)
        return _scan_one(m8, scales, query, _check(m8, scales, query.shape[0], k))
    s, i = scan_batch(m8, scales, np.asarray(query, np.float32)[None, :], k, backend, f32)
    return s[0], i[0]


def quantization_bound(scales: np.ndarray, query_scale: float, d: int) -> float:
    """Upper bound on |int8 score − float score| for unit vectors (rounding ≤ half a step per coordinate).

    |Σ a_c b_c − Σ â_c b̂_c| ≤ Σ |a_c| e_b + |b̂_c| e_a ≤ sqrt(d)·(max(scale)/2 + query_scale/2)·(1 + small).
    """
    return float(np.sqrt(d) * (float(np.max(scales)) + query_scale) / 2 * 1.01)
