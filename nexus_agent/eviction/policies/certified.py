"""`certified`: certainty layer plus a sampled tail with stored inclusion probabilities and the Hájek log(1/π)
logit offset (papers/error-certificates-randomized-eviction.txt; DESIGN §7)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nexus_agent.eviction.policy import Observation, Policy, expand, pool

MODES = ("systematic", "poisson", "topk")


def inclusion_probabilities(s: np.ndarray, m: float, eps: float = 1e-6) -> np.ndarray:
    """π = min(1, max(ε, c s)) for one row of block scores s (nb,) with c found by bisection so Σπ = m."""
    if m >= len(s):
        return np.ones(len(s))
    s = np.maximum(s, 0.0)
    f = lambda c: np.minimum(1.0, np.maximum(eps, c * s)).sum()  # noqa: E731
    lo, hi = 0.0, 1.0
    while f(hi) < m:
        hi *= 2.0
        if hi > 1e300:
            break
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) < m else (lo, mid)
    return np.minimum(1.0, np.maximum(eps, hi * s))


def systematic_sample(pi: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Systematic πps sampling (Madow): unit j owns [Π_{j−1}, Π_j) of the running sum Π of π in the given order;
    one uniform start u keeps the units hit by u, u+1, u+2, … Each unit is kept with probability exactly π_j
    (π_j ≤ 1), π = 1 units always, and the sample size is Σπ rounded down or up, never more."""
    cum = np.cumsum(pi)
    keep = np.zeros(len(pi), dtype=bool)
    if not len(pi):
        return keep
    hits = np.searchsorted(cum, rng.random() + np.arange(int(np.ceil(cum[-1]))), side="right")
    keep[hits[hits < len(pi)]] = True
    return keep


@dataclass
class CertifiedPolicy(Policy):
    """score(): mean attention of the buffered window, averaged over the group's query heads, (Hkv, N).
    select(): per row, π over tail blocks from `inclusion_probabilities` with Σπ = K (π = 1: the certainty
    layer), then keep blocks with those π. Returns keep (R, N) and π (R, N); the cache multiplies π across
    evictions and adds log(1/π) to kept keys when `offset` is on (`hajek.py`; mode="topk" returns π = 1: no offset).

    mode="systematic" (default): one systematic πps draw over the blocks in cache (position) order. It keeps
    exactly K blocks where independent keeps vary by ±√K, and spreads them over the trace (one per unit of
    running π), which stratifies by position (its error against "poisson" and "topk": `evals/eviction.py`).
    mode="poisson": each block kept independently (DESIGN §7's literal design).
    Ablations: mode="topk" keeps the top-K blocks of the same scores; offset=False drops the Hájek offset."""

    name = "certified"
    mode: str = "systematic"
    offset: bool = True
    eps: float = 1e-6

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")

    def score(self, obs: Observation) -> np.ndarray:
        return obs.head_mean(obs.attention().mean(1))

    def select(self, scores, protected, k_blocks, ids, rng):
        if self.mode == "topk":
            return super().select(scores, protected, k_blocks, ids, rng)
        bs = pool(scores, ids)  # (R, nb)
        pi_b = np.stack([inclusion_probabilities(row, k_blocks, self.eps) for row in bs]) if bs.size else bs
        if self.mode == "poisson":
            keep_b = rng.random(pi_b.shape) < pi_b
        else:
            keep_b = np.stack([systematic_sample(p, rng) for p in pi_b]) if bs.size else pi_b.astype(bool)
        return expand(keep_b, ids, True), expand(pi_b, ids, 1.0)
