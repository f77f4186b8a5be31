"""`route(query) -> RouteDecision`: scan, gate, rerank (cosine fused with BM25 and, if weighted, a cross-encoder)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from slb.duplicates import duplicate_map, margin_to_distinct
from slb.embedder import Embedder
from slb.gate import GateConfig, fused_scores
from slb.index import ScanIndex
from slb.lexical import LexicalIndex
from slb.reranker import Reranker
from slb.tools import ToolEntry, lexical_text, tool_text

PATHS = ("auto", "rerank", "none")


@dataclass
class RouteDecision:
    """The router's answer. tool: chosen tool name (None for path "none"); score: top-1 cosine of the scan;
    margin: top-1 cosine − the cosine of the first candidate that is not a near-duplicate of the top-1
    (slb.duplicates); duplicates: candidates that are near-duplicates of the chosen tool, as (name, cosine
    between the two tools): when not empty the choice among them is arbitrary;
    path: auto | rerank | none; candidates: [(name, cosine, cross-encoder logit or
    None, BM25 or None)] best first by the scan (logit: only when the cross-encoder ran; BM25: on the rerank
    path); timings: milliseconds per stage (embed, scan, rerank, total)."""

    tool: str | None
    score: float
    margin: float
    path: str
    candidates: list[tuple[str, float, float | None, float | None]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    duplicates: list[tuple[str, float]] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"tool": self.tool, "score": self.score, "margin": self.margin, "path": self.path,
                "candidates": [list(c) for c in self.candidates], "timings": self.timings,
                "duplicates": [list(d) for d in self.duplicates]}


class Router:
    """Routes queries over one buffer's `ScanIndex` (slb.index: `ScanIndex(m8, scales)` for plain (N, D) int8
    rows, `SLBuffer.index` for a buffer file) with tool texts for the reranker.

    mode: "gate" (auto / rerank / none as calibrated), "embed" (always the scan's top-1, no floor),
    "rerank" (fused order for every query that passes the floor). duplicates: (a, b, cosine) near-duplicate
    pairs of tool indices (SLBuffer.duplicates; slb.duplicates), None for none.
    """

    def __init__(self, embedder: Embedder, index: ScanIndex, tools: list[ToolEntry],
                 gate: GateConfig | None = None, reranker: Reranker | None = None, mode: str = "gate",
                 lexical: LexicalIndex | None = None, duplicates=None):
        if len(tools) != len(index):
            raise ValueError(f"{len(tools)} tools for {len(index)} buffer rows: rebuild the buffer")
        if mode not in ("gate", "embed", "rerank"):
            raise ValueError(f"unknown router mode {mode!r}")
        self.embedder, self.index, self.tools = embedder, index, tools
        self.gate = gate or GateConfig()
        self.reranker, self.mode = reranker, mode
        self._texts = [tool_text(t, embedder.config.recipe) for t in tools]
        if lexical is not None and len(lexical) != len(tools):
            raise ValueError(f"lexical index of {len(lexical)} rows for {len(tools)} tools")
        self.lexical = lexical if lexical is not None else LexicalIndex([lexical_text(t) for t in tools])
        self.duplicates = duplicate_map(duplicates or [])
        self._pos = {t.name: i for i, t in enumerate(tools)}

    def route(self, query: str, qvec: np.ndarray | None = None) -> RouteDecision:
        """Decide for one query; `qvec` (D,) float32 skips the embedding (evals embed in batches)."""
        t0 = time.perf_counter()
        if qvec is None:
            qvec = self.embedder.embed_query(query)
        t1 = time.perf_counter()
        s, ids = self.index.scan(qvec, self.gate.k)
        t2 = time.perf_counter()
        top1 = float(s[0])
        margin = margin_to_distinct(s, ids, self.duplicates)
        cands = [(self.tools[i].name, float(v), None, None) for v, i in zip(s, ids)]
        timings = {"embed_ms": (t1 - t0) * 1e3, "scan_ms": (t2 - t1) * 1e3, "rerank_ms": 0.0}
        if self.mode == "embed":
            tool, path = cands[0][0], "auto"
        elif top1 + self.gate.none_margin * margin < self.gate.floor:
            tool, path = None, "none"
        elif self.mode == "gate" and margin > self.gate.tau:
            tool, path = cands[0][0], "auto"
        else:  # fused order: cosine + lex_weight * BM25 / max BM25 (+ ce_weight * cross-encoder logit)
            lex = self.lexical.scores(query, ids)
            logits = None
            if self.reranker is not None and self.gate.ce_weight > 0:
                logits = self.reranker.score(query, [self._texts[i] for i in ids])
            cands = [(n, v, None if logits is None else float(logits[j]), float(lex[j]))
                     for j, (n, v, _, _) in enumerate(cands)]
            fused = fused_scores(s, lex, logits, self.gate.lex_weight, self.gate.ce_weight)
            tool, path = cands[int(np.argmax(fused))][0], "rerank"
            timings["rerank_ms"] = (time.perf_counter() - t2) * 1e3
        timings["total_ms"] = (time.perf_counter() - t0) * 1e3
        mine = self.duplicates.get(self._pos[tool], {}) if tool is not None else {}
        dups = [(self.tools[int(i)].name, mine[int(i)]) for i in ids if int(i) in mine]
        return RouteDecision(tool, top1, margin, path, cands, timings, dups)
