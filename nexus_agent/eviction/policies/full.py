"""`full`: no eviction (the reference every other policy is measured against)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nexus_agent.eviction.policy import Policy


@dataclass
class FullPolicy(Policy):
    """Keeps every token: its `capacity` is unbounded, so the session never evicts; reads nothing, so it also
    runs on llama.cpp."""

    name = "full"
    needs = frozenset()

    def capacity(self, budget: int) -> float:
        return math.inf

    def select(self, scores, protected, k_blocks, ids, rng):
        """Keep every slot: keep (R, N) all True, π = 1."""
        return np.ones(scores.shape, dtype=bool), np.ones(scores.shape, dtype=np.float64)

    def score(self, obs):
        return np.ones(obs.keys.shape[:2], dtype=np.float64)
