"""`streaming`: attention sinks plus the most recent blocks (Xiao et al., 2023, StreamingLLM)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nexus_agent.eviction.policy import Observation, Policy


@dataclass
class StreamingPolicy(Policy):
    """Score = position, so top-k keeps the newest blocks; the sinks are protected by the base. Positional:
    reads neither keys nor queries (`needs` is empty), so it also runs on llama.cpp."""

    name = "streaming"
    needs = frozenset()

    def score(self, obs: Observation) -> np.ndarray:
        return np.broadcast_to(obs.positions.astype(np.float64) + 1.0, obs.keys.shape[:2]).copy()  # (Hkv, N)
