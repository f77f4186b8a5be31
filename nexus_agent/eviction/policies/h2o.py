"""`h2o`: heavy hitters by accumulated attention (Zhang et al., 2023, H2O)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nexus_agent.eviction.policy import Observation, Policy


@dataclass
class H2OPolicy(Policy):
    """Score = attention each key received from every query so far, summed, averaged over the KV group's
    query heads, (Hkv, N). Falls back to the buffered window when no history was accumulated."""

    name = "h2o"
    needs = frozenset({"keys", "queries", "history"})

    def score(self, obs: Observation) -> np.ndarray:
        if obs.h2o is not None:
            return obs.h2o.astype(np.float64)
        return obs.head_mean(obs.attention().sum(1))
