"""Two-stage scan for large buffers: a coarse PCA block picks a shortlist, all dims rescore it exactly.

At 100k tools x 384 dims the single-pass int8 scan reads 38 MB per query and is memory-bandwidth bound on
one core. Rows are stored in a PCA-rotated basis (an orthogonal rotation fitted on the registry's own
embeddings at build time: dot products are preserved, so the exact score is unchanged up to INT8 rounding),
split into a contiguous `lead` block (N, kc) of the kc highest-variance coordinates and a `tail` block
(N, D - kc) of the rest. Per query:

    y = R @ q                      (D, D) x (D,): the query is rotated once (counted in the scan time)
    stage 1: lead @ y8[:kc]        int8 x int8 -> int32 over kc dims; a min-heap keeps the `short` best rows
    stage 2: lead[r] . y8[:kc] + tail[r] . y8[kc:] for the shortlisted rows: the same int32 score the
             single-pass kernel computes on the rotated rows; fused top-k.

With several rows per tool (`row_tool`, see slb.scan) the shortlist holds rows and stage 2 offers each
rescored row under its tool id, keeping a tool's best row only (a tool appears once in the top-k).

Stage 2 is exact, so the result differs from a full scan only when the true best row is not in the
shortlist (tested on real MiniLM embeddings in tests/slb/test_twostage.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from slb.scan import _BLOCK, _dot_block, _offer, _quantize_into

COARSE_DIM = 64  # lead-block width: 64 of 384 int8 coordinates = 1/6 of the bytes read in stage 1
SHORTLIST = 256  # rows rescored exactly in stage 2
TWO_STAGE_MIN_ROWS = 16_384  # fewer rows: the single-pass kernel, as fast or faster there (`nexus eval scan`)


def fit_rotation(x: np.ndarray) -> np.ndarray:
    """(N, D) float rows -> (D, D) float32 orthogonal R whose rows are the principal directions of the
    centred rows, highest variance first (y = R @ x puts the most informative coordinates first)."""
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or len(x) < 2:
        raise ValueError(f"a rotation needs at least 2 rows of (N, D), got {x.shape}")
    xc = x - x.mean(axis=0)
    w, v = np.linalg.eigh(xc.T @ xc)  # ascending eigenvalues, columns = eigenvectors
    return np.ascontiguousarray(v[:, ::-1].T, np.float32)


@njit(cache=True, nogil=True, fastmath=True, boundscheck=False)
def _rotate_into(rot, q, y):
    # y (D,) = rot (D, D) @ q (D,), float32
    d = q.shape[0]
    for i in range(d):
        a = np.float32(0.0)
        for c in range(d):
            a += rot[i, c] * q[c]
        y[i] = a


@njit(cache=True, nogil=True, fastmath=True, boundscheck=False)
def _heap_replace_min(hs, hi, n, s, r):
    # min-heap (hs, hi)[:n] keyed on hs: replace the root with (s, r) and sift down
    j = 0
    while True:
        c = 2 * j + 1
        if c >= n:
            break
        if c + 1 < n and hs[c + 1] < hs[c]:
            c += 1
        if hs[c] >= s:
            break
        hs[j] = hs[c]
        hi[j] = hi[c]
        j = c
    hs[j] = s
    hi[j] = r


@njit(cache=True, nogil=True, fastmath=True, boundscheck=False)
def _heap_push(hs, hi, n, s, r):
    # push (s, r) onto the min-heap (hs, hi)[:n] (sift up); the heap then holds n + 1 entries
    j = n
    while j > 0:
        p = (j - 1) // 2
        if hs[p] <= s:
            break
        hs[j] = hs[p]
        hi[j] = hi[p]
        j = p
    hs[j] = s
    hi[j] = r


@njit(cache=True, nogil=True, fastmath=True, boundscheck=False)
def _rescore(lead, tail, q16, ids, h, acc):
    # acc[j] = lead[ids[j]] . q16[:kc] + tail[ids[j]] . q16[kc:] (int32) for j < h; kept apart from the
    # float top-k so that both dot products vectorize
    kc = lead.shape[1]
    qt = q16[kc:]
    dt = tail.shape[1]
    for j in range(h):
        r = ids[j]
        a = np.int32(0)
        for c in range(kc):
            a += np.int32(np.int16(lead[r, c]) * q16[c])
        b = np.int32(0)
        for c in range(dt):
            b += np.int32(np.int16(tail[r, c]) * qt[c])
        acc[j] = a + b


@njit(cache=True, nogil=True, fastmath=True, boundscheck=False)
def _offer_unique(top_s, top_i, filled, s, t):
    # offer tool t with score s to the sorted top-k (k,) holding `filled` entries, each tool at most once
    # (a better score replaces the tool's entry); returns the new fill
    for j in range(filled):
        if top_i[j] == t:
            if s <= top_s[j]:
                return filled
            for m in range(j, filled - 1):  # drop the old entry, then insert as new
                top_s[m] = top_s[m + 1]
                top_i[m] = top_i[m + 1]
            filled -= 1
            top_s[filled] = -np.inf
            top_i[filled] = -1
            break
    return _offer(top_s, top_i, filled, s, t)


@njit(cache=True, nogil=True, fastmath=True, boundscheck=False)
def _two_stage_into(rot, lead, tail, scales, row_tool, q, y, q16, acc, hs, hi, top_s, top_i):
    # rot (D, D) f32; lead (N, kc) int8; tail (N, D - kc) int8; scales (N,) f32; row_tool (N,) int32 tool
    # of each row; q (D,) f32 unit query. Scratch: y (D,) f32, q16 (D,) int16, acc (_BLOCK,) int32, heap
    # hs/hi (L,). Out: top_s/top_i (k,) tool scores and ids, best first. Returns the filled top-k slots.
    n, kc = lead.shape
    _rotate_into(rot, q, y)
    qscale = _quantize_into(y, q16)
    short = hs.shape[0]
    h = 0
    for b0 in range(0, n, _BLOCK):  # stage 1: coarse scores, min-heap of the `short` best
        b1 = min(n, b0 + _BLOCK)
        _dot_block(lead, q16, b0, b1, acc)  # lead (N, kc): only q16[:kc] is read
        for r in range(b0, b1):
            s = np.float32(acc[r - b0]) * scales[r]
            if h < short:
                _heap_push(hs, hi, h, s, r)
                h += 1
            elif s > hs[0]:
                _heap_replace_min(hs, hi, h, s, r)
    k = top_s.shape[0]
    for j in range(k):
        top_s[j] = -np.inf
        top_i[j] = -1
    _rescore(lead, tail, q16, hi, h, acc)  # stage 2: exact int32 scores on all dims for the shortlist
    filled = 0
    for j in range(h):
        s = np.float32(acc[j]) * scales[hi[j]] * qscale
        filled = _offer_unique(top_s, top_i, filled, s, row_tool[hi[j]])
    return filled
