"""`snapkv`: attention of the last W queries, average-pooled (Li et al., 2024, SnapKV)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nexus_agent.eviction.policy import Observation, Policy


@dataclass
class SnapKVPolicy(Policy):
    """Score = mean attention from the buffered window queries, averaged over the group's query heads and
    smoothed by a 1-D average pool of width `kernel` along the keys, (Hkv, N)."""

    name = "snapkv"
    kernel: int = 5

    def __post_init__(self):
        if self.kernel < 1 or self.kernel % 2 == 0:
            raise ValueError(f"kernel must be a positive odd number, got {self.kernel}")

    def score(self, obs: Observation) -> np.ndarray:
        a = obs.head_mean(obs.attention().mean(1))  # (Hkv, N)
        pad = self.kernel // 2
        padded = np.pad(a, ((0, 0), (pad, pad)), mode="edge")
        c = np.cumsum(np.pad(padded, ((0, 0), (1, 0))), axis=1)
        return (c[:, self.kernel :] - c[:, : -self.kernel]) / self.kernel
