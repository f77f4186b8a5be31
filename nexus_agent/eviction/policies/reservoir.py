"""`reservoir`: Nexus Sampling — walk scoring plus an n-averaged weighted reservoir over blocks
(papers/nexus-sampling-reservoir-eviction.txt; DESIGN §7)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp

from nexus_agent.eviction.policy import Observation, Policy, expand, pool


@dataclass
class ReservoirPolicy(Policy):
    """score(): a = mean window attention (row-normalized, head-averaged over the group); walk C over the last
    `walk_rows` window rows with γ = 1 + ⟨a_q, C⟩, C ← C + γ a_q; s = a + λ C/‖C‖₁, (Hkv, N). The walk runs on
    token rows and the base sums tokens into blocks (the paper walks block rows; same ordering up to γ scale).
    select(): w_j = s_j + ε j/(nb−1); log π_j = logsumexp_i(log u_j⁽ⁱ⁾ / w_j) − log n over n uniforms; keep the
    top-K blocks by log π. n=None is n→∞ (deterministic top-K by w); n=1 is Efraimidis–Spirakis sampling.
    The forced set is the first block plus the recent window (`sinks`; DESIGN §7).

    persistent=True (the runtime cache): a block's n uniforms are drawn once, when its tokens enter the cache,
    and reused at every later eviction with that eviction's weights, as in a classical A-Res reservoir whose
    keys persist. Each eviction is still an exact n-averaged weighted sample given its weights (the uniforms
    are fresh to it in distribution), but the draws are coupled across evictions: for fixed weights a block
    survives E events with probability >= the product of its per-event inclusion probabilities (Harris: each
    event increases in the block's own uniforms and decreases in the others'), instead of exactly that
    product. persistent=False redraws at every eviction
    (the independent draws of the paper's Lemma 4.1): survival then decays geometrically, like a soft recency
    window (needle survival, budget 192: see evals/eviction.py)."""

    name = "reservoir"  # offset stays False: the reservoir keys are a sample, not an estimator
    n: int | None = 5
    lam: float = 0.5
    walk_rows: int = 3
    eps: float = 1e-6
    persistent: bool = True

    @property
    def slot_draws(self) -> int:  # type: ignore[override]
        return self.n if self.persistent and self.n is not None else 0

    def sinks(self, sinks: int, block: int) -> int:
        return max(sinks, block)

    def __post_init__(self):
        if self.n is not None and self.n < 1:
            raise ValueError(f"n must be >= 1 or None (n -> infinity), got {self.n}")
        if self.lam < 0 or self.walk_rows < 1:
            raise ValueError(f"need lam >= 0 and walk_rows >= 1, got {self.lam}, {self.walk_rows}")

    def score(self, obs: Observation) -> np.ndarray:
        att = obs.attention()  # (H, W, N)
        rows = obs.head_mean(att)  # (Hkv, W, N)
        a = rows.mean(1)
        c = np.zeros_like(a)
        for q in range(max(0, rows.shape[1] - self.walk_rows), rows.shape[1]):
            gamma = 1.0 + (rows[:, q] * c).sum(-1, keepdims=True)
            c = c + gamma * rows[:, q]
        return a + self.lam * c / (c.sum(-1, keepdims=True) + 1e-30)

    def select(self, scores, protected, k_blocks, ids, rng, u: np.ndarray | None = None):
        """u: (n, R, nb) uniforms of the blocks (persistent draws); None draws fresh ones from `rng`."""
        bs = pool(scores, ids)  # (R, nb)
        r, nb = bs.shape
        w = bs + self.eps * np.arange(nb) / max(nb - 1, 1)
        w = np.maximum(w, 1e-30)
        if self.n is None:
            key = np.log(w)
        else:
            u = rng.random((self.n, r, nb)) if u is None else u
            key = logsumexp(np.log(u) / w[None], axis=0) - np.log(self.n)
        keep_b = np.zeros((r, nb), dtype=bool)
        k = min(k_blocks, nb)
        if k > 0:
            np.put_along_axis(keep_b, np.argpartition(-key, k - 1, axis=1)[:, :k], True, axis=1)
        keep = expand(keep_b, ids, True)
        return keep, np.ones(keep.shape, dtype=np.float64)
