"""`tova`: attention of the last query, averaged over all heads (Oren et al., 2024, TOVA)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nexus_agent.eviction.policy import Observation, Policy


@dataclass
class TOVAPolicy(Policy):
    """Score = last buffered query's attention averaged over every head of the layer, same for each KV head."""

    name = "tova"

    def score(self, obs: Observation) -> np.ndarray:
        last = obs.attention()[:, -1, :].mean(0)  # (N,)
        return np.broadcast_to(last, obs.keys.shape[:2]).astype(np.float64)
