"""The margin gate and the score floor, and how they are calibrated on labelled queries.

auto: top-1 cosine >= floor and (top-1 − top-2) > tau; none: top-1 cosine + none_margin · (top-1 − top-2)
< floor (none_margin 0: the plain score floor); otherwise rerank.

The abstention is fitted on the registry (pick_abstention): relevant queries scored with their tool present
are the positives, and the same queries scored with their tool left out of the candidates are the no-tool
negatives (a tool-like request whose tool is missing: what an irrelevant prompt looks like to the router).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


@dataclass
class GateConfig:
    """tau: margin (cosine units) above which the top-1 is taken without reranking; floor: top-1 cosine
    below which the router answers "none"; k: candidates reranked. Below tau the candidates are ordered by
    cosine + lex_weight * BM25/max(BM25 over the candidates) + ce_weight * cross-encoder logit (slb.lexical;
    the cross-encoder is not called when ce_weight is 0). Both weights are fitted by pick_fusion_weights."""

    tau: float = 0.10
    floor: float = 0.20
    k: int = 10
    lex_weight: float = 0.10
    ce_weight: float = 0.0
    none_margin: float = 0.0  # weight of the margin in the none test (see the module docstring)

    def __post_init__(self) -> None:
        if not -1.0 <= self.floor <= 1.0:
            raise ValueError(f"floor is a cosine in [-1, 1], got {self.floor}")
        if not 0.0 <= self.tau <= 2.0:
            raise ValueError(f"tau is a cosine margin in [0, 2], got {self.tau}")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        for name in ("lex_weight", "ce_weight", "none_margin"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_calibration(cls, cal: dict) -> "GateConfig":
        """The gate stored by `slb calibrate` (defaults for missing keys). A calibration holding only
        `rerank_weight` w (order: logit + w * cosine, no lexical term) is read as ce_weight = 1/w and lex_weight 0,
        the same order (w = 0, logits only, becomes a large ce_weight)."""
        kw = {k: cal[k] for k in ("tau", "floor", "k", "lex_weight", "ce_weight", "none_margin")
              if cal.get(k) is not None}
        if "rerank_weight" in cal and "lex_weight" not in cal and "ce_weight" not in cal:
            w = float(cal["rerank_weight"])
            kw.update(lex_weight=0.0, ce_weight=1.0 / w if w > 0 else 1e6)
        return cls(**kw)


def pick_tau(margins: np.ndarray, correct: np.ndarray, target: float = 0.97, min_auto: int = 5) -> float:
    """Smallest tau such that the queries with margin > tau are top-1 correct with precision >= target.

    margins: (Q,) top-1 − top-2 cosines; correct: (Q,) bool, top-1 is the gold tool. The smallest such tau
    auto-routes the most queries. Returns 2.0 (never auto) when no threshold reaches the target on at least
    `min_auto` queries.
    """
    margins = np.asarray(margins, np.float64)
    correct = np.asarray(correct, bool)
    if margins.shape != correct.shape:
        raise ValueError("margins and correct must have the same shape")
    if not 0 < target <= 1:
        raise ValueError(f"target precision must be in (0, 1], got {target}")
    order = np.argsort(-margins, kind="stable")
    m, c = margins[order], correct[order]
    prec = np.cumsum(c) / np.arange(1, len(c) + 1)  # precision of the top-j margins
    for j in range(len(m) - 1, min_auto - 2, -1):  # largest auto set first
        nxt = m[j + 1] if j + 1 < len(m) else m[j] - 2e-3
        if prec[j] >= target and nxt < m[j]:  # a strict gap separates auto (m[j]) from the rest (nxt)
            return max(0.0, float((m[j] + nxt) / 2))
    return 2.0


def pick_floor(top1_relevant: np.ndarray, recall: float = 0.95) -> float:
    """Top-1 cosine floor that keeps `recall` of relevant queries above it: the (1 − recall) quantile.

    top1_relevant: (Q,) top-1 cosines of queries that do have a tool. Irrelevant prompts are not needed to
    fit it (they are what the floor is evaluated on).
    """
    x = np.asarray(top1_relevant, np.float64)
    if x.size == 0:
        raise ValueError("pick_floor needs at least one relevant query")
    if not 0 < recall <= 1:
        raise ValueError(f"recall must be in (0, 1], got {recall}")
    return float(np.quantile(x, 1 - recall, method="lower"))  # "lower": at least `recall` stay above


NONE_MARGINS = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0)


def none_score(top1, margin, none_margin: float):
    """The score the none test compares with the floor: top-1 + none_margin · margin (arrays or floats)."""
    return top1 + none_margin * margin


def leave_gold_out(scores: np.ndarray, ids: np.ndarray, gold: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(top-1, margin) of each query with its gold tool removed from its candidates: scores/ids (Q, k) best
    first, gold (Q,). Needs k >= 3 for a margin after the removal."""
    keep = ids != np.asarray(gold)[:, None]
    out = np.array([s[m][:2] for s, m in zip(scores, keep)])
    return out[:, 0], out[:, 0] - out[:, 1]


