"""`ScanIndex`: the rows the router scans, and the one place that picks the scan path for them.

Two layouts, one API (`scan`, `scan_batch`):
- plain (rotation None): `lead` is the whole (N, D) int8 matrix and `tail` is (N, 0); the single-pass
  kernel of slb.scan runs on it (small registries: no query rotation, ~microseconds).
- rotated (two-stage, N >= slb.twostage.TWO_STAGE_MIN_ROWS at build time): rows are stored as R @ x,
  `lead` (N, kc) holds the kc leading PCA coordinates and `tail` (N, D - kc) the rest; the query is rotated
  once and slb.twostage scans `lead` for a shortlist, then rescores it on all dims.

Several rows per tool (`row_tool`, see slb.scan): the index counts tools, `scan` returns tool ids and a tool
scores its best row (the grouped single-pass kernel, or the two-stage path offering rows under their tool).

`scan` writes into scratch buffers owned by the index, one set per thread (no allocation per call after a
thread's first), and returns copies of the (k,) results, so threads may share one index.
"""

from __future__ import annotations

import threading

import numpy as np

from slb.scan import _BLOCK, _check, _scan_groups_into, _scan_into, check_row_tool, scan_batch
from slb.twostage import SHORTLIST, _two_stage_into


class ScanIndex:
    """lead (N, kc) int8, scales (N,) float32, tail (N, D - kc) int8 or None, rotation (D, D) float32 or
    None (plain rows), shortlist: rows rescored exactly by the two-stage path; row_tool (N,) int32 tool of
    each row (None: one row per tool)."""

    def __init__(self, lead: np.ndarray, scales: np.ndarray, tail: np.ndarray | None = None,
                 rotation: np.ndarray | None = None, shortlist: int = SHORTLIST, row_tool: np.ndarray | None = None):
        n = lead.shape[0]
        self.row_tool = row_tool
        self.n_tools = n if row_tool is None else check_row_tool(row_tool, n)
        # the two-stage kernel always maps rows to tools: identity when there is one row per tool
        self._row_tool = row_tool if row_tool is not None else np.arange(n, dtype=np.int32)
        self.tail = tail if tail is not None else np.zeros((n, 0), np.int8)
        self.dim = lead.shape[1] + self.tail.shape[1]
        if rotation is not None and rotation.shape != (self.dim, self.dim):
            raise ValueError(f"rotation must be ({self.dim}, {self.dim}), got {rotation.shape}: rebuild the buffer")
        if rotation is None and self.tail.shape[1]:
            raise ValueError("a split (lead, tail) layout needs its rotation: rebuild the buffer")
        _check(lead, scales, lead.shape[1], 1)
        if self.tail.shape[0] != n or self.tail.dtype != np.int8:
            raise ValueError(f"tail must be ({n}, D - kc) int8, got {self.tail.shape} {self.tail.dtype}")
        if shortlist < 1:
            raise ValueError(f"shortlist must be >= 1, got {shortlist}")
        self.lead, self.scales, self.rotation = lead, np.ascontiguousarray(scales, np.float32), rotation
        self.shortlist = max(1, min(shortlist, n, _BLOCK))  # stage 2 scores land in the (_BLOCK,) scratch
        self._local = threading.local()  # .scratch: this thread's _Scratch

    @property
    def two_stage(self) -> bool:
        return self.rotation is not None

    def __len__(self) -> int:
        """Number of tools (rows when there is one row per tool)."""
        return self.n_tools

    @property
    def n_rows(self) -> int:
        return self.lead.shape[0]

    def rows(self) -> np.ndarray:
        """(N, D) int8 rows in the stored basis (rotated when `two_stage`); a copy when split."""
        return self.lead if not self.tail.shape[1] else np.hstack([self.lead, self.tail])

    def rows_f32(self) -> np.ndarray:
        """(N, D) float32 dequantized rows in the embedder's basis (the rotation undone)."""
        x = self.rows().astype(np.float32) * self.scales[:, None]
        return x @ self.rotation if self.rotation is not None else x

    def scan(self, q: np.ndarray, k: int = 5) -> tuple[np.ndarray, np.ndarray]:
        """Top-k tools for one (D,) float32 unit query: (scores (k',) float32 best first, ids (k',) int64 tool
        ids), k' = min(k, tools); a tool scores its best row. Scores are cosines up to INT8 rounding (see
        slb.scan.quantization_bound)."""
        s = self._local.__dict__.get("scratch")
        if s is None:
            s = self._local.scratch = _Scratch(self.dim, self.shortlist)
        if k != s.k:
            if not (q.ndim == 1 and q.shape[0] == self.dim):
                _check(self.lead, self.scales, q.shape[-1], k)  # raises with an actionable message
            s.k = k
            kk = min(_check(self.lead, self.scales, self.lead.shape[1], k), self.n_tools)
            s.top_s, s.top_i = np.empty(kk, np.float32), np.empty(kk, np.int64)
        if q.dtype != np.float32 or q.ndim != 1 or q.shape[0] != self.dim or not q.flags.c_contiguous:
            q = np.ascontiguousarray(q, np.float32)
            if q.shape != (self.dim,):
                raise ValueError(f"query dimension {q.shape} does not match the buffer's {self.dim}: "
                                 "was it embedded by the same model?")
        if self.rotation is None and self.row_tool is None:
            _scan_into(self.lead, self.scales, q, s.q16, s.acc, s.top_s, s.top_i)
        elif self.rotation is None:
            _scan_groups_into(self.lead, self.scales, self.row_tool, q, s.q16, s.acc, s.top_s, s.top_i)
        else:
            _two_stage_into(self.rotation, self.lead, self.tail, self.scales, self._row_tool, q, s.y, s.q16, s.acc,
                            s.hs, s.hi, s.top_s, s.top_i)
        return s.top_s.copy(), s.top_i.copy()

    def scan_batch(self, queries: np.ndarray, k: int = 5) -> tuple[np.ndarray, np.ndarray]:
        """(B, D) float32 queries -> (scores (B, k'), ids (B, k')), as `scan` per query."""
        queries = np.ascontiguousarray(np.atleast_2d(queries), np.float32)
        if self.rotation is None:
            return scan_batch(self.lead, self.scales, queries, k, row_tool=self.row_tool)
        out = [self.scan(q, k) for q in queries]
        return np.stack([s for s, _ in out]), np.stack([i for _, i in out])


class _Scratch:
    """One thread's scan buffers: the int16 query (D,), int32 accumulators (_BLOCK,), the rotated query (D,),
    the shortlist (shortlist,) and the top-k results (k',) of the last k asked for."""

    def __init__(self, dim: int, shortlist: int):
        self.q16 = np.empty(dim, np.int16)
        self.acc = np.empty(_BLOCK, np.int32)
        self.y = np.empty(dim, np.float32)
        self.hs = np.empty(shortlist, np.float32)
        self.hi = np.empty(shortlist, np.int64)
        self.k = 0
        self.top_s = self.top_i = np.empty(0)
