"""`certified`: certainty layer plus a Poisson tail with stored inclusion probabilities and the Hájek
log(1/π) logit offset (papers/error-certificates-randomized-eviction.txt; DESIGN §7)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nexus_agent.eviction.policy import Observation, Policy, expand, pool


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


@dataclass
class CertifiedPolicy(Policy):
    """score(): mean attention of the buffered window, averaged over the group's query heads, (Hkv, N).
    select(): per row, π over tail blocks from `inclusion_probabilities` with Σπ = K; keep each block
    independently with probability π (π = 1: the certainty layer). Returns keep (R, N) and π (R, N); the cache
    multiplies π across evictions and adds log(1/π) to kept keys when `offset` is on.
    Ablations: mode="topk" keeps the top-K blocks of the same scores; offset=False drops the Hájek offset."""

    name = "certified"
    mode: str = "poisson"
    offset: bool = True
    eps: float = 1e-6

    def __post_init__(self):
        if self.mode not in ("poisson", "topk"):
            raise ValueError(f"mode must be 'poisson' or 'topk', got {self.mode!r}")

    @property
    def randomized(self) -> bool:  # type: ignore[override]
        return self.mode == "poisson" and self.offset

    def score(self, obs: Observation) -> np.ndarray:
        return obs.head_mean(obs.attention().mean(1))

    def select(self, scores, protected, k_blocks, ids, rng):
        if self.mode == "topk":
            return super().select(scores, protected, k_blocks, ids, rng)
        bs = pool(scores, ids)  # (R, nb)
        pi_b = np.stack([inclusion_probabilities(row, k_blocks, self.eps) for row in bs]) if bs.size else bs
        keep_b = rng.random(pi_b.shape) < pi_b
        return expand(keep_b, ids, True), expand(pi_b, ids, 1.0)
