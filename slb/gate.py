"""The margin gate and the score floor, and how they are calibrated on labelled queries.

auto: top-1 cosine >= floor and (top-1 − top-2) > tau; none: top-1 cosine < floor; otherwise rerank.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass
class GateConfig:
    """tau: margin (cosine units) above which the top-1 is taken without reranking; floor: top-1 cosine
    below which the router answers "none"; k: candidates handed to the reranker."""

    tau: float = 0.10
    floor: float = 0.20
    k: int = 10
    rerank_weight: float = 5.0  # reranked order: logit + rerank_weight * cosine (fitted by pick_rerank_weight)

    def __post_init__(self) -> None:
        if not -1.0 <= self.floor <= 1.0:
            raise ValueError(f"floor is a cosine in [-1, 1], got {self.floor}")
        if not 0.0 <= self.tau <= 2.0:
            raise ValueError(f"tau is a cosine margin in [0, 2], got {self.tau}")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.rerank_weight < 0:
            raise ValueError(f"rerank_weight must be >= 0, got {self.rerank_weight}")

    def as_dict(self) -> dict:
        return asdict(self)


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


def gate_stats(margins: np.ndarray, correct: np.ndarray, tau: float) -> dict:
    """auto_rate and auto_precision of a tau on (Q,) margins / correctness."""
    auto = np.asarray(margins) > tau
    n = int(auto.sum())
    return {"auto_rate": n / max(1, len(auto)), "auto_precision": float(np.asarray(correct)[auto].mean()) if n else float("nan")}


RERANK_WEIGHTS = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0)


def pick_rerank_weight(cos: np.ndarray, logits: np.ndarray, gold: np.ndarray, grid=RERANK_WEIGHTS) -> float:
    """Weight w maximizing top-1 accuracy of argmax(logit + w * cosine) over the candidates.

    cos, logits: (Q, k) scan cosines and reranker logits of each query's k candidates; gold: (Q,) index of
    the gold tool among them, −1 when it is not a candidate. Ties go to the smallest w (trust the reranker).
    """
    cos, logits, gold = np.asarray(cos), np.asarray(logits), np.asarray(gold)
    if cos.shape != logits.shape or len(gold) != len(cos):
        raise ValueError("cos and logits must be (Q, k) and gold (Q,)")
    acc = [float(np.mean(np.argmax(logits + w * cos, axis=1) == gold)) for w in grid]
    return float(grid[int(np.argmax(acc))])