def pick_abstention(top1_pos, margin_pos, top1_neg, margin_neg, recall: float = 0.98,
                    grid=NONE_MARGINS) -> tuple[float, float]:
    """(none_margin, floor) that keeps `recall` of the positives above the floor (pick_floor on their none
    score) and sends the most negatives below it; ties go to the smaller weight. Positives: (Q,) top-1 and
    margin of relevant queries; negatives: the same of no-tool queries (e.g. leave_gold_out)."""
    best, best_rej = (0.0, pick_floor(np.asarray(top1_pos), recall)), -1.0
    for w in grid:
        floor = pick_floor(none_score(np.asarray(top1_pos), np.asarray(margin_pos), w), recall)
        rej = float(np.mean(none_score(np.asarray(top1_neg), np.asarray(margin_neg), w) < floor))
        if rej > best_rej + 1e-12:
            best, best_rej = (float(w), floor), rej
    return best


def gate_stats(margins: np.ndarray, correct: np.ndarray, tau: float) -> dict:
    """auto_rate and auto_precision of a tau on (Q,) margins / correctness."""
    auto = np.asarray(margins) > tau
    n = int(auto.sum())
    return {"auto_rate": n / max(1, len(auto)),
            "auto_precision": float(np.asarray(correct)[auto].mean()) if n else float("nan")}


LEX_WEIGHTS = (0.0, 0.02, 0.04, 0.06, 0.08, 0.10, 0.125, 0.15, 0.20, 0.25, 0.30, 0.40)
CE_WEIGHTS = (0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def fused_scores(cos: np.ndarray, lex: np.ndarray | None, logits: np.ndarray | None, lex_weight: float,
                 ce_weight: float) -> np.ndarray:
    """cos + lex_weight * lex / max(lex over the candidates) + ce_weight * logits, over the last axis."""
    from slb.lexical import normalized

    out = np.asarray(cos, np.float64).copy()
    if lex is not None and lex_weight:
        out += lex_weight * normalized(lex)
    if logits is not None and ce_weight:
        out += ce_weight * np.asarray(logits, np.float64)
    return out


def pick_fusion_weights(cos: np.ndarray, lex: np.ndarray, logits: np.ndarray | None, gold: np.ndarray,
                        lex_grid=LEX_WEIGHTS, ce_grid=CE_WEIGHTS) -> tuple[float, float]:
    """(lex_weight, ce_weight) maximizing top-1 accuracy of argmax(fused_scores) over the candidates.

    cos, lex, logits: (Q, k) scan cosines, raw BM25 and cross-encoder logits of each query's k candidates
    (logits None: no cross-encoder, ce_weight 0); gold: (Q,) index of the gold tool among them, −1 when it is
    not a candidate. Ties go to the simplest: ce_weight 0 first, then the smallest weights.
    """
    cos, lex, gold = np.asarray(cos, np.float64), np.asarray(lex, np.float64), np.asarray(gold)
    if cos.shape != lex.shape or len(gold) != len(cos) or (logits is not None and np.shape(logits) != cos.shape):
        raise ValueError("cos, lex (and logits) must be (Q, k) and gold (Q,)")
    best, best_acc = (0.0, 0.0), -1.0
    for c in (ce_grid if logits is not None else (0.0,)):
        for w in lex_grid:
            acc = float(np.mean(np.argmax(fused_scores(cos, lex, logits, w, c), axis=1) == gold)) if len(gold) else 0.0
            if acc > best_acc + 1e-12:
                best, best_acc = (float(w), float(c)), acc
    return best
