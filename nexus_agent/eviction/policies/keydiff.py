"""`keydiff`: keep keys least similar to the mean key direction (Park et al., 2025, KeyDiff)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nexus_agent.eviction.policy import Observation, Policy


@dataclass
class KeyDiffPolicy(Policy):
    """Score = 1 − cos(k_i, mean of normalized keys) per KV head, (Hkv, N), in [0, 2]. Query-free."""

    name = "keydiff"
    needs = frozenset({"keys"})

    def score(self, obs: Observation) -> np.ndarray:
        k = obs.keys.astype(np.float64)
        kn = k / (np.linalg.norm(k, axis=-1, keepdims=True) + 1e-9)  # (Hkv, N, D)
        anchor = kn.mean(1, keepdims=True)
        anchor /= np.linalg.norm(anchor, axis=-1, keepdims=True) + 1e-9
        return 1.0 - (kn * anchor).sum(-1)
